"""Confirmation: the top candidates and the baseline re-measured in interleaved rounds.

A search's best trial is the minimum of many noisy estimates, biased toward luck. Here each
contender runs once per round, every run a fresh process, the order rotating from round to round
so that a slow spell or a warming machine hits everyone alike. Per round a candidate's ratio to
the baseline is paired; the speedup is the median ratio with an order-statistic 95% interval, and
a one-sided Wilcoxon signed-rank test asks whether the gain exceeds the minimum effect.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import records, stats
from autotune.errors import AutotuneError
from autotune.launch import LaunchPlan
from autotune.objectives import ALPHA, MIN_ROUNDS, Metric, lower_is_better, metric_of, metric_value
from autotune.orchestrate import run_plan
from autotune.replicates import PlanRunner
from autotune.results import RunResult
from autotune.stats import PairedComparison


class ConfirmError(AutotuneError):
    """Nothing to confirm or compare."""


@dataclass(frozen=True)
class Contender:
    label: str
    plan: LaunchPlan
    trial: int | None = None


@dataclass(frozen=True)
class RunEvent:
    round: int
    rounds: int
    contender: Contender
    result: RunResult


def interleave(contenders: Sequence[Contender], rounds: int, metric: Metric, timeout_s: float, runner: PlanRunner,
               on_run: Callable[[RunEvent], None]) -> dict[str, list[float | None]]:
    """One fresh run per contender per round, rotating the order; a failed run is None."""
    values: dict[str, list[float | None]] = {c.label: [] for c in contenders}
    for number in range(rounds):
        shift = number % len(contenders)
        for contender in [*contenders[shift:], *contenders[:shift]]:
            result = runner(contender.plan, timeout_s)
            values[contender.label].append(metric_value(result, metric) if result.ok else None)
            on_run(RunEvent(number, rounds, contender, result))
    return values


def paired(reference: Sequence[float | None], candidate: Sequence[float | None], metric: Metric,
           min_effect: float) -> PairedComparison | None:
    """Candidate vs reference over the rounds where both ran; > 1 means the candidate is better."""
    pairs = [(r, c) for r, c in zip(reference, candidate, strict=True) if r is not None and c is not None]
    if len(pairs) < 2:
        return None
    ratios = [r / c if lower_is_better(metric) else c / r for r, c in pairs]
    return stats.paired_speedup(ratios, min_effect)


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
            on_run: Callable[[RunEvent], None], runner: PlanRunner = run_plan) -> dict[str, Any]:
    """Re-measure, decide, and store the verdict on the study (user attribute `confirmation`)."""
    if rounds < MIN_ROUNDS:
        raise ConfirmError(f"--rounds {rounds} can never reach p < {ALPHA} with a signed-rank test; "
                           f"use {MIN_ROUNDS} or more")
    base, chosen = candidates(study, top)
    metric = metric_of(str(study.user_attrs.get("objective", "latency")))
    contenders = [Contender(f"trial {t.number}", records.plan_of(t), t.number) for t in chosen]
    reference = Contender(f"trial {base.number} (baseline)", records.plan_of(base), base.number)
    values = interleave([*contenders, reference], rounds, metric, timeout_s, runner, on_run) if contenders else {}
    verdict = decide(base, chosen, values, reference.label, metric, rounds, min_effect)
    study.set_user_attr("confirmation", verdict)
    return verdict


def decide(base: FrozenTrial, chosen: Sequence[FrozenTrial], values: dict[str, list[float | None]],
           reference: str, metric: Metric, rounds: int, min_effect: float) -> dict[str, Any]:
    rows = []
    for trial in chosen:
        mine = values[f"trial {trial.number}"]
        comparison = paired(values[reference], mine, metric, min_effect)
        rows.append(_row(trial, mine, comparison))
    _holm(rows)
    winners = [r for r in rows if r["significant"]]
    best = max(winners, key=lambda r: r["speedup"]) if winners else None
    tried = max(rows, key=lambda r: r["speedup"] or 0.0) if rows else None
    verdict: dict[str, Any] = {
        "metric": metric, "rounds": rounds, "min_effect": min_effect, "alpha": ALPHA,
        "baseline_trial": base.number, "candidates": rows, "significant": best is not None,
        "baseline_median": _median([v for v in values.get(reference, []) if v is not None]),
        "winner_trial": best["trial"] if best else base.number,
        "confirmed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if best is not None:
        verdict.update(speedup=best["speedup"], ci95=best["ci95"], p_value=best["p_value"],
                       message=f"trial {best['trial']} ({best['config']}) is {best['speedup']:.3f}x the "
                               f"baseline (95% CI {best['ci95'][0]:.3f}-{best['ci95'][1]:.3f}, Wilcoxon "
                               f"p={best['p_value']:.3g}, {rounds} interleaved rounds)")
    elif tried is not None and tried["speedup"] is not None:
        verdict["message"] = (f"no candidate beat the baseline by more than {min_effect:.0%} (Holm-adjusted "
                              f"p < {ALPHA}): the "
                              f"closest, trial {tried['trial']}, was {tried['speedup']:.3f}x (95% CI "
                              f"{tried['ci95'][0]:.3f}-{tried['ci95'][1]:.3f}, p={tried['p_value']:.3g}); "
                              f"PyTorch's defaults stay the recommendation")
    else:
        verdict["message"] = "no candidate to confirm (no completed trial besides the baseline, or all failed)"
    return verdict


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


def _row(trial: FrozenTrial, mine: Sequence[float | None], comparison: PairedComparison | None) -> dict[str, Any]:
    ran = [v for v in mine if v is not None]
    row: dict[str, Any] = {"trial": trial.number, "config": trial.user_attrs.get("config"),
                           "failed_runs": len(mine) - len(ran),
                           "median": _median(ran),
                           "speedup": None, "ci95": None, "p_value": None, "significant": False}
    if comparison is not None and len(ran) * 2 > len(mine):
        row.update(speedup=round(comparison.speedup, 4),
                   ci95=[round(comparison.ci_low, 4), round(comparison.ci_high, 4)],
                   p_value=comparison.p_value, significant=comparison.significant)
    return row


def contender_from(spec: str, study: Callable[[], optuna.Study],
                   plan_env_file: Callable[[str], LaunchPlan]) -> Contender:
    """`compare` operands: a trial number of the study, or an env file written by `autotune export`."""
    if spec.isdigit():
        loaded = study()
        trial = next((t for t in loaded.get_trials(deepcopy=False) if t.number == int(spec)), None)
        if trial is None or "plan" not in trial.user_attrs or trial.state != TrialState.COMPLETE:
            raise ConfirmError(f"trial {spec} of study {loaded.study_name!r} did not complete; compare completed "
                               f"trials or env files")
        return Contender(f"trial {spec}", records.plan_of(trial), trial.number)
    return Contender(spec, plan_env_file(spec))
