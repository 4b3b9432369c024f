"""Which knobs matter: each measured trial as a row of knob values, fANOVA importance per metric,
and each knob's marginal (the metric grouped by the knob's value), for `autotune report`.

A conditional knob (ort_optimization applies only with backend=onnxruntime, kmp_blocktime only with
Intel OpenMP) is judged on the trials where it applies alone: counted over every trial, its default
in the others would stand in for "not that backend", and it would take the credit for its condition.
So the importance over every trial ranks the knobs that apply in all of them; each conditional knob
gets its share among the trials where it applies, said with that condition, and its marginal plots
those trials only."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
    """A measured trial as the importance and marginals see it: every knob's value as text, and
    whether its condition holds in this trial (`applies`)."""

    trial: int
    knobs: Mapping[str, str]
    values: Mapping[Metric, float]
    applies: Mapping[str, bool] = field(default_factory=dict)  # a knob missing here applies


@dataclass(frozen=True)
class Within:
    """A conditional knob's share of the variance among the trials where it applies."""

    knob: str
    share: float
    trials: int
    where: str  # its condition, as `backend=onnxruntime`


@dataclass(frozen=True)
class Importance:
    metric: Metric
    knobs: tuple[tuple[str, float], ...]  # knobs that apply in every trial, most important first; sum to 1
    trials: int
    note: str = ""  # why there is nothing to show
    within: tuple[Within, ...] = ()  # conditional knobs, each among the trials where it applies


@dataclass(frozen=True)
class Marginal:
    """The objective's values per value of one knob, values in the knob's own order; a conditional
    knob's over the trials where it applies (`where`)."""

    knob: str
    metric: Metric
    groups: tuple[tuple[str, tuple[float, ...]], ...]
    where: str = ""


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
        rows.append(Row(t.number, {k: config.text(k) for k in space}, values,
                        {k: _applies(k, config) for k in space if k in KNOBS}))
    return tuple(rows)


def _applies(knob: str, config: Config) -> bool:
    return all(config.text(other) in allowed for other, allowed in KNOBS[knob].only_when)


def where(knob: str) -> str:
    """A knob's condition as `backend=onnxruntime omp_runtime=intel` ("" for none)."""
    return " ".join(f"{other}={'/'.join(allowed)}" for other, allowed in KNOBS[knob].only_when) \
        if knob in KNOBS else ""


def varying(rows: Sequence[Row]) -> list[str]:
    """Knobs that took more than one value among the rows where they apply, in the space's order."""
    knobs = list(rows[0].knobs) if rows else []
    return [k for k in knobs if len({r.knobs[k] for r in rows if r.applies.get(k, True)}) > 1]


def everywhere(rows: Sequence[Row], knobs: Sequence[str]) -> list[str]:
    """The knobs that apply in every row."""
    return [k for k in knobs if all(r.applies.get(k, True) for r in rows)]


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
    """Each varying knob's share of the metric's variance, by fANOVA: over every measured trial for
    the knobs that apply in all of them, among the trials where it applies for a conditional knob."""
    used = [r for r in rows if metric in r.values]
    knobs = everywhere(used, varying(used))
    if len(used) < MIN_IMPORTANCE_TRIALS or not varying(used):
        return Importance(metric, (), len(used), f"needs at least {MIN_IMPORTANCE_TRIALS} measured trials that "
                                                 f"differ in a knob (this study has {len(used)})")
    if len({r.values[metric] for r in used}) == 1:
        return Importance(metric, (), len(used), "every measured trial gave the same value")
    ranked = sorted(_fanova(used, knobs, metric).items(), key=lambda kv: (-kv[1], kv[0])) if knobs else []
    return Importance(metric, tuple((k, round(v, 4)) for k, v in ranked), len(used),
                      within=_within(used, [k for k in varying(used) if k not in knobs], metric))


def _within(rows: Sequence[Row], conditional: Sequence[str], metric: Metric) -> tuple[Within, ...]:
    """Each conditional knob's share among the rows where it applies (one fANOVA per condition)."""
    found = []
    for condition in dict.fromkeys(where(k) for k in conditional):
        subset = [r for r in rows if all(r.applies.get(k, True) for k in conditional if where(k) == condition)]
        knobs = everywhere(subset, varying(subset))
        if len(subset) < MIN_IMPORTANCE_TRIALS or not knobs or len({r.values[metric] for r in subset}) == 1:
            continue
        shares = _fanova(subset, knobs, metric)
        found += [Within(k, round(float(shares[k]), 4), len(subset), condition)
                  for k in conditional if where(k) == condition and k in shares]
    return tuple(sorted(found, key=lambda w: (-w.share, w.knob)))


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
    """For each varying knob, the metric of every measured trial where it applies, grouped by its value."""
    used = [r for r in rows if metric in r.values]
    found = []
    conditional = set(varying(used)) - set(everywhere(used, varying(used)))
    for knob in varying(used):
        applying = [r for r in used if r.applies.get(knob, True)]
        groups: dict[str, list[float]] = {}
        for r in applying:
            groups.setdefault(r.knobs[knob], []).append(r.values[metric])
        found.append(Marginal(knob, metric, tuple((v, tuple(groups[v])) for v in _values_of(applying, knob)),
                              where(knob) if knob in conditional else ""))
    return found
