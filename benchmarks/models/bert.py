"""A BERT-base sequence classifier with random weights, for `--model benchmarks.models.bert:bert_base`.

Built from `transformers.BertConfig()` (12 layers, hidden 768, 2 labels) as a user's own model is:
a factory the child imports, with the weights from `torch.manual_seed(0)` that the loader sets, so
every process builds the same model. `forward(input_ids, attention_mask)` returns the logits tensor,
not a ModelOutput, so every backend and the output guard see one tensor.

Its inputs go in a file for `--example-inputs`, written by running this module:

    PYTHONPATH=. .venv/bin/python -m benchmarks.models.bert bert_inputs.pt   # 64 items of 128 tokens
    autotune bench --model benchmarks.models.bert:bert_base --example-inputs bert_inputs.pt
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

SEQUENCE_LENGTH = 128
# Enough items that int8's calibration (4 batches) and its guard (32 items) take different ones at batch 8.
ITEMS = 64
INPUTS_SEED = 0


class BertClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification

        self.bert = BertForSequenceClassification(BertConfig())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).logits  # type: ignore[no-any-return]


def bert_base() -> torch.nn.Module:
    return BertClassifier()


def example_inputs(items: int = ITEMS, length: int = SEQUENCE_LENGTH) -> dict[str, Any]:
    """Token ids drawn from the whole vocabulary and a full attention mask, items along dim 0."""
    from transformers import BertConfig

    generator = torch.Generator().manual_seed(INPUTS_SEED)
    ids = torch.randint(0, BertConfig().vocab_size, (items, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones(items, length, dtype=torch.long)}


def main() -> None:
    p = argparse.ArgumentParser(description="Write BERT's example inputs for --example-inputs.")
    p.add_argument("path", help="the torch.save file to write")
    p.add_argument("--items", type=int, default=ITEMS)
    p.add_argument("--length", type=int, default=SEQUENCE_LENGTH)
    args = p.parse_args()
    torch.save(example_inputs(args.items, args.length), args.path)


if __name__ == "__main__":
    main()
