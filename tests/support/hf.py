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


TINY_LLAMA = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
              "intermediate_size": 128, "max_position_embeddings": 256}
LICENCE = Path("/usr/share/common-licenses/GPL-3")  # a real English text Debian ships


def save_tiny_llama_with_tokenizer(folder: Path, text: str, vocab: int = 300, train_steps: int = 0) -> Path:
    """A causal LM with a tokenizer of its own (a byte-level BPE learnt from `text`, `vocab` tokens),
    saved as a user's model would be; `train_steps` of next-token training on `text` make its
    perplexity mean something (0: random weights)."""
    import tokenizers
    import torch
    import transformers

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    bpe.train_from_iterator([text], tokenizers.trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                                                   special_tokens=["<eos>"]))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**TINY_LLAMA, vocab_size=bpe.get_vocab_size(), eos_token_id=0,
                                      bos_token_id=0, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config)
    if train_steps:
        ids = torch.tensor(tokenizer(text)["input_ids"])
        optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for step in range(train_steps):
            start = (step * 97) % max(len(ids) - 129, 1)
            batch = ids[start:start + 128][None]
            loss = model(input_ids=batch, labels=batch).loss
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
