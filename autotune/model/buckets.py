"""Sequence-length buckets: one compiled model per length, and the requests of any length served by
the smallest bucket that holds them.

A compiled model (an AOTInductor package, a trace, an OpenVINO or ONNX Runtime graph made for the
example's shape) takes one shape. A text service's requests vary in length, so a search with
`--seq-lens 32,128,384` measures every configuration at each length and `apply` builds one model per
length: an incoming batch is padded to the smallest bucket that fits (token ids, attention mask and
token type ids with zeros: the mask's zeros keep the padding out of attention) and the outputs that
run along the sequence are cut back to the real tokens. With `shapes=dynamic` (backend=inductor) one
AOTInductor model is exported with a dynamic sequence dimension up to the largest bucket instead,
and each batch runs at its own length, unpadded (`Ranged`).

The inputs of a text model are its token tensors: 2-D integer tensors [batch, sequence]. torch is
imported inside functions.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.model.batches import is_tokens, split
from autotune.model.envfile import SEQ_LENS_VAR
from autotune.model.errors import ApplyError


class BucketError(ValueError):
    """Lengths or weights that are not a bucket list; the message says what to give instead."""


@dataclass(frozen=True)
class Buckets:
    """Sequence lengths, increasing, and the share of requests each one stands for (summing to 1)."""

    lengths: tuple[int, ...]
    weights: tuple[float, ...]

    @classmethod
    def parse(cls, lengths: str, weights: str = "") -> Buckets:
        """`32,128,384` and, optionally, `1,2,1` (relative weights; default: equal)."""
        found = _numbers(lengths, "--seq-lens", int)
        if any(n < 1 for n in found):
            raise BucketError(f"--seq-lens {lengths!r}: every length must be 1 or more")
        if any(b <= a for a, b in itertools.pairwise(found)):
            raise BucketError(f"--seq-lens {lengths!r} is not increasing; give each length once, smallest first, "
                              f"like 32,128,384")
        shares = _numbers(weights, "--seq-len-weights", float) if weights.strip() else (1.0,) * len(found)
        if len(shares) != len(found):
            raise BucketError(f"--seq-len-weights gives {len(shares)} weights for {len(found)} lengths; give one "
                              f"per length of --seq-lens")
        if not all(w >= 0 and w < float("inf") for w in shares) or not sum(shares) > 0:
            raise BucketError(f"--seq-len-weights {weights!r}: weights must be finite, 0 or more, and not all 0")
        return cls(tuple(int(n) for n in found), tuple(w / sum(shares) for w in shares))

    def text(self) -> str:
        return ",".join(map(str, self.lengths))

    def weights_text(self) -> str:
        return ",".join(f"{w:.6g}" for w in self.weights)

    def fitting(self, length: int) -> int:
        """The smallest bucket that holds `length` tokens, or why none does."""
        for bucket in self.lengths:
            if length <= bucket:
                return bucket
        raise ApplyError(f"an input of {length} tokens is longer than the largest bucket ({self.lengths[-1]}); "
                         f"truncate it to {self.lengths[-1]} tokens or search again with a larger length in "
                         f"--seq-lens")


def _numbers(text: str, flag: str, kind: type[int] | type[float]) -> tuple[Any, ...]:
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    try:
        values = tuple(kind(p) for p in parts)
    except ValueError:
        values = ()
    if not values:
        what = "lengths like 32,128,384" if kind is int else "numbers like 1,2,1"
        raise BucketError(f"{flag} {text!r} is not a list of {what}")
    return values


def lengths_from_env(env: Mapping[str, str], source: str) -> tuple[int, ...]:
    """The buckets an environment names (`SEQ_LENS_VAR`); () when it names none."""
    text = env.get(SEQ_LENS_VAR, "").strip()
    if not text:
        return ()
    try:
        return Buckets.parse(text).lengths
    except BucketError:
        raise ApplyError(f"{SEQ_LENS_VAR}={text!r} in {source} is not an increasing list of lengths; export the "
                         f"env file again") from None


def _tokens(batch: Any) -> list[Any]:
    """The token tensors of a batch: its 2-D integer tensors."""
    from torch.utils import _pytree

    return [t for t in _pytree.tree_leaves(batch) if is_tokens(t)]


def sequence_length(batch: Any) -> int:
    """How many tokens a batch holds: dim 1 of its token tensors, which must agree."""
    lengths = {int(t.shape[1]) for t in _tokens(batch)}
    if not lengths:
        raise ApplyError("sequence-length buckets need token inputs (2-D integer tensors [batch, sequence], such as "
                         "input_ids and attention_mask); this batch has none")
    if len(lengths) > 1:
        raise ApplyError(f"the token inputs of this batch have different lengths {sorted(lengths)}; give every "
                         f"token tensor the same length")
    return lengths.pop()


def fit(batch: Any, length: int) -> Any:
    """The batch with every token tensor padded with zeros (or cut) to `length` tokens; the other
    inputs as they are."""
    import torch
    from torch.utils import _pytree

    def resize(x: Any) -> Any:
        if not is_tokens(x) or x.shape[1] == length:
            return x
        if x.shape[1] > length:
            return x[:, :length].contiguous()
        return torch.nn.functional.pad(x, (0, length - x.shape[1]), value=0)

    return _pytree.tree_map(resize, batch)


def trim(output: Any, bucket: int, length: int) -> Any:
    """The output for the real tokens: tensors running along the sequence ([batch, bucket, ...],
    such as a last hidden state) cut to `length`; the others (a classifier's logits) as they are."""
    import torch
    from torch.utils import _pytree

    if length == bucket:
        return output

    def cut(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() >= 3 and x.shape[1] == bucket:
            return x[:, :length]
        return x

    return _pytree.tree_map(cut, output)


SPREAD = 4  # lengths a bucket's requests are timed at, for a model that takes any length


def spread(shortest: int, longest: int, count: int = SPREAD) -> tuple[int, ...]:
    """The lengths that stand for a bucket's requests (`shortest`..`longest` tokens, taken as spread
    evenly) for a model that takes any length (eager, shapes=dynamic): the middles of `count` equal
    parts of the range, so that their mean cost is the bucket's mean request cost by the midpoint rule
    (exact for a cost linear in the length, close for a smooth one). A model per bucket pads every
    request to `longest`, so it is timed there alone."""
    if shortest >= longest:
        return (longest,)
    span = longest - shortest + 1
    return tuple(dict.fromkeys(shortest + (2 * k + 1) * span // (2 * count) for k in range(count)))


def dynamic_shapes(example: Any, variadic: bool = False) -> Any:
    """torch.export's `dynamic_shapes` for `example` (as `batches.split` gives it to export): dim 1 of
    every token tensor is one dimension, from 1 token to the example's length; the rest is static.
    Keyword inputs are named; positional ones go in order, or, for a module whose forward takes
    `*args` (`variadic`), as that one argument."""
    import torch
    from torch.utils import _pytree

    tokens = torch.export.Dim("tokens", min=1, max=sequence_length(example))
    args, kwargs = split(example)
    spec = _pytree.tree_map(lambda x: {1: tokens} if is_tokens(x) else None, kwargs if kwargs else args)
    return spec if kwargs or not variadic else {"args": spec}


class Ranged:
    """The forward `apply` returns for `shapes=dynamic`: one model for every length up to the
    largest bucket, each batch run at its own length (the compiled model's `ShapeChecked` refuses a
    longer one, as `Bucketed` does); `buckets` says which bucket a length falls in."""

    def __init__(self, forward: Callable[[Any], Any], lengths: Sequence[int]) -> None:
        self.forward = forward
        self.buckets = Buckets(tuple(lengths), (1.0 / len(lengths),) * len(lengths))

    def __call__(self, batch: Any) -> Any:
        return self.forward(batch)


class Bucketed:
    """The forward `apply` returns for buckets: each batch padded to the smallest bucket that holds
    it, run by that bucket's model, its outputs cut back to the real tokens."""

    def __init__(self, forwards: Mapping[int, Callable[[Any], Any]]) -> None:
        self.forwards = dict(forwards)
        self.buckets = Buckets(tuple(sorted(forwards)), (1.0 / len(forwards),) * len(forwards))

    def __call__(self, batch: Any) -> Any:
        length = sequence_length(batch)
        bucket = self.buckets.fitting(length)
        return trim(self.forwards[bucket](fit(batch, bucket)), bucket, length)


@dataclass(frozen=True)
class Round:
    """What the measuring child times as one sample with buckets: per bucket, in order, a sweep: one
    batch at each length that stands for the bucket (`spread`; one, the bucket's own, for a model per
    bucket)."""

    sweeps: tuple[tuple[Any, ...], ...]


class Mixed:
    """The measuring child's forward over buckets: a round runs each bucket's sweep through that
    bucket's model, the buckets interleaved. A bucket's time in the round is the mean of its sweep's
    calls (what a request of the bucket costs on average); the round's sample is the weighted mean
    over the buckets, the mean latency of a request stream with the buckets' shares, and it counts as
    many items as that stream serves in the round's wall time (so items over time is that stream's
    throughput)."""

    def __init__(self, forwards: Sequence[Callable[[Any], Any]], buckets: Buckets, batch_size: int,
                 spreads: Sequence[tuple[int, ...]] = ()) -> None:
        """`spreads`: the lengths each bucket's sweep holds (for its record; default: the bucket's own)."""
        self.forwards, self.buckets, self.batch_size = list(forwards), buckets, batch_size
        self.spreads = list(spreads) or [(length,) for length in buckets.lengths]
        self.sweep = max(len(spread) for spread in self.spreads)  # calls of a bucket's model in a round
        self.times_ms: list[list[float]] = [[] for _ in forwards]
        self.spent_ms = 0.0  # the last round's calls, all of them

    def __call__(self, batch: Round) -> list[list[Any]]:
        """The round's calls, the buckets interleaved (the first length of each bucket, then the second
        of each, ...) as a stream mixes them, rather than one bucket's requests back to back."""
        outputs: list[list[Any]] = [[] for _ in batch.sweeps]
        spent: list[list[float]] = [[] for _ in batch.sweeps]
        for position in range(max(len(sweep) for sweep in batch.sweeps)):
            for index, sweep in enumerate(batch.sweeps):
                if position < len(sweep):
                    start = time.perf_counter()
                    outputs[index].append(self.forwards[index](sweep[position]))
                    spent[index].append((time.perf_counter() - start) * 1e3)
        for index, times in enumerate(spent):
            self.times_ms[index].append(sum(times) / len(times))
        self.spent_ms = sum(sum(times) for times in spent)
        return outputs

    def reset(self) -> None:
        self.times_ms = [[] for _ in self.forwards]

    def timed(self, batch: Round) -> tuple[float, float]:
        """One round: its sample in ms (the weighted mean) and the items it counts."""
        self(batch)
        last = [times[-1] for times in self.times_ms]
        weighted = sum(w * t for w, t in zip(self.buckets.weights, last, strict=True))
        return weighted, self.batch_size * self.spent_ms / weighted if weighted > 0 else 0.0

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per bucket, since the last `reset`: the median of its sweeps' mean call, how many sweeps, and the
        lengths a sweep holds."""
        import statistics

        return {str(length): {"latency_p50_ms": statistics.median(times) if times else 0.0, "sweeps": len(times),
                              "lengths": list(spread), "weight": weight}
                for length, spread, weight, times in zip(self.buckets.lengths, self.spreads, self.buckets.weights,
                                                         self.times_ms, strict=True)}
