"""Interleaved paired rounds: every contender once per round, each run a fresh process.

The order within rounds is random but balanced (blocks of a Williams design: each contender in
each position, and right after each other contender, equally often), seeded and recorded, so that
a slow spell, a warming machine or the contender that ran just before hits everyone alike.
`interleave` runs a fixed number of rounds as one series (`compare`); `until_decided` runs them round
by round up to each look of a sequential design and stops when the caller's verdict is made
(the confirmation). There a run flagged noisy (the search's own flags: other processes' CPU, the
child's CPU share, the spread of its samples; `replicates.noisy_reason`) is run again at the end
of its round, at most `CONFIRM_RERUNS` times: the round keeps its first quiet run, or when every
run was noisy the one with the median value, so that one disturbed process cannot decide a
comparison. Every run, kept or not, is recorded with its flag. Given the host's kept floor
(`floor.Kept`), each round is judged against the floor as it then stands, and every run no
disturbance touched teaches it its spread, as a search trial's windows do: the spread of a
confirmation's fresh processes is this host's too (a floor learned from search windows alone
flagged 7 of 32 quiet confirmation runs on the Xeon host, 7-9% against its 6.9%).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from autotune.base.thresholds import CONFIRM_RERUNS
from autotune.host.floor import Kept
from autotune.measure import stats
from autotune.measure.objectives import Metric, lower_is_better, metric_value
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import Measurement, SeriesRunner, noisy_reason, undisturbed_spreads
from autotune.measure.results import RunResult
from autotune.measure.sequential import Design, Look
from autotune.measure.stats import PairedComparison


@dataclass(frozen=True)
class Contender:
    """One series of runs. Contenders are told apart by their position, never by their label:
    a configuration compared with itself is two independent series."""

    label: str
    plan: LaunchPlan
    trial: int | None = None


@dataclass(frozen=True)
class RunEvent:
    round: int
    rounds: int
    contender: Contender
    result: RunResult
    noisy: str = ""  # why the run is flagged noisy ("" when it is not)
    attempt: int = 0  # 0: the round's run; 1, 2: a noisy run's reruns


@dataclass(frozen=True)
class RoundRun:
    """What one contender's run in a round gave: the metric, its p90 latency (and p90 time per
    output token), or why it failed, how long its processes took from start to exit, and, when a
    run was flagged noisy and run again, each attempt's flag ("" for a quiet one) and which
    attempt the round kept."""

    value: float | None
    p90_ms: float | None
    reason: str = ""
    wall_s: float | None = None
    buckets: Mapping[str, float] = field(default_factory=dict)  # per sequence-length bucket, its p50 ms
    flags: tuple[str, ...] = ()  # every attempt's noisy reason, in order (empty: not checked)
    kept: int = 0  # the attempt whose value the round keeps
    tpot_p90_ms: float | None = None  # --task generate: the p90 time per output token

    @property
    def reruns(self) -> int:
        return max(len(self.flags) - 1, 0)


@dataclass(frozen=True)
class Rounds:
    """Every contender's runs, round by round, and the order they ran in."""

    contenders: tuple[Contender, ...]
    runs: tuple[tuple[RoundRun, ...], ...]  # [contender][round]
    orders: tuple[tuple[int, ...], ...]  # [round]: contender positions in running order
    seed: int

    def values(self, position: int) -> list[float | None]:
        return [r.value for r in self.runs[position]]

    @property
    def count(self) -> int:
        return len(self.orders)


@dataclass(frozen=True)
class Stopped:
    """Where sequential rounds ended: the rounds, the look they were judged at, and why they
    stopped: "decided", "cap" (the design's last look) or "time" (the time limit, before a look)."""

    rounds: Rounds
    look: Look
    by: str
    wall_s: float


def new_seed() -> int:
    return random.SystemRandom().randrange(2**32)


def williams(count: int) -> list[tuple[int, ...]]:
    """A Williams design: each of `count` items in each position, and right after each other item,
    equally often (`count` rows when even, `2 * count` when odd)."""
    first, low, high = [0], 1, count - 1
    for k in range(1, count):
        first.append(low if k % 2 else high)
        low, high = (low + 1, high) if k % 2 else (low, high - 1)
    rows = [tuple((x + shift) % count for x in first) for shift in range(count)]
    return rows + [row[::-1] for row in rows] if count % 2 else rows


def schedule(count: int, rounds: int, seed: int) -> list[tuple[int, ...]]:
    """Running orders for `rounds` rounds: Williams blocks, each relabelled and shuffled at random.
    The balance is exact when `rounds` is a multiple of the block (count, or 2 * count if odd)."""
    rng = random.Random(seed)
    orders: list[tuple[int, ...]] = []
    while len(orders) < rounds:
        labels = rng.sample(range(count), count)
        block = [tuple(labels[i] for i in row) for row in williams(count)]
        rng.shuffle(block)
        orders.extend(block)
    return orders[:rounds]


def interleave(contenders: Sequence[Contender], rounds: int, metric: Metric, timeout_s: float,
               runner: SeriesRunner, on_run: Callable[[RunEvent], None], seed: int | None = None) -> Rounds:
    """One fresh run per contender per round, in a balanced random order, as one series (the
    runner may start a run before the last ended, never measure two at once); a failed run keeps
    its reason."""
    seed = new_seed() if seed is None else seed
    orders = schedule(len(contenders), rounds, seed)
    turns = [(number, position) for number, order in enumerate(orders) for position in order]
    runs: list[list[RoundRun]] = [[] for _ in contenders]
    for (_, position), result in zip(turns, _series(contenders, turns, timeout_s, runner, on_run, rounds),
                                     strict=True):
        runs[position].append(round_run((result,), metric))
    return Rounds(tuple(contenders), tuple(tuple(r) for r in runs), tuple(orders), seed)


def until_decided(contenders: Sequence[Contender], design: Design, metric: Metric, timeout_s: float,
                  runner: SeriesRunner, on_run: Callable[[RunEvent], None], decided: Callable[[Rounds, Look], bool],
                  seed: int | None = None, time_limit_s: float | None = None,
                  clock: Callable[[], float] = time.monotonic, floor: float | Kept | None = None) -> Stopped:
    """Rounds up to each look of `design` in turn, until `decided(rounds, look)` says every
    decision is made, or the last look. With `time_limit_s`, no look after the first starts when
    its rounds, at the pace of those so far, would end past the limit: the rounds stop at the look
    before ("time"). `floor`: this host's spread floor, a fixed value or the kept one (read before
    each round, taught each undisturbed run)."""
    seed = new_seed() if seed is None else seed
    orders = schedule(len(contenders), design.cap, seed)
    runs: list[list[RoundRun]] = [[] for _ in contenders]
    start = clock()
    measured, judged = None, design.looks[0]
    for look in design.looks:
        if measured is not None and _past_limit(clock() - start, measured.count, look.rounds, time_limit_s):
            return Stopped(measured, judged, "time", clock() - start)
        for number in range(measured.count if measured else 0, look.rounds):
            threshold = floor.threshold() if isinstance(floor, Kept) else floor
            kept, results = _round(contenders, number, orders[number], metric, timeout_s, runner, on_run, design.cap,
                                   threshold)
            if isinstance(floor, Kept):
                floor.learn(undisturbed_spreads(Measurement(tuple(results))))
            for position, run in kept.items():
                runs[position].append(run)
        measured = Rounds(tuple(contenders), tuple(tuple(r) for r in runs), tuple(orders[:look.rounds]), seed)
        judged = look
        if decided(measured, look):
            return Stopped(measured, look, "decided", clock() - start)
    assert measured is not None
    return Stopped(measured, judged, "cap", clock() - start)


def _past_limit(elapsed_s: float, done: int, planned: int, limit_s: float | None) -> bool:
    """Whether rounds up to `planned`, at the pace of the `done` so far, would end past the limit."""
    return limit_s is not None and elapsed_s + elapsed_s / done * (planned - done) > limit_s


def _round(contenders: Sequence[Contender], number: int, order: Sequence[int], metric: Metric, timeout_s: float,
           runner: SeriesRunner, on_run: Callable[[RunEvent], None], rounds: int,
           floor: float | None = None) -> tuple[dict[int, RoundRun], list[RunResult]]:
    """One round in `order`; then each contender whose run ran and was flagged noisy (against this
    host's spread `floor`) runs again, at most `CONFIRM_RERUNS` times, in the same order. What each
    contender's round keeps, and every run it took (reruns included)."""
    attempts: dict[int, list[RunResult]] = {position: [] for position in order}
    waiting = list(order)
    for attempt in range(CONFIRM_RERUNS + 1):
        turns = [(number, position) for position in waiting]
        for (_, position), result in zip(turns, _series(contenders, turns, timeout_s, runner, on_run, rounds,
                                                        attempt, floor), strict=True):
            attempts[position].append(result)
        waiting = [p for p in waiting if attempts[p][-1].ok and noisy_reason(attempts[p][-1], floor)]
        if not waiting:
            break
    kept = {position: round_run(tuple(attempts[position]), metric, checked=True, floor=floor) for position in order}
    return kept, [result for position in order for result in attempts[position]]


def _series(contenders: Sequence[Contender], turns: Sequence[tuple[int, int]], timeout_s: float,
            runner: SeriesRunner, on_run: Callable[[RunEvent], None], rounds: int,
            attempt: int = 0, floor: float | None = None) -> list[RunResult]:
    """The runs of `turns` (round, contender position) as one series, each told to `on_run`."""
    results = []
    with contextlib.closing(runner([contenders[p].plan for _, p in turns], timeout_s)) as series:
        for (number, position), result in zip(turns, series, strict=True):
            results.append(result)
            on_run(RunEvent(number, rounds, contenders[position], result,
                            noisy_reason(result, floor) if result.ok else "", attempt))
    return results


def round_run(attempts: Sequence[RunResult], metric: Metric, checked: bool = False,
              floor: float | None = None) -> RoundRun:
    """What a round keeps of a contender's attempts: a failure when one failed, else the first quiet
    one, else (every one noisy) the one with the median value; `checked`: the runs' noisy flags
    were read (a series run without reruns, `interleave`, keeps no flags)."""
    flags = tuple(noisy_reason(a, floor) if a.ok else "" for a in attempts) if checked else ()
    wall_s = sum(a.wall_s for a in attempts)
    failed = next((a for a in attempts if not a.ok), None)
    if failed is not None:
        return RoundRun(None, None, failed.reason, wall_s, flags=flags, kept=attempts.index(failed))
    kept = _kept(attempts, flags, metric)
    chosen = attempts[kept]
    return RoundRun(metric_value(chosen, metric), chosen.latency_p90_ms, wall_s=wall_s,
                    tpot_p90_ms=chosen.generation.get("tpot_p90_ms"),
                    buckets=chosen.bucket_p50s_ms, flags=flags, kept=kept)


def _kept(attempts: Sequence[RunResult], flags: Sequence[str], metric: Metric) -> int:
    quiet = next((i for i, flag in enumerate(flags) if not flag), None)
    if quiet is not None:
        return quiet
    if len(attempts) == 1:
        return 0
    ranked = sorted(range(len(attempts)), key=lambda i: metric_value(attempts[i], metric))
    return ranked[(len(ranked) - 1) // 2]


def paired(reference: Sequence[float | None], candidate: Sequence[float | None], metric: Metric,
           min_effect: float) -> PairedComparison | None:
    """Candidate vs reference over the rounds where both ran; > 1 means the candidate is better."""
    ratios = speedups(reference, candidate, metric)
    return stats.paired_speedup(ratios, min_effect) if len(ratios) >= 2 else None


def speedups(reference: Sequence[float | None], candidate: Sequence[float | None], metric: Metric) -> list[float]:
    """Per-round speedup of the candidate over the reference, over the rounds where both ran."""
    pairs = [(r, c) for r, c in zip(reference, candidate, strict=True) if r is not None and c is not None]
    return [r / c if lower_is_better(metric) else c / r for r, c in pairs]
