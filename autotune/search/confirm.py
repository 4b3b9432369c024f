"""Confirmation: the top candidates and the baseline re-measured in interleaved rounds.

A search's best trial is the minimum of many noisy estimates, biased toward luck. Here each
contender runs once per round, every run a fresh process. The order within rounds is random but
balanced (blocks of a Williams design: each contender in each position, and right after each
other contender, equally often), seeded and recorded, so that a slow spell, a warming machine or
the contender that ran just before hits everyone alike. Per round a candidate's ratio to the
baseline is paired; a one-sided exact Wilcoxon signed-rank test asks whether the gain exceeds
the minimum effect, and the speedup beside it is the same test's Hodges-Lehmann estimate with the
test inverted as its interval (labelled with its real coverage, so that a significant gain is one
whose interval's low end clears the minimum effect); Holm's step-down guards the family of
candidates. A candidate with any failed
run, or whose p90 latency in these rounds breaks the study's limit, cannot win.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import AutotuneError
from autotune.base.thresholds import ALPHA
from autotune.measure import stats
from autotune.measure.objectives import Metric, lower_is_better, metric_of, metric_value, min_rounds
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import SeriesRunner
from autotune.measure.results import RunResult
from autotune.measure.runner import run_series
from autotune.measure.stats import PairedComparison
from autotune.search import against_recipe
from autotune.study import confirmations, records, references


class ConfirmError(AutotuneError):
    """Nothing to confirm or compare."""


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


@dataclass(frozen=True)
class RoundRun:
    """What one run of one contender gave: the metric, its p90 latency, or why it failed, and how
    long its processes took from start to exit."""

    value: float | None
    p90_ms: float | None
    reason: str = ""
    wall_s: float | None = None
    buckets: Mapping[str, float] = field(default_factory=dict)  # per sequence-length bucket, its p50 ms


@dataclass(frozen=True)
class Rounds:
    """Every contender's runs, round by round, and the order they ran in."""

    contenders: tuple[Contender, ...]
    runs: tuple[tuple[RoundRun, ...], ...]  # [contender][round]
    orders: tuple[tuple[int, ...], ...]  # [round]: contender positions in running order
    seed: int

    def values(self, position: int) -> list[float | None]:
        return [r.value for r in self.runs[position]]


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
    with contextlib.closing(runner([contenders[p].plan for _, p in turns], timeout_s)) as results:
        for (number, position), result in zip(turns, results, strict=True):
            runs[position].append(_round_run(result, metric))
            on_run(RunEvent(number, rounds, contenders[position], result))
    return Rounds(tuple(contenders), tuple(tuple(r) for r in runs), tuple(orders), seed)


def _round_run(result: RunResult, metric: Metric) -> RoundRun:
    if not result.ok:
        return RoundRun(None, None, result.reason, result.wall_s)
    return RoundRun(metric_value(result, metric), result.latency_p90_ms, wall_s=result.wall_s,
                    buckets=result.bucket_p50s_ms)


def paired(reference: Sequence[float | None], candidate: Sequence[float | None], metric: Metric,
           min_effect: float) -> PairedComparison | None:
    """Candidate vs reference over the rounds where both ran; > 1 means the candidate is better."""
    ratios = speedups(reference, candidate, metric)
    return stats.paired_speedup(ratios, min_effect) if len(ratios) >= 2 else None


def speedups(reference: Sequence[float | None], candidate: Sequence[float | None], metric: Metric) -> list[float]:
    """Per-round speedup of the candidate over the reference, over the rounds where both ran."""
    pairs = [(r, c) for r, c in zip(reference, candidate, strict=True) if r is not None and c is not None]
    return [r / c if lower_is_better(metric) else c / r for r, c in pairs]


def check_rounds(rounds: int, candidates: int, flag: str = "--rounds", top_flag: str = "--top") -> None:
    """Refuse a round count that can never be significant for this many candidates after Holm."""
    needed = min_rounds(candidates)
    if rounds < needed:
        smallest = f"1/{2**rounds}"
        raise ConfirmError(f"{flag} {rounds} can never reach significance for {candidates} candidate(s): the "
                           f"smallest one-sided signed-rank p is {smallest}, and Holm's correction asks for "
                           f"p < {ALPHA}/{candidates}; use {flag} {needed} or more, or a smaller {top_flag}")


def candidates(study: optuna.Study, top: int) -> tuple[FrozenTrial, list[FrozenTrial]]:
    """The baseline and the best `top` distinct completed configurations."""
    base = records.baseline(study)
    if base is None:
        raise ConfirmError(f"study {study.study_name!r} has no completed baseline trial; run `autotune search`")
    seen: set[str] = set()
    chosen = []
    for trial in records.best_measured(study):
        config = str(trial.user_attrs.get("config"))
        if trial.user_attrs.get("baseline") or config in seen:
            continue
        if trial.state == TrialState.COMPLETE and "plan" in trial.user_attrs:
            seen.add(config)
            chosen.append(trial)
    return base, chosen[:top]


def confirm(study: optuna.Study, top: int, rounds: int, min_effect: float, timeout_s: float,
            on_run: Callable[[RunEvent], None], runner: SeriesRunner = run_series,
            seed: int | None = None, ran_on: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Re-measure, decide, and store the verdict on the study (user attribute `confirmation`);
    `ran_on` is the host that measured it (`machine.host_identity`), recorded in the verdict."""
    check_rounds(rounds, top)
    base, chosen = candidates(study, top)
    metric = metric_of(str(study.user_attrs.get("objective", "latency")))
    recipe, peer = against_recipe.best_recipe(study, metric), against_recipe.best_peer(study, metric)
    contenders = [Contender(f"trial {t.number}", records.plan_of(t), t.number) for t in chosen]
    contenders += [Contender(f"trial {t.number} ({'peer' if references.is_peer(t) else 'recipe'})",
                             records.plan_of(t), t.number) for t in extra_references(study, chosen)]
    reference = Contender(f"trial {base.number} (baseline)", records.plan_of(base), base.number)
    measured = interleave([reference, *contenders], rounds, metric, timeout_s, runner, on_run, seed) \
        if chosen else None
    limit = study.user_attrs.get("max_latency_ms")
    verdict = decide(base, chosen, measured, metric, rounds, min_effect, float(limit) if limit else None, recipe,
                     peer)
    verdict.update(ran_on or {})
    return confirmations.record(study, verdict)


def decide(base: FrozenTrial, chosen: Sequence[FrozenTrial], measured: Rounds | None, metric: Metric, rounds: int,
           min_effect: float, max_latency_ms: float | None = None, recipe: FrozenTrial | None = None,
           peer: FrozenTrial | None = None) -> dict[str, Any]:
    """The verdict from the rounds: contender 0 is the baseline, then `chosen` in order, then the
    best expert recipe (`recipe`) and the best peer (`peer`) that are not among them, each found
    by its trial number (against_recipe.py)."""
    reference = measured.values(0) if measured else []
    rows = [_row(trial, measured.runs[i + 1], reference, metric, min_effect, max_latency_ms)
            for i, trial in enumerate(chosen)] if measured else []
    _holm(rows)
    winners = [r for r in rows if r["significant"]]
    best = max(winners, key=lambda r: r["speedup"]) if winners else None
    versus = _against("recipe", recipe, chosen, measured, best, metric, min_effect, max_latency_ms)
    versus_peer = _against("peer", peer, chosen, measured, best, metric, min_effect, max_latency_ms)
    if versus_peer is not None and measured is not None:
        over_recipe = speedups(measured.values(_series(chosen, measured, recipe)),
                               measured.values(_series(chosen, measured, peer)), metric) if recipe and peer else []
        versus_peer = against_recipe.weigh_peer(versus_peer, versus, over_recipe, min_effect)
    verdict: dict[str, Any] = {
        "metric": metric, "rounds": rounds, "min_effect": min_effect, "alpha": ALPHA,
        "baseline_trial": base.number, "candidates": rows, "significant": best is not None,
        "baseline_median": _median([v for v in reference if v is not None]),
        "baseline_failed_runs": sum(v is None for v in reference),
        "baseline_process_wall_s": _process_wall(measured.runs[0]) if measured else None,
        "baseline_buckets": _buckets(measured.runs[0]) if measured else {},
        "winner_trial": best["trial"] if best else base.number,
        "recommended_trial": against_recipe.recommended(best["trial"], versus, versus_peer) if best else base.number,
        "against_recipe": versus, "against_peer": versus_peer,
        "confirmed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if measured is not None:
        verdict.update(order_seed=measured.seed,
                       orders=[[measured.contenders[p].trial for p in order] for order in measured.orders])
    if best is not None:
        verdict.update(speedup=best["speedup"], ci=best["ci"], ci_label=best["ci_label"], p_value=best["p_value"])
    verdict["message"] = (_message(best, rows, rounds, min_effect) + against_recipe.sentence(versus)
                          + against_recipe.sentence(versus_peer, "peer"))
    return verdict


def extra_references(study: optuna.Study, chosen: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The best expert recipe and the best peer that the confirmation runs beside the candidates
    (those that are not among them)."""
    metric = metric_of(str(study.user_attrs.get("objective", "latency")))
    found = (against_recipe.best_recipe(study, metric), against_recipe.best_peer(study, metric))
    return [t for t in found if t is not None and _position(chosen, t) is None]


def _position(chosen: Sequence[FrozenTrial], trial: FrozenTrial) -> int | None:
    """Where `trial`'s configuration is among the candidates (a recipe the search ran twice, once
    as a duplicate, is that candidate)."""
    config = trial.user_attrs.get("config")
    return next((i for i, t in enumerate(chosen) if t.number == trial.number or t.user_attrs.get("config") == config),
                None)


def _series(chosen: Sequence[FrozenTrial], measured: Rounds, trial: FrozenTrial) -> int:
    """The contender that ran `trial` (a reference): its candidate, or its own series after them."""
    at = _position(chosen, trial)
    if at is not None:
        return 1 + at
    return next(i for i, c in enumerate(measured.contenders) if i > len(chosen) and c.trial == trial.number)


def _against(kind: against_recipe.Kind, reference: FrozenTrial | None, chosen: Sequence[FrozenTrial],
             measured: Rounds | None, best: dict[str, Any] | None, metric: Metric, min_effect: float,
             max_latency_ms: float | None) -> dict[str, Any] | None:
    """The winner against a reference (the best expert recipe or the best peer), with the
    reference's own row against the baseline when it was not a candidate (None: no winner, or no
    such reference ran)."""
    if measured is None or best is None or reference is None:
        return None
    position = _series(chosen, measured, reference)
    series = measured.runs[position]
    values = [r.value for r in series]
    winner = measured.values(1 + next(i for i, t in enumerate(chosen) if t.number == best["trial"]))
    found = against_recipe.compare(reference, values, best, speedups(values, winner, metric), min_effect, kind)
    if position > len(chosen):
        found["against_baseline"] = _row(reference, series, measured.values(0), metric, min_effect, max_latency_ms)
    return found


def _message(best: dict[str, Any] | None, rows: Sequence[dict[str, Any]], rounds: int, min_effect: float) -> str:
    if best is not None:
        return (f"trial {best['trial']} ({best['config']}) is {best['speedup']:.3f}x the baseline "
                f"({_ci(best)}, Wilcoxon p={best['p_value']:.3g}, {rounds} interleaved rounds)")
    tested = [r for r in rows if r["speedup"] is not None]
    if tested:
        tried = max(tested, key=lambda r: r["speedup"])
        return (f"no candidate beat the baseline by more than {min_effect:.0%} (Holm-adjusted p < {ALPHA}): the "
                f"closest, trial {tried['trial']}, was {tried['speedup']:.3f}x ({_ci(tried)}, "
                f"p={tried['p_value']:.3g}); PyTorch's defaults stay the recommendation")
    if rows:
        return "no candidate could win: " + "; ".join(f"trial {r['trial']} {r['reason']}" for r in rows)
    return "no candidate to confirm (no completed trial besides the baseline)"


def _ci(row: dict[str, Any]) -> str:
    return f"{row['ci_label']} {row['ci'][0]:.3f}-{row['ci'][1]:.3f}"


def _holm(rows: list[dict[str, Any]]) -> None:
    """Several candidates tested against one baseline: Holm's step-down keeps the chance of any
    false winner under ALPHA (each row keeps its raw p-value)."""
    tested = sorted((r for r in rows if r["p_value"] is not None), key=lambda r: r["p_value"])
    for rank, row in enumerate(tested):
        row["significant"] = row["p_value"] < ALPHA / (len(tested) - rank)
        if not row["significant"]:
            for later in tested[rank:]:
                later["significant"] = False
            break


def _median(values: Sequence[float]) -> float | None:
    return round(stats.median(values), 4) if values else None


def _process_wall(runs: Sequence[RoundRun]) -> float | None:
    """The median wall of a contender's runs, each a fresh process (or one per instance): what the
    confirmation spent on it per round, for whoever sizes the next one. Runs are built two at a
    time, so a run's wall is its share of the series (`runner.run_series`), not its
    process's start to exit."""
    walls = [r.wall_s for r in runs if r.wall_s is not None]
    return round(stats.median(walls), 3) if walls else None


def _buckets(runs: Sequence[RoundRun]) -> dict[str, float]:
    """Per sequence-length bucket, the median over the rounds of its p50 ms ({} without buckets):
    what a deployment of this contender should serve each bucket at, measured in the same rounds as
    the verdict rather than in the trial's one process."""
    seen: dict[str, list[float]] = {}
    for run in runs:
        for length, p50 in run.buckets.items():
            seen.setdefault(length, []).append(p50)
    return {length: round(stats.median(p50s), 4) for length, p50s in seen.items()}


def _row(trial: FrozenTrial, runs: Sequence[RoundRun], reference: Sequence[float | None], metric: Metric,
         min_effect: float, max_latency_ms: float | None) -> dict[str, Any]:
    """One candidate's line of the verdict; only a candidate whose every run succeeded within the
    study's latency limit is tested (`status` "ok"), the others say why they cannot win."""
    ran = [r.value for r in runs if r.value is not None]
    row: dict[str, Any] = {"trial": trial.number, "config": trial.user_attrs.get("config"),
                           "failed_runs": len(runs) - len(ran), "median": _median(ran),
                           "process_wall_s": _process_wall(runs), "buckets": _buckets(runs),
                           "status": "ok", "reason": "", "speedup": None, "ci": None, "ci_label": None,
                           "ci_coverage": None, "p_value": None, "significant": False}
    row.update(_disqualified(runs, max_latency_ms))
    comparison = paired(reference, [r.value for r in runs], metric, min_effect)
    if row["status"] == "ok" and comparison is not None:
        interval = comparison.interval
        row.update(speedup=round(comparison.speedup, 4), ci=[round(interval.low, 4), round(interval.high, 4)],
                   ci_label=interval.label, ci_coverage=round(interval.coverage, 4), p_value=comparison.p_value)
    return row


def _disqualified(runs: Sequence[RoundRun], max_latency_ms: float | None) -> dict[str, str]:
    failed = [r for r in runs if r.value is None]
    if failed:
        return {"status": "failed", "reason": f"failed {len(failed)} of {len(runs)} runs: {failed[0].reason}"}
    p90 = stats.median([r.p90_ms for r in runs if r.p90_ms is not None]) if runs else 0.0
    if max_latency_ms is not None and p90 > max_latency_ms:
        return {"status": "over the latency limit",
                "reason": f"had a p90 latency of {p90:.2f} ms in these rounds, over --max-latency-ms "
                          f"{max_latency_ms:g}"}
    return {}
