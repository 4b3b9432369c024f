"""The timed part of a measurement: warmup, the samples inside the common window, and the checks
that give up early on a hopeless configuration (`--give-up-above-ms`).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, cast

from autotune.model.buckets import Mixed, Round
from autotune.model.generate.measure import Generation


def cpu_seconds() -> float:
    """CPU time of this process and its children so far (DataLoader workers included)."""
    import psutil

    me = psutil.Process()
    total = float(sum(me.cpu_times()[:2]))
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a worker that just exited
            total += sum(child.cpu_times()[:2])
    return total


def warm_up(args: argparse.Namespace, forward: Any, batches: Any) -> int:
    """Untimed iterations until both the count and the time are reached."""
    count = 0
    deadline = time.perf_counter() + args.warmup_time
    while count < args.warmup or time.perf_counter() < deadline:
        forward(next(batches))
        count += 1
    return count


@dataclass(frozen=True)
class Window:
    """The common measuring window, in CLOCK_MONOTONIC seconds."""

    start: float
    end: float


def timed_loop(args: argparse.Namespace, forward: Any, batches: Any, window: Window) -> dict[str, Any]:
    """Timed loop over the common window: forward latency per batch, and the items of every
    iteration over `span_s`, the time from the window's START (not this instance's own start,
    later when it heard `go` late) to its last iteration's end (past END by that iteration, or
    by the iterations `--min-iterations` asks for). The harness sums a run's instances by the same
    rule (measure/results.py, `RunResult.throughput_ips`)."""
    import torch

    latencies_ms: list[float] = []
    iterations_ms: list[float] = []
    items = 0.0
    if isinstance(forward, (Mixed, Generation)):
        forward.reset()  # its per-bucket or per-request figures: the timed ones only
    with torch.no_grad():
        cpu_before = cpu_seconds()  # before the wait: scanning /proc takes milliseconds, sleeping no CPU
        time.sleep(max(window.start - time.monotonic(), 0.0))
        start = time.monotonic()
        every_n, needed = samples(args.give_up_iterations, forward), samples(args.min_iterations, forward)
        checks = GiveUpChecks(start, args.give_up_after, every_n, args.give_up_above_ms)
        while time.monotonic() < window.end or len(latencies_ms) < needed:
            t_fetch = time.perf_counter()
            batch = next(batches)
            latency_ms, served = one_sample(forward, batch)
            iterations_ms.append((time.perf_counter() - t_fetch) * 1e3)
            latencies_ms.append(latency_ms)
            items += served
            if checks.stop(latencies_ms):
                break
        ended = time.monotonic()
        cpu_s = cpu_seconds() - cpu_before
    span = ended - window.start
    result = {"latencies_ms": latencies_ms, "iterations_ms": iterations_ms, "items": items,
              "window": {"start": window.start, "end": window.end}, "late_start_s": start - window.start,
              "window_s": ended - start, "span_s": span, "throughput_ips": items / span, "cpu_s": cpu_s}
    if isinstance(forward, Mixed):
        result["buckets"] = forward.summary()
    if isinstance(forward, Generation):
        result["generation"] = forward.summary()
    return result | checks.verdict()


def samples(calls: int, forward: Any) -> int:
    """Samples that hold `calls` calls of each model (`--min-iterations`, `--give-up-iterations`): a
    round over buckets whose sweeps hold several lengths (a model that takes any length) makes that
    many calls per bucket, and its sample is their mean."""
    per_sample = forward.sweep if isinstance(forward, Mixed) else 1
    return -(-calls // per_sample)


def one_sample(forward: Any, batch: Any) -> tuple[float, float]:
    """One timed call: its latency in ms and the items it served. A round over sequence-length
    buckets is timed by its `Mixed` forward (the weighted mean of its calls)."""
    if isinstance(batch, Round):
        return cast(Mixed, forward).timed(batch)
    if isinstance(forward, Generation):  # one request: prefill and decode, its tokens the items
        return forward.timed(batch)
    from autotune.model.batches import batch_size

    start = time.perf_counter()
    forward(batch)
    return (time.perf_counter() - start) * 1e3, float(batch_size(batch))


def limits(text: str) -> tuple[float, ...]:
    """`--give-up-above-ms`: positive milliseconds, comma-separated."""
    values = tuple(float(v) for v in text.split(",") if v.strip())
    if any(not v > 0 for v in values):  # NaN too
        raise argparse.ArgumentTypeError(f"not positive milliseconds: {text!r}")
    return values


class GiveUpChecks:
    """Step 3's early stop: the k-th check comes once k windows' time (`every_s` each) and samples
    (`every_n` each) are in, and stops the loop when the median of all samples so far is above the
    k-th limit. A window whose check passes just goes on into the next one."""

    def __init__(self, start: float, every_s: float, every_n: int, above_ms: tuple[float, ...]) -> None:
        self.start, self.every_s, self.every_n, self.above_ms = start, every_s, every_n, above_ms
        self.passed = 0  # checks passed so far
        self.gave_up = False

    def stop(self, latencies_ms: list[float]) -> bool:
        """After each sample: is this a check, and does it stop the loop?"""
        if self.passed >= len(self.above_ms):
            return False
        due = self.passed + 1
        if time.monotonic() < self.start + due * self.every_s or len(latencies_ms) < due * self.every_n:
            return False
        self.gave_up = statistics.median(latencies_ms) > self.above_ms[self.passed]
        self.passed += not self.gave_up
        return self.gave_up

    def verdict(self) -> dict[str, Any]:
        """For the result: the limit crossed and after how many windows, when one was."""
        if not self.gave_up:
            return {}
        return {"gave_up_above_ms": self.above_ms[self.passed], "gave_up_windows": self.passed + 1}
