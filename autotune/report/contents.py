"""What `autotune report` shows, gathered from a study as typed values (rendered by html_page).

Pure reads of what the study recorded (records.py owns the attribute names): the history of each
objective metric with the baseline and the best expert recipe, each knob's importance and
marginal effect, the stored confirmation, latency against throughput, failures by reason, the
study's context, and the profile traces saved beside it.

Knob importance is fANOVA's (Optuna's FanovaImportanceEvaluator, fixed seed): on the studies we
had it agreed with the marginal effects and was stable under resampling, where PED-ANOVA named a
different top knob from one resample to the next (docs/report-and-profile.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import AutotuneError
from autotune.deploy import export
from autotune.measure import quality
from autotune.measure.objectives import Metric, lower_is_better, metric_of
from autotune.report.importance import (
    IMPORTANCE_EVALUATOR,
    MEASURED,
    Importance,
    Marginal,
    design,
    importance,
    marginals,
)
from autotune.study import confirmations, efficiency, quality_records, records, references

PROFILES = "profiles"  # studies/profiles/<study name>/*.trace.json, written by `autotune profile`
TRACE_GLOB = "*.trace.json"
METRIC_LABELS: Mapping[Metric, str] = {"latency_p50_ms": "p50 latency (ms)", "throughput_ips": "throughput (items/s)"}
NUMBER = re.compile(r"\b\d+(?:\.\d+)?\b")  # trial-specific numbers (pids, ms) inside failure reasons


class ReportError(AutotuneError):
    """Nothing to report on."""


@dataclass(frozen=True)
class Point:
    """One measured trial on the history: its value, and the best value so far."""

    trial: int
    value: float
    best_so_far: float | None  # None until a completed, feasible trial
    pruned: bool
    config: str
    recipe: str | None = None


@dataclass(frozen=True)
class Line:
    """A reference level on a history (the baseline, the best expert recipe)."""

    label: str
    trial: int
    value: float


@dataclass(frozen=True)
class History:
    metric: Metric
    points: tuple[Point, ...]
    baseline: Line | None
    recipe: Line | None


@dataclass(frozen=True)
class ForestRow:
    trial: int
    config: str
    speedup: float | None
    interval: tuple[float, float] | None
    interval_label: str | None
    p_value: float | None
    significant: bool
    reason: str
    reference: str = ""  # "recipe" or "peer": a reference the winner is held against, not a candidate
    outcome: str | None = None  # against the baseline: beats, slower, equivalent, undecided (None: not tested)


# Why a reference's row is in the confirmation though it is no candidate.
REFERENCE_REASONS = {"recipe": "the best expert recipe: a reference, not a candidate",
                     "peer": "the best peer (another runtime): a reference, not a candidate"}


@dataclass(frozen=True)
class Forest:
    """The stored confirmation: each contender's speedup over the baseline with its interval."""

    metric: Metric
    rounds: int
    min_effect: float
    baseline_trial: int
    winner_trial: int
    significant: bool
    message: str
    rows: tuple[ForestRow, ...]
    number: int = 1  # which of the study's confirmations this is (the latest)
    of: int = 1  # how many the study has had
    recommended_trial: int | None = None  # the winner, or the simpler expert recipe it ties with
    against_recipe: Mapping[str, Any] | None = None  # the winner against the best recipe (against_recipe.py)
    against_peer: Mapping[str, Any] | None = None  # the winner against the best peer (another runtime)
    outcomes: str = ""  # the outcome against each reference in a line (`confirmations.outcomes`)


@dataclass(frozen=True)
class TradeoffPoint:
    trial: int
    latency_p50_ms: float
    throughput_ips: float
    instances: int
    batch_size: int
    config: str
    pareto: bool


@dataclass(frozen=True)
class QualityPoint:
    """A completed trial's speed (the study's first objective) against its quality drop on the user's data."""

    trial: int
    speed: float
    drop: float
    drop_interval: tuple[float, float]
    value: float
    config: str
    front: bool  # no other trial is both faster and of a smaller drop (`quality_records.quality_front`)
    within_limit: bool


@dataclass(frozen=True)
class Quality:
    kind: str  # "accuracy" or "perplexity"
    unit: str  # of the drop: "points" or "%"
    metric: Metric  # what `speed` is
    limit: float | None  # --max-quality-drop
    points: tuple[QualityPoint, ...]


@dataclass(frozen=True)
class FailureGroup:
    state: str  # "failed" or "pruned"
    cause: str  # records' fail cause (error, killed, cut_short), or "pruned"
    reason: str  # the first trial's reason, as recorded
    trials: tuple[int, ...]


@dataclass(frozen=True)
class Best:
    trial: int
    config: str
    values: Mapping[Metric, float]
    baseline: Mapping[Metric, float]
    speedups: Mapping[Metric, float]
    versus_recipes: str


@dataclass(frozen=True)
class Report:
    name: str
    metrics: tuple[Metric, ...]
    counts: Mapping[str, int]
    best: Best | None
    histories: tuple[History, ...]
    importances: tuple[Importance, ...]
    marginals: tuple[Marginal, ...]
    forest: Forest | None
    tradeoff: tuple[TradeoffPoint, ...]
    failures: tuple[FailureGroup, ...]
    context: Mapping[str, Mapping[str, Any]]
    traces: tuple[Path, ...]
    efficiency: Mapping[str, Any] | None = None  # the recommended (or best) trial against this CPU's peak
    quality: Quality | None = None  # speed against quality on --eval-data (None: the study judged none)


def gather(study: optuna.Study, studies_dir: Path) -> Report:
    """Everything the page shows, read from the study; a study without a completed trial is refused."""
    trials = study.get_trials(deepcopy=False)
    if not any(t.state == TrialState.COMPLETE for t in trials):
        failed = sum(t.state == TrialState.FAIL for t in trials)
        raise ReportError(f"study {study.study_name!r} has no completed trial ({len(trials)} trials, {failed} "
                          f"failed): nothing to report; run `autotune search` first or fix what fails")
    metrics = metrics_of(str(study.user_attrs.get("objective", "latency")))
    rows = design(study)
    return Report(
        name=study.study_name, metrics=metrics, counts=counts(trials), best=best(study, metrics),
        histories=tuple(history(study, m) for m in metrics),
        importances=tuple(importance(rows, m) for m in metrics),
        marginals=tuple(x for m in metrics for x in marginals(rows, m)),
        forest=forest(study.user_attrs.get("confirmation"), confirmations.count(study.user_attrs)),
        tradeoff=tradeoff(study),
        failures=failures(trials), context=context(study.user_attrs), traces=traces(studies_dir, study.study_name),
        efficiency=efficiency.of_recommended(study), quality=speed_against_quality(study, metrics[0]))


def speed_against_quality(study: optuna.Study, metric: Metric) -> Quality | None:
    """Every completed trial with a quality figure, its speed against its drop, the front marked."""
    front = {t.number for t in quality_records.quality_front(study)}
    limit = study.user_attrs.get("max_quality_drop")
    points, kind = [], None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        found = t.user_attrs.get(records.QUALITY)
        drop = quality.drop_of(found)
        if not isinstance(found, dict) or drop is None or metric not in t.user_attrs or records.is_duplicate(t):
            continue
        kind = str(found["kind"])
        low, high = found["drop_interval"] or (drop, drop)  # the user's metric is one number: no interval
        points.append(QualityPoint(t.number, float(t.user_attrs[metric]), drop, (float(low), float(high)),
                                   float(found["value"]), str(t.user_attrs.get("config", "")), t.number in front,
                                   limit is None or drop <= float(limit)))
    if kind is None:
        return None
    return Quality(kind, quality.UNITS[kind], metric, None if limit is None else float(limit), tuple(points))


def metrics_of(objective: str) -> tuple[Metric, ...]:
    """The metrics a study optimises, in the order of its objective values."""
    return ("latency_p50_ms", "throughput_ips") if objective == "both" else (metric_of(objective),)


def counts(trials: Sequence[FrozenTrial]) -> dict[str, int]:
    found = {"trials": len(trials)}
    for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING):
        found[state.name.lower()] = sum(t.state == state for t in trials)
    found["undecided"] = sum(records.fail_cause(t) == records.UNDECIDED for t in trials)
    found["fail"] -= found["undecided"]  # stopped on a noisy window: not a failure of the configuration
    return found


def _measured(study: optuna.Study, metric: Metric) -> list[FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False, states=MEASURED) if metric in t.user_attrs]


def history(study: optuna.Study, metric: Metric) -> History:
    """Trial number against the metric; the best so far counts completed, feasible trials only."""
    points, best_value = [], None
    better = min if lower_is_better(metric) else max
    for t in _measured(study, metric):
        value = float(t.user_attrs[metric])
        counted = t.state == TrialState.COMPLETE and t.user_attrs.get("feasible", True)
        best_value = (better(best_value, value) if best_value is not None else value) if counted else best_value
        points.append(Point(t.number, value, best_value,
                            t.state == TrialState.PRUNED, str(t.user_attrs.get("config", "")),
                            t.user_attrs.get("recipe")))
    return History(metric, tuple(points), _baseline_line(study, metric), _recipe_line(study, metric))


def _baseline_line(study: optuna.Study, metric: Metric) -> Line | None:
    base = records.baseline(study)
    return None if base is None else Line("baseline (PyTorch defaults)", base.number, float(base.user_attrs[metric]))


def _recipe_line(study: optuna.Study, metric: Metric) -> Line | None:
    recipe = references.best_recipe(study, records.speedup_key(metric))
    if recipe is None:
        return None
    return Line(f"best expert recipe: {recipe.user_attrs['recipe']}", recipe.number, float(recipe.user_attrs[metric]))


def forest(verdict: Mapping[str, Any] | None, count: int = 1) -> Forest | None:
    """The confirmation as confirm.decide stored it: its intervals and labels, never recomputed."""
    if not verdict:
        return None
    versus, peer = verdict.get("against_recipe"), verdict.get("against_peer")
    references = [(found["against_baseline"], kind) for kind, found in (("recipe", versus), ("peer", peer))
                  if found and found.get("against_baseline")]
    rows = tuple(_forest_row(c, kind) for c, kind in [*((c, "") for c in verdict["candidates"]), *references])
    return Forest(verdict["metric"], int(verdict["rounds"]), float(verdict["min_effect"]),
                  int(verdict["baseline_trial"]), int(verdict["winner_trial"]), bool(verdict["significant"]),
                  str(verdict["message"]), rows, int(verdict.get("number", 1)), count,
                  confirmations.recommended(verdict), versus, peer, confirmations.outcomes(verdict))


def _forest_row(found: Mapping[str, Any], reference: str) -> ForestRow:
    """A contender's row as the verdict stored it; a reference's (`reference`: which) says so
    where nothing else is said."""
    return ForestRow(int(found["trial"]), str(found["config"]), found["speedup"],
                     tuple(found["ci"]) if found["ci"] else None, found["ci_label"], found["p_value"],
                     bool(found["significant"]), str(found.get("reason", "")) or REFERENCE_REASONS.get(reference, ""),
                     reference, found.get("outcome"))


def tradeoff(study: optuna.Study) -> tuple[TradeoffPoint, ...]:
    """p50 latency against items/s of every completed trial; the Pareto front of a two-objective study."""
    front = {t.number for t in study.best_trials} if len(study.directions) > 1 else set()
    return tuple(TradeoffPoint(t.number, float(t.user_attrs["latency_p50_ms"]), float(t.user_attrs["throughput_ips"]),
                               len(t.user_attrs.get("plan", {}).get("instances", [])) or 1,
                               int(t.user_attrs.get("batch_size", 1)), str(t.user_attrs.get("config", "")),
                               t.number in front)
                 for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if "latency_p50_ms" in t.user_attrs and "throughput_ips" in t.user_attrs)


def failures(trials: Sequence[FrozenTrial]) -> tuple[FailureGroup, ...]:
    """Failed and pruned trials grouped by cause and reason (numbers such as pids and times
    masked so that one cause is one group), the largest group first."""
    groups: dict[tuple[str, str, str], list[FrozenTrial]] = {}
    for t in trials:
        if t.state not in (TrialState.FAIL, TrialState.PRUNED):
            continue
        cause = records.fail_cause(t) or "pruned"
        state = {TrialState.PRUNED: "pruned", TrialState.FAIL: "failed"}[t.state] if cause != records.UNDECIDED \
            else "undecided"
        groups.setdefault((state, cause, NUMBER.sub("N", records.end_reason(t))), []).append(t)
    found = [FailureGroup(state, cause, records.end_reason(ts[0]), tuple(t.number for t in ts))
             for (state, cause, _), ts in groups.items()]
    return tuple(sorted(found, key=lambda g: (-len(g.trials), g.trials[0])))


def context(attrs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The study's own description, the host, the measurement settings and the search accounting."""
    study = {k: attrs[k] for k in ("model", "objective", "batch_size", "batch_sizes", "max_latency_ms", "max_tpot_ms",
                                   "created_by", "created_at") if attrs.get(k) not in (None, "", [])}
    return {"study": study, "host": dict(attrs.get("host", {})), "settings": dict(attrs.get("settings", {})),
            "accounting": dict(attrs.get("accounting", {}))}


def traces(studies_dir: Path, name: str) -> tuple[Path, ...]:
    folder = studies_dir / PROFILES / name
    return tuple(sorted(folder.glob(TRACE_GLOB))) if folder.is_dir() else ()


def best(study: optuna.Study, metrics: Sequence[Metric]) -> Best | None:
    """The search's best measured trial (first of a Pareto front) against the baseline."""
    found = records.best_measured(study)
    if not found:
        return None
    top, base = found[0], records.baseline(study)
    return Best(top.number, str(top.user_attrs.get("config", "")),
                {m: float(top.user_attrs[m]) for m in metrics},
                _baseline_values(study, base, metrics),
                {m: records.speedup(top, records.speedup_key(m), study.user_attrs) or 1.0 for m in metrics},
                export.versus_recipes(study, top))


def _baseline_values(study: optuna.Study, base: FrozenTrial | None, metrics: Sequence[Metric]) -> dict[Metric, float]:
    """The baseline's values the speedups are over: its quiet re-measure when it had one."""
    if base is None:
        return {}
    quiet = records.quiet_baseline(study.user_attrs, str(base.user_attrs.get("host")))
    return {m: float((quiet or base.user_attrs)[m]) for m in metrics}


def summary(report: Report, output: Path) -> dict[str, Any]:
    """The page's numbers for stdout and `--json`."""
    return {
        "study": report.name, "output": str(output), "metrics": list(report.metrics), "counts": dict(report.counts),
        "best": None if report.best is None else {
            "trial": report.best.trial, "config": report.best.config, "values": dict(report.best.values),
            "baseline": dict(report.best.baseline), "speedups": dict(report.best.speedups),
            "versus_recipes": report.best.versus_recipes},
        "confirmation": None if report.forest is None else {
            "significant": report.forest.significant, "winner_trial": report.forest.winner_trial,
            "recommended_trial": report.forest.recommended_trial, "against_recipe": report.forest.against_recipe,
            "against_peer": report.forest.against_peer,
            "message": report.forest.message, "number": report.forest.number, "of": report.forest.of,
            "outcomes": report.forest.outcomes},
        "importance": {imp.metric: {"evaluator": IMPORTANCE_EVALUATOR, "trials": imp.trials,
                                    "knobs": dict(imp.knobs), "note": imp.note,
                                    "within": [{"knob": w.knob, "share": w.share, "trials": w.trials,
                                                "where": w.where} for w in imp.within]}
                       for imp in report.importances},
        "failures": [{"state": g.state, "cause": g.cause, "reason": g.reason, "trials": list(g.trials)}
                     for g in report.failures],
        "traces": [str(p) for p in report.traces],
        "efficiency": report.efficiency,
    }
