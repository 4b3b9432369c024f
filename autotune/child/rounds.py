"""The measuring child with sequence-length buckets (`--seq-lens`): one input stream per bucket (of
its length, or cycling over lengths spread across its requests for a model that takes any length), one
model per length where the configuration compiles one shape (`ModelKnobs.one_shape`), and the rounds
that `timing` times (`buckets.Round`, a sweep over each bucket's lengths; its sample is the buckets'
weighted mean).

Each length is built as a child of its own length would build it (`per_length`), through the same
`build` and so the same `autotune.apply`: what a bucket measured is what `apply` serves for it.

A dynamic model (`shapes=dynamic`) is timed as a service that has run a while holds it (`fill`):
oneDNN keeps a primitive per shape it ran, and a process holding hundreds runs short requests slower
than one holding the few dozen the rounds alone make (benchmarks/RESULTS.md, "A service's primitive
cache").
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from autotune.model.buckets import Buckets, Mixed, Round, fit, spread

# Lengths a dynamic model serves once before it is timed, the shortest first: a BERT-base int8 model then
# holds 512 oneDNN primitives, and its short requests cost what they cost beside the 805-1540 of a
# service that has seen every length (with the few dozen of the rounds alone they read 5-6% faster).
FILL_LENGTHS = 128

# Set-up figures of the buckets' builds, combined into the trial's: times add up, the guard's worst counts.
WORST = {"max_rel_err": max, "top1_agreement": min, "min_cosine": min}


def buckets_of(args: argparse.Namespace) -> Buckets | None:
    return Buckets.parse(args.seq_lens, args.seq_len_weights) if args.seq_lens else None


def per_length(args: argparse.Namespace, found: Buckets | None, any_length: bool = False) -> list[argparse.Namespace]:
    """The child's arguments for each bucket: its token inputs that long (`lengths`: the bucket's own),
    or, for a model that takes any length (`any_length`: eager, shapes=dynamic), the lengths spread over
    the bucket's requests, from the token after the bucket below (`buckets.spread`): such a model runs
    each request at its own length, where a model per bucket pads it. Without buckets, the child's own
    arguments."""
    if found is None:
        return [args]
    floors = (0, *found.lengths[:-1])
    return [argparse.Namespace(**{**vars(args), "item_shape": str(length),
                                  "lengths": spread(floor + 1, length) if any_length else (length,)})
            for floor, length in zip(floors, found.lengths, strict=True)]


def rounds(streams: Sequence[Iterator[Any]], sweeps: Sequence[int] = ()) -> Iterator[Any]:
    """The batches timed: without buckets, the one stream's; with them, rounds of a sweep over each
    bucket's lengths (`sweeps[i]` batches of stream i, the lengths it cycles through, in order)."""
    if not sweeps:
        yield from streams[0]
        return
    while True:
        yield Round(tuple(tuple(next(stream) for _ in range(count))
                          for stream, count in zip(streams, sweeps, strict=True)))


Build = Callable[[argparse.Namespace, Any, dict[str, Any]], Callable[[Any], Any]]


def build_mixed(parts: list[argparse.Namespace], examples: list[Any], found: Buckets, one_shape: bool,
                setup: dict[str, Any], build: Build) -> Mixed:
    """The forward over the buckets. A configuration that compiles one shape: one build per length,
    each checked on its own example. One that takes any (eager; shapes=dynamic, checked at every
    length): built once, on the largest example, and called at every length."""
    if not one_shape:
        forward = build(parts[-1], examples[-1], setup)
        return Mixed([forward] * len(parts), found, parts[0].batch_size, [part.lengths for part in parts])
    forwards: list[Callable[[Any], Any]] = []
    each: dict[str, dict[str, Any]] = {}
    for part, example, length in zip(parts, examples, found.lengths, strict=True):
        each[str(length)] = {}
        forwards.append(build(part, example, each[str(length)]))
    setup.update(combined(list(each.values())), buckets=each)
    return Mixed(forwards, found, parts[0].batch_size, [part.lengths for part in parts])


def combined(setups: list[dict[str, Any]]) -> dict[str, Any]:
    """One set-up record for the buckets' builds: times summed, the guard's figures at their worst
    (`WORST`), a flag only when every bucket's holds, anything else as the largest bucket had it."""
    merged = dict(setups[-1])
    for key in {k for s in setups for k in s}:
        numbers = [s[key] for s in setups if isinstance(s.get(key), (int, float)) and not isinstance(s[key], bool)]
        flags = [s[key] for s in setups if isinstance(s.get(key), bool)]
        if flags:  # artifact_hit: every bucket's
            merged[key] = all(flags)
        elif key.endswith("_s") and numbers:
            merged[key] = sum(numbers)
        elif key in WORST and numbers:
            merged[key] = WORST[key](numbers)
    return merged


def fill(forward: Mixed, example: Any, longest: int, count: int = FILL_LENGTHS) -> dict[str, Any]:
    """Serve one batch at each of the `count` shortest lengths up to `longest` through a model that
    takes any length (`example`, the largest bucket's first batch, cut to each), as a service that has
    served requests of every length has: its per-shape caches (oneDNN's primitives) as full as a
    service's, so that the rounds time what a request costs there. The set-up record's figures.

    The worker fills a dynamic model only. Eager also takes any length, but its fill cost 13 s a
    process for BERT-base at batch 1 (4 s for the dynamic int8 model), it is the baseline every
    confirmation round measures, and an eager figure that reads fast only makes speedups smaller."""
    import time

    start = time.perf_counter()
    lengths = range(1, min(count, longest) + 1)
    for length in lengths:
        forward.forwards[-1](fit(example, length))
    return {"fill_lengths": len(lengths), "fill_s": time.perf_counter() - start}
