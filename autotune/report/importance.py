"""Which knobs matter: each measured trial as a row of knob values, fANOVA importance per metric,
and each knob's marginal (the metric grouped by the knob's value), for `autotune report`."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.config.knobs import KNOBS, Config
from autotune.config.space import config_of_params
from autotune.measure.objectives import Metric
from autotune.study import records, storage

IMPORTANCE_EVALUATOR = "fANOVA"
IMPORTANCE_SEED = 0  # fANOVA fits a random forest: a fixed seed makes the page reproducible
MIN_IMPORTANCE_TRIALS = 3
MEASURED = (TrialState.COMPLETE, TrialState.PRUNED)  # a pruned trial keeps the replicates it ran


@dataclass(frozen=True)
class Row:
    """A measured trial as the importance and marginals see it: every knob's value as text."""

    trial: int
    knobs: Mapping[str, str]
    values: Mapping[Metric, float]


@dataclass(frozen=True)
class Importance:
    metric: Metric
    knobs: tuple[tuple[str, float], ...]  # most important first; normalized to sum to 1
    trials: int
    note: str = ""  # why there is nothing to show


@dataclass(frozen=True)
class Marginal:
    """The objective's values per value of one knob, values in the knob's own order."""

    knob: str
    metric: Metric
    groups: tuple[tuple[str, tuple[float, ...]], ...]


def knob_values(trial: FrozenTrial) -> Config:
    """The configuration a trial ran: its recorded plan's, else its parameters."""
    plan = trial.user_attrs.get("plan")
    return Config.from_mapping(plan["config"]) if plan else config_of_params(trial.params)


def design(study: optuna.Study) -> tuple[Row, ...]:
    """Measured trials (pruned ones with the replicates they ran; reused duplicates once), every
    knob of the study's space as text: a knob left unset reads as its default."""
    space = list(study.user_attrs.get("space", {}).get("knobs", {})) or list(KNOBS)
    rows = []
    for t in study.get_trials(deepcopy=False, states=MEASURED):
        if records.is_duplicate(t) or "latency_p50_ms" not in t.user_attrs:
            continue
        config = knob_values(t)
        values = {m: float(t.user_attrs[m]) for m in ("latency_p50_ms", "throughput_ips") if m in t.user_attrs}
        rows.append(Row(t.number, {k: config.text(k) for k in space}, values))
    return tuple(rows)


def varying(rows: Sequence[Row]) -> list[str]:
    """Knobs that took more than one value among the rows, in the space's order."""
    knobs = list(rows[0].knobs) if rows else []
    return [k for k in knobs if len({r.knobs[k] for r in rows}) > 1]


def value_order(knob: str, text: str) -> tuple[int, float, str]:
    """Default first, then numbers ascending, switches off before on, choices as the knob lists them."""
    spec = KNOBS[knob]
    if spec.kind == "int" and text.isdigit():
        return (1, int(text), "")
    if spec.kind == "bool":
        return (1, float(text == "on"), "")
    if text in spec.choices:
        return (1, spec.choices.index(text), "")
    return (0, 0, text)


def importance(rows: Sequence[Row], metric: Metric) -> Importance:
    """Each varying knob's share of the metric's variance, by fANOVA on the measured trials."""
    used = [r for r in rows if metric in r.values]
    knobs = varying(used)
    if len(used) < MIN_IMPORTANCE_TRIALS or not knobs:
        return Importance(metric, (), len(used), f"needs at least {MIN_IMPORTANCE_TRIALS} measured trials that "
                                                 f"differ in a knob (this study has {len(used)})")
    if len({r.values[metric] for r in used}) == 1:
        return Importance(metric, (), len(used), "every measured trial gave the same value")
    found = _fanova(used, knobs, metric)
    ranked = sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))
    return Importance(metric, tuple((k, round(v, 4)) for k, v in ranked), len(used))


def _fanova(rows: Sequence[Row], knobs: Sequence[str], metric: Metric) -> dict[str, float]:
    """fANOVA over an in-memory copy where every knob is a categorical of its values as text."""
    distributions: dict[str, BaseDistribution] = {k: CategoricalDistribution(_values_of(rows, k)) for k in knobs}
    with storage.quiet_optuna(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        copy = optuna.create_study()
        copy.add_trials([optuna.trial.create_trial(params={k: r.knobs[k] for k in knobs},
                                                   distributions=distributions, value=r.values[metric])
                         for r in rows])
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=IMPORTANCE_SEED)
        return optuna.importance.get_param_importances(copy, evaluator=evaluator, normalize=True)


def _values_of(rows: Sequence[Row], knob: str) -> list[str]:
    return sorted({r.knobs[knob] for r in rows}, key=lambda v: value_order(knob, v))


def marginals(rows: Sequence[Row], metric: Metric) -> list[Marginal]:
    """For each varying knob, the metric of every measured trial grouped by that knob's value."""
    used = [r for r in rows if metric in r.values]
    found = []
    for knob in varying(used):
        groups: dict[str, list[float]] = {}
        for r in used:
            groups.setdefault(r.knobs[knob], []).append(r.values[metric])
        found.append(Marginal(knob, metric, tuple((v, tuple(groups[v])) for v in _values_of(used, knob))))
    return found
