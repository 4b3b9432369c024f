"""Tiny GGUF files for the `--model FILE.gguf` tests: a random llama of 2 layers saved with
save_pretrained, written as an F32 GGUF by autotune's own writer (`autotune.model.generate.llamacpp_convert`,
which transformers' GGUF loader reads back exactly), with a byte-level vocabulary of its own (the
writer leaves the vocabulary out: llama.cpp gets token ids), in a few seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

TINY_LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 256, "tie_word_embeddings": True}
MERGES = ("Ġ t", "h e")  # two merges beyond the 256 bytes: a real BPE, if a small one


def write_tiny_gguf(path: Path, work: Path, vocabulary: bool = True, seed: int = 0) -> Path:
    """A tiny random llama as the GGUF file `path` (its save_pretrained folder made in `work`); with
    `vocabulary`, GPT-2's byte-level tokens and MERGES, as a GGUF with a tokenizer has them."""
    import torch
    import transformers

    from autotune.model.generate import llamacpp_convert as llamacpp

    tokens = tiny_vocabulary()
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=len(tokens), **TINY_LLAMA)
    folder = work / f"{path.stem}-saved"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    if not vocabulary:
        llamacpp.write_f32_gguf(folder, llamacpp.read_config(folder), path)
        return path
    written = llamacpp.write_metadata

    def with_vocabulary(writer: Any, described: dict[str, Any], gguf: Any) -> None:
        written(_Vocabulary(writer), described, gguf)
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(tokens)
        writer.add_token_types([1] * len(tokens))  # NORMAL
        writer.add_token_merges(list(MERGES))
        writer.add_eos_token_id(0)

    with mock.patch.object(llamacpp, "write_metadata", with_vocabulary):
        llamacpp.write_f32_gguf(folder, llamacpp.read_config(folder), path)
    return path


def tiny_vocabulary() -> list[str]:
    """The 256 bytes as GPT-2 spells them, then one token per merge."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelled = bytes_to_unicode()
    return [spelled[byte] for byte in range(256)] + [merge.replace(" ", "") for merge in MERGES]


class _Vocabulary:
    """The writer as `write_metadata` sees it, minus its placeholder ("no_vocab") tokenizer."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)

    def add_tokenizer_model(self, _model: str) -> None:
        pass
