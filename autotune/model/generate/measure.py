"""A text-generation request as the measuring child times it, and the guard on its tokens.

One sample is one request: the prefill over a batch of prompts and `new_tokens` decode steps. Its
latency is the request's (time to first token + the decode steps), its items the tokens generated
(batch x new tokens), so the child's throughput is generated tokens per second. Per request it
keeps the time to first token (TTFT) and the mean time per output token after it (TPOT).

The guard: the next-token logits at every position of held-out prompts (teacher-forced, one
prefill each) against PyTorch's fp32 eager ones, judged by their mean cosine similarity; the top-1
agreement and how many greedy tokens agree before the first difference are recorded beside it. The
top-1 answer does not judge: random weights give logits with small margins (the best token leads
the second by ~0.14 of the logits' spread on a random 0.5B qwen2), so torchao's int8 weights
flipped 13% of them where a trained model's would hold (bf16 4.5%, int8_dynamic 17%; mean cosine 0.9998, 0.9990,
0.9978). int4 weights (mean cosine 0.85 there) fail the default tolerance on random weights;
`--tolerance` accepts them, said as such.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from autotune.model.errors import WrongAnswers
from autotune.model.generate.base import Generator

GUARD_PROMPTS = 4  # held-out prompts the guard runs (their every position is compared)
# What --tolerance allows by default, per precision: how far below 1 the mean cosine similarity of
# the next-token logits with fp32 eager's may fall.
GUARD_TOLERANCE = {"fp32": 1e-3, "bf16": 1e-2, "int8_weight_only": 1e-2, "int8_dynamic": 1e-2,
                   "int4_weight_only": 1e-2}


class Generation:
    """The child's forward for `--task generate` (`timing.one_sample` times it with `timed`)."""

    def __init__(self, generator: Generator, new_tokens: int) -> None:
        self.generator, self.new_tokens = generator, new_tokens
        self.ttft_ms: list[float] = []
        self.tpot_ms: list[float] = []

    def __call__(self, batch: Any) -> Any:
        import torch

        return torch.stack(list(self.generator.stream(prompts_of(batch), self.new_tokens)), dim=1)

    def timed(self, batch: Any) -> tuple[float, float]:
        """One request: its latency in ms and the tokens it generated; TTFT and TPOT kept."""
        prompts = prompts_of(batch)
        start = time.perf_counter()
        first = start
        for step, _ in enumerate(self.generator.stream(prompts, self.new_tokens)):
            if step == 0:
                first = time.perf_counter()
        end = time.perf_counter()
        self.ttft_ms.append((first - start) * 1e3)
        if self.new_tokens > 1:
            self.tpot_ms.append((end - first) * 1e3 / (self.new_tokens - 1))
        return (end - start) * 1e3, float(prompts.shape[0] * self.new_tokens)

    def reset(self) -> None:
        self.ttft_ms, self.tpot_ms = [], []

    def summary(self) -> dict[str, Any]:
        """Medians over the requests since the last `reset`, and the p90 time per output token
        (what `--max-tpot-ms` bounds)."""
        tpot = statistics.median(self.tpot_ms) if self.tpot_ms else None
        return {"requests": len(self.ttft_ms), "new_tokens": self.new_tokens,
                "ttft_p50_ms": statistics.median(self.ttft_ms) if self.ttft_ms else None,
                "tpot_p50_ms": tpot, "tpot_p90_ms": p90(self.tpot_ms),
                "decode_tokens_per_s": 1e3 / tpot if tpot else None}


def p90(values: list[float]) -> float | None:
    """The 90th percentile, linearly interpolated (as the harness's `stats.percentile`)."""
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def prompts_of(batch: Any) -> Any:
    """The token ids of a batch of prompts (the child's batches are dicts of token tensors)."""
    return batch["input_ids"] if isinstance(batch, dict) else batch


def logits_of(generator: Generator, prompts: Any) -> Any:
    """The generator's next-token logits for each prompt, one request each (a peer takes one sequence at a time)."""
    import torch

    return torch.cat([generator.logits(prompts[row:row + 1]) for row in range(prompts.shape[0])])


def agreeing_prefix(reference: Any, output: Any) -> list[int]:
    """Per sequence, the greedy tokens that agree before the first difference."""
    found = []
    for ref_row, out_row in zip(reference.tolist(), output.tolist(), strict=True):
        same = 0
        while same < len(ref_row) and ref_row[same] == out_row[same]:
            same += 1
        found.append(same)
    return found


def logits_agreement(reference: Any, output: Any) -> dict[str, float]:
    """Mean and least cosine similarity, and top-1 agreement, of next-token logits [batch, positions, vocab]."""
    import torch

    ref, out = reference.float(), output.float()
    if ref.shape != out.shape:
        raise WrongAnswers(f"wrong answers: logits of shape {tuple(out.shape)} instead of fp32 eager's "
                           f"{tuple(ref.shape)}")
    cosine = torch.nn.functional.cosine_similarity(ref, out, dim=-1)
    return {"mean_cosine": float(cosine.mean()), "min_cosine": float(cosine.min()),
            "top1_agreement": float((ref.argmax(-1) == out.argmax(-1)).float().mean()),
            "guard_positions": cosine.numel()}


def judge(figures: dict[str, Any], what: str, precision: str, tolerance: float | None, setup: dict[str, Any]) -> None:
    """Fail unless the mean cosine similarity is at least 1 - tolerance; the figures go to `setup`."""
    allowed = GUARD_TOLERANCE.get(precision, GUARD_TOLERANCE["fp32"]) if tolerance is None else tolerance
    setup.update(figures, tolerance=allowed)
    if figures["mean_cosine"] < 1 - allowed:
        raise WrongAnswers(f"wrong answers: {what}'s next-token logits have a mean cosine similarity of "
                           f"{figures['mean_cosine']:.4f} with fp32 eager's over {figures['guard_positions']} "
                           f"positions (top-1 agreement {figures['top1_agreement']:.1%}); the tolerance "
                           f"{allowed:g} asks for {1 - allowed:.4f}; raise --tolerance to accept it")
