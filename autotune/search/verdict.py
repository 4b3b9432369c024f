"""A confirmation's verdict at one look of its sequential design, from the rounds so far.

Each candidate is judged against the baseline (beats, slower, equivalent or undecided:
`measure/sequential.py`), "beats" only where Holm's step-down at the look's level passes it, so
that testing three candidates does not triple the chance of a false winner. The winner is the
candidate with the largest speedup among those that beat the baseline; it is then judged against
the best expert recipe and the best peer (`against_recipe.py`). A candidate with any failed run,
or whose p90 latency in these rounds breaks the study's limit, cannot win.

The verdict is `decided` when every decision the recommendation depends on is made: against the
baseline, a winner that no undecided candidate of a larger estimate could overtake, or no winner
and no candidate undecided; and the winner against each reference. The rounds go on while it is
not (search/confirm.py); at the cap, what is still undecided is said so, with the rounds it took.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from optuna.trial import FrozenTrial

from autotune.base.thresholds import ALPHA
from autotune.measure import quality, sequential, stats
from autotune.measure.objectives import NO_LIMITS, Limits, Metric
from autotune.measure.sequential import Design, Look
from autotune.search import against_recipe
from autotune.search.rounds import RoundRun, Rounds, speedups
from autotune.study import records


def decide(base: FrozenTrial, chosen: Sequence[FrozenTrial], measured: Rounds | None, metric: Metric, plan: Design,
           look: Look, min_effect: float, limits: Limits = NO_LIMITS, recipe: FrozenTrial | None = None,
           peer: FrozenTrial | None = None) -> dict[str, Any]:
    """The verdict from the rounds at `look`: contender 0 is the baseline, then `chosen` in order,
    then the best expert recipe (`recipe`) and the best peer (`peer`) that are not among them, each
    found by its trial number (against_recipe.py)."""
    reference = measured.values(0) if measured else []
    rows = [_row(trial, measured.runs[i + 1], reference, metric, min_effect, limits, look, plan)
            for i, trial in enumerate(chosen)] if measured else []
    _holm(rows, look.alpha)
    winners = [r for r in rows if r["significant"]]
    best = max(winners, key=lambda r: r["speedup"]) if winners else None
    versus = _against("recipe", recipe, chosen, measured, best, metric, min_effect, limits, look, plan)
    versus_peer = _against("peer", peer, chosen, measured, best, metric, min_effect, limits, look, plan)
    if versus_peer is not None and measured is not None:
        over_recipe = speedups(measured.values(_series(chosen, measured, recipe)),
                               measured.values(_series(chosen, measured, peer)), metric) if recipe and peer else []
        versus_peer = against_recipe.weigh_peer(versus_peer, versus, over_recipe, min_effect, look, plan)
    verdict: dict[str, Any] = {
        "metric": metric, "rounds": measured.count if measured else 0, "rounds_cap": plan.cap,
        "looks": plan.describe(), "look": look.number, "alpha_look": look.alpha, "min_effect": min_effect,
        "alpha": ALPHA, "baseline_trial": base.number, "candidates": rows, "significant": best is not None,
        "outcome": "beats" if best else _closest_outcome(rows),
        "baseline_median": _median([v for v in reference if v is not None]),
        "baseline_failed_runs": sum(v is None for v in reference),
        "baseline_process_wall_s": _process_wall(measured.runs[0]) if measured else None,
        "baseline_buckets": _buckets(measured.runs[0]) if measured else {},
        "baseline_reruns": sum(r.reruns for r in measured.runs[0]) if measured else 0,
        "winner_trial": best["trial"] if best else base.number,
        "recommended_trial": against_recipe.recommended(best["trial"], versus, versus_peer) if best else base.number,
        "against_recipe": versus, "against_peer": versus_peer,
        "decided": _settled(rows, best) and against_recipe.settled(versus) and against_recipe.settled(versus_peer),
        "confirmed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if measured is not None:
        verdict.update(order_seed=measured.seed,
                       orders=[[measured.contenders[p].trial for p in order] for order in measured.orders],
                       noisy_reruns=sum(r.reruns for series in measured.runs for r in series))
    if best is not None:
        verdict.update(speedup=best["speedup"], ci=best["ci"], ci_label=best["ci_label"], p_value=best["p_value"])
    verdict["message"] = (_message(best, rows, look, plan, min_effect) + against_recipe.sentence(versus)
                          + against_recipe.sentence(versus_peer, "peer"))
    return verdict


def _settled(rows: Sequence[dict[str, Any]], best: dict[str, Any] | None) -> bool:
    """Whether the verdict against the baseline is made: a winner that no undecided candidate of a
    larger estimate could overtake, or no winner and no candidate undecided."""
    open_rows = [r for r in rows if r["outcome"] == "undecided"]
    if best is None:
        return not open_rows
    return not any(r["speedup"] > best["speedup"] for r in open_rows)


def _closest(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    tested = [r for r in rows if r["speedup"] is not None]
    return max(tested, key=lambda r: r["speedup"]) if tested else None


def _closest_outcome(rows: Sequence[dict[str, Any]]) -> str | None:
    """Without a winner, the closest candidate's outcome against the baseline (None: none tested)."""
    closest = _closest(rows)
    return None if closest is None else str(closest["outcome"])


def _series(chosen: Sequence[FrozenTrial], measured: Rounds, trial: FrozenTrial) -> int:
    """The contender that ran `trial` (a reference): its candidate, or its own series after them."""
    at = position(chosen, trial)
    if at is not None:
        return 1 + at
    return next(i for i, c in enumerate(measured.contenders) if i > len(chosen) and c.trial == trial.number)


def position(chosen: Sequence[FrozenTrial], trial: FrozenTrial) -> int | None:
    """Where `trial`'s configuration is among the candidates (a recipe the search ran twice, once
    as a duplicate, is that candidate)."""
    config = trial.user_attrs.get("config")
    return next((i for i, t in enumerate(chosen) if t.number == trial.number or t.user_attrs.get("config") == config),
                None)


def _against(kind: against_recipe.Kind, reference: FrozenTrial | None, chosen: Sequence[FrozenTrial],
             measured: Rounds | None, best: dict[str, Any] | None, metric: Metric, min_effect: float,
             limits: Limits, look: Look, plan: Design) -> dict[str, Any] | None:
    """The winner against a reference (the best expert recipe or the best peer), with the
    reference's own row against the baseline when it was not a candidate (None: no winner, or no
    such reference ran)."""
    if measured is None or best is None or reference is None:
        return None
    at = _series(chosen, measured, reference)
    series = measured.runs[at]
    values = [r.value for r in series]
    winner = measured.values(1 + next(i for i, t in enumerate(chosen) if t.number == best["trial"]))
    found = against_recipe.compare(reference, values, best, speedups(values, winner, metric), min_effect, look, plan,
                                   kind)
    if at > len(chosen):
        found["against_baseline"] = _row(reference, series, measured.values(0), metric, min_effect, limits,
                                         look, plan)
    return found


def _message(best: dict[str, Any] | None, rows: Sequence[dict[str, Any]], look: Look, plan: Design,
             min_effect: float) -> str:
    at = f" at look {look.number} of {len(plan.looks)}" if len(plan.looks) > 1 else ""
    if best is not None:
        level = f" < {look.alpha:.3g}{at}" if at else ""
        return (f"trial {best['trial']} ({best['config']}) is {best['speedup']:.3f}x the baseline "
                f"({_ci(best)}, Wilcoxon p={best['p_value']:.3g}{level}, {look.rounds} interleaved rounds)")
    closest = _closest(rows)
    if closest is not None:
        return f"no candidate beat the baseline by more than {min_effect:.0%}" + _nearest(closest, look, at, min_effect)
    if rows:
        return "no candidate could win: " + "; ".join(f"trial {r['trial']} {r['reason']}" for r in rows)
    return "no candidate to confirm (no completed trial besides the baseline)"


def _nearest(row: dict[str, Any], look: Look, at: str, min_effect: float) -> str:
    """The closest candidate's outcome, in words, after "no candidate beat the baseline"."""
    stays = "PyTorch's defaults stay the recommendation"
    if row["outcome"] == "equivalent":
        return (f": the closest, trial {row['trial']}, is equivalent to it ({row['speedup']:.3f}x, {_ci(row)}, "
                f"equivalence p={row['p_value_equivalent']:.3g}: within {min_effect:.0%} either way); {stays}")
    if row["outcome"] == "slower":
        return (f": the closest, trial {row['trial']}, is slower than it ({row['speedup']:.3f}x, {_ci(row)}, "
                f"p={row['p_value_slower']:.3g}); {stays}")
    return (f" (Holm-adjusted p < {look.alpha:.3g}{at}): undecided after {look.rounds} rounds, the closest, trial "
            f"{row['trial']}, was {row['speedup']:.3f}x ({_ci(row)}, p={row['p_value']:.3g}); nothing is confirmed, "
            f"so {stays}")


def _ci(row: dict[str, Any]) -> str:
    return f"{row['ci_label']} {row['ci'][0]:.3f}-{row['ci'][1]:.3f}"


def _holm(rows: list[dict[str, Any]], alpha: float) -> None:
    """Several candidates tested against one baseline: Holm's step-down at the look's level keeps
    the chance of any false winner under it (each row keeps its raw p-value); a gain it does not
    pass is undecided."""
    tested = [r for r in rows if r["p_value"] is not None]
    for row, passed in zip(tested, sequential.holm([r["p_value"] for r in tested], alpha), strict=True):
        row["significant"] = passed
        if row["outcome"] == "beats" and not passed:
            row["outcome"] = "undecided"


def _median(values: Sequence[float]) -> float | None:
    return round(stats.median(values), 4) if values else None


def _process_wall(runs: Sequence[RoundRun]) -> float | None:
    """The median wall of a contender's runs, each a fresh process (or one per instance): what the
    confirmation spent on it per round, for whoever sizes the next one. Runs are built two at a
    time, so a run's wall is its share of the series (`runner.run_series`), not its
    process's start to exit; a run flagged noisy and run again counts every attempt."""
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
         min_effect: float, limits: Limits, look: Look, plan: Design) -> dict[str, Any]:
    """One candidate's line of the verdict; only a candidate whose every run succeeded within the
    study's limits is tested (`status` "ok"), the others say why they cannot win."""
    ran = [r.value for r in runs if r.value is not None]
    row: dict[str, Any] = {"trial": trial.number, "config": trial.user_attrs.get("config"),
                           "failed_runs": len(runs) - len(ran), "median": _median(ran),
                           "process_wall_s": _process_wall(runs), "buckets": _buckets(runs),
                           "reruns": sum(r.reruns for r in runs), "status": "ok", "reason": "", "speedup": None,
                           "ci": None, "ci_label": None, "ci_coverage": None, "p_value": None,
                           "p_value_slower": None, "p_value_equivalent": None, "outcome": None,
                           "significant": False}
    row.update(_disqualified(runs, limits, trial))
    ratios = speedups(reference, [r.value for r in runs], metric)
    if row["status"] == "ok" and len(ratios) >= 2:
        judged = sequential.judge(ratios, look, plan, min_effect)
        row.update(against_recipe.judged_fields(judged), outcome=judged.outcome)
    return row


def _disqualified(runs: Sequence[RoundRun], limits: Limits, trial: FrozenTrial) -> dict[str, str]:
    """Why a candidate cannot win: a failed run, its rounds over a latency limit, or its quality
    (measured once per model configuration, not per round) over --max-quality-drop."""
    failed = [r for r in runs if r.value is None]
    if failed:
        return {"status": "failed", "reason": f"failed {len(failed)} of {len(runs)} runs: {failed[0].reason}"}
    figures = {"latency_p90_ms": _median([r.p90_ms for r in runs if r.p90_ms is not None]),
               "tpot_p90_ms": _median([r.tpot_p90_ms for r in runs if r.tpot_p90_ms is not None])}
    breach = replace(limits, quality_drop=None).breach(figures)
    if breach:
        return {"status": "over the latency limit", "reason": breach}
    judged = replace(limits, latency_p90_ms=None, tpot_p90_ms=None).breach(
        {"quality_drop": quality.drop_of(trial.user_attrs.get(records.QUALITY))})
    return {"status": "over the quality limit", "reason": f"{judged} (measured on --eval-data)"} if judged else {}
