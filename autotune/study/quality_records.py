"""What a trial records of how well it answers and of the study's limits: its quality on the user's
data (keyed by what decides the answers, so a configuration alike in them is not judged twice),
speed against quality, how far its figures are over the limits (Optuna constraints), and the models
that failed the guard (wrong answers: no other configuration of them is proposed)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import ConfigError
from autotune.config.knobs import Config
from autotune.measure import quality
from autotune.measure.objectives import Limits
from autotune.measure.plan import model_knobs
from autotune.study.records import HOST_CLASS, QUALITY, QUALITY_KEY, WRONG_ANSWERS, is_duplicate


def quality_key(config: Config, batch: int) -> str:
    """What a quality figure belongs to: the model knobs (what the model computes; threads, allocators
    and instances change only how fast) and the batch size (int8 calibrates on batches of it)."""
    return json.dumps({"knobs": asdict(model_knobs(config)), "batch_size": batch}, sort_keys=True)


def known_quality(study: optuna.Study, key: str) -> dict[str, Any] | None:
    """The quality an earlier trial of the study measured for `key` (one without an error)."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        found = t.user_attrs.get(QUALITY)
        if t.user_attrs.get(QUALITY_KEY) == key and isinstance(found, dict) and "error" not in found:
            return found
    return None


def record_quality(trial: optuna.Trial, key: str, found: Mapping[str, Any]) -> None:
    trial.set_user_attr(QUALITY, dict(found))
    trial.set_user_attr(QUALITY_KEY, key)


def quality_front(study: optuna.Study) -> list[FrozenTrial]:
    """Speed against quality: the completed trials (own measurements) with a quality figure that no
    other is both faster than (by the study's first objective) and of a smaller drop, fastest first."""
    maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    judged = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        drop = quality.drop_of(t.user_attrs.get(QUALITY))
        if drop is not None and t.values and not is_duplicate(t):
            judged.append((-t.values[0] if maximize else t.values[0], drop, t))
    judged.sort(key=lambda row: (row[0], row[1]))
    front, least = [], float("inf")
    for _, drop, t in judged:
        if drop < least:
            front.append(t)
            least = drop
    return front


def limit_figures(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The figures that limits bound, from a trial's summary or user attributes."""
    return {"latency_p90_ms": summary.get("latency_p90_ms"),
            "tpot_p90_ms": (summary.get("generation") or {}).get("tpot_p90_ms"),
            "quality_drop": quality.drop_of(summary.get("quality"))}


def record_limits(trial: optuna.Trial, limits: Limits, summary: Mapping[str, Any]) -> None:
    """How far a completed trial's figures (its summary) are over the study's limits, each as an
    Optuna constraint (`latency_p90_over_limit_ms`, `tpot_p90_over_limit_ms`) mirrored in user
    attributes (optuna-dashboard 0.21 does not show Optuna 5 constraints), and `feasible`.
    Duplicates are recorded too: a trial without constraints reads as feasible."""
    over = limits.over(limit_figures(summary))
    for figure, excess in over.items():
        name = limits.constraint(figure)
        trial.set_constraint(name, excess)
        trial.set_user_attr(f"constraint_{name}", round(excess, 4))
    if over:
        trial.set_user_attr("feasible", all(excess <= 0 for excess in over.values()))


def model_of(config: Config, batch: int) -> tuple[str, int]:
    """(what decides its answers, batch size): configurations alike in both answer alike
    (`ModelKnobs.answers`)."""
    return model_knobs(config).answers, batch


def short_on_quality(trials: Sequence[FrozenTrial], digest: str, klass: str) -> dict[tuple[str, int], int]:
    """`model_of` each model that fell short on quality on this host class under these settings, and
    the first trial that showed it: it gave wrong answers (the guard), or its drop on the user's data
    was over --max-quality-drop. What a remedy knob (`Knob.remedy`: int8_fallback) is proposed for."""
    found = dict(wrong_models(trials, digest, klass))
    over = Limits.constraint("quality_drop")
    for trial in sorted(trials, key=lambda t: t.number):
        attrs = trial.user_attrs
        excess = attrs.get(f"constraint_{over}")
        if (not isinstance(excess, (int, float)) or excess <= 0 or attrs.get("settings_digest") != digest
                or attrs.get(HOST_CLASS, klass) != klass):
            continue
        try:
            config = Config.from_description(str(attrs.get("config")))
        except ConfigError:
            continue
        found.setdefault(model_of(config, int(attrs.get("batch_size", 0))), trial.number)
    return found


def wrong_models(trials: Sequence[FrozenTrial], digest: str, klass: str) -> dict[tuple[str, int], int]:
    """`model_of` each model that gave wrong answers on this host class under these settings (the
    tolerance, the calibration), and the first trial that showed it: a search proposes no other
    configuration of it, as every process running it gets the same verdict."""
    found: dict[tuple[str, int], int] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        attrs = trial.user_attrs
        if (trial.state != TrialState.FAIL or not attrs.get(WRONG_ANSWERS) or attrs.get("settings_digest") != digest
                or attrs.get(HOST_CLASS, klass) != klass):
            continue
        try:
            config = Config.from_description(str(attrs.get("config")))
        except ConfigError:  # a knob this autotune no longer knows
            continue
        found.setdefault(model_of(config, int(attrs.get("batch_size", 0))), trial.number)
    return found
