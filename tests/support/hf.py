"""Tiny transformers models for the hf: tests: BERT of 2 layers, hidden size 64, saved with
save_pretrained as a user's fine-tuned model would be, in a second or so."""

from __future__ import annotations

from pathlib import Path

TINY_BERT = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128,
             "vocab_size": 1000, "max_position_embeddings": 512}


def save_tiny_bert(folder: Path, seed: int = 0) -> Path:
    """A sequence classifier (its head saved too) whose weights come from `seed`, in `folder`."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**TINY_BERT))
    model.save_pretrained(folder)
    return folder


def token_batch(length: int = 16, items: int = 2, seed: int = 0) -> dict[str, object]:
    """Token ids within the tiny vocabulary, a full attention mask, zero token types."""
    import torch

    ids = torch.randint(0, TINY_BERT["vocab_size"], (items, length), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
