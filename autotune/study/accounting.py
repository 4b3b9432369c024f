"""What a study's searches cost, over all their sessions (the study's `accounting`): wall time,
the timed share of it, where the rest went, and the trials it bought.

The trials' own records (durations, fail causes, skips) are `records`'; this module only adds them up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.measure.replicates import setup_split
from autotune.measure.results import InstanceResult
from autotune.study.records import (
    FINISHED,
    UNDECIDED,
    counted,
    distinct_configs,
    fail_cause,
    is_duplicate,
    not_compiled,
)


def account(study: optuna.Study, session_s: float) -> dict[str, Any]:
    """What the study's searches cost and measured, over all their sessions: wall time, timed
    seconds (the windows samples were taken in; a duplicate's reused ones once), their ratio,
    distinct configurations, the trials that count toward --trials, those pruned before
    compiling (which do not) and the attempts stopped on a noisy window (undecided), and counted
    trials per hour. Stored as the study's `accounting`."""
    before = study.user_attrs.get("accounting", {})
    wall = float(before.get("wall_s", 0.0)) + session_s
    trials = study.get_trials(deepcopy=False, states=FINISHED)
    timed = sum(float(t.user_attrs.get("timed_s", 0.0)) for t in trials if not is_duplicate(t))
    number = len(counted(trials))
    accounting = {"wall_s": round(wall, 2), "timed_s": round(timed, 2),
                  "efficiency": round(timed / wall, 3) if wall else 0.0,
                  "breakdown": breakdown(trials, wall),
                  "distinct_configurations": distinct_configs(study), "trials": number,
                  "not_compiled": not_compiled(trials),
                  "undecided": sum(fail_cause(t) == UNDECIDED for t in trials),
                  "trials_per_hour": round(number / wall * 3600, 1) if wall else 0.0,
                  "sessions": int(before.get("sessions", 0)) + 1}
    study.set_user_attr("accounting", accounting)
    return accounting


def breakdown(trials: Sequence[FrozenTrial], wall_s: float) -> dict[str, float]:
    """Where a study's search wall time went, in seconds: building (loading, converting, compiling)
    and warming up the measuring processes, their timed windows, the attempts that decided nothing
    (undecided: their whole measuring wall, measured again later), and the rest (process starts,
    quality judging, the sampler, the database). A duplicate reuses another trial's and counts nothing."""
    measured = [t for t in trials if not is_duplicate(t) and "measure_wall_s" in t.user_attrs]
    wasted = [t for t in measured if fail_cause(t) == UNDECIDED]
    decided = [t for t in measured if fail_cause(t) != UNDECIDED]

    def total(key: str, among: Sequence[FrozenTrial]) -> float:
        return sum(float(t.user_attrs.get(key) or 0.0) for t in among)

    set_up = [_set_up(t) for t in decided]
    parts = {"build_s": sum(b for b, _ in set_up), "warmup_s": sum(w for _, w in set_up),
             "timed_s": total("timed_s", decided), "undecided_s": total("measure_wall_s", wasted)}
    parts["other_s"] = max(wall_s - sum(parts.values()), 0.0)
    return {key: round(value, 1) for key, value in parts.items()}


def _set_up(trial: FrozenTrial) -> tuple[float, float]:
    """(building, warming up) seconds of a trial's measuring processes, as the trial recorded them;
    a trial recorded before trials did (a study an older autotune ran) has them read from the
    set-up records of its last run's instances, the slowest one's (`setup_split`'s rule): one
    process's, so that such a trial measured in several processes counts the last alone."""
    attrs = trial.user_attrs
    if "build_s" in attrs or "warmup_s" in attrs:
        return float(attrs.get("build_s") or 0.0), float(attrs.get("warmup_s") or 0.0)
    instances = [InstanceResult(0, True, "", 0, "", {"setup": i.get("setup") or {}})
                 for i in attrs.get("instances") or () if isinstance(i, dict)]
    return max((setup_split(i) for i in instances), default=(0.0, 0.0))


def wall_per_trial(study: optuna.Study) -> float | None:
    """Wall seconds per finished trial over the study's earlier searches (None before any)."""
    before = study.user_attrs.get("accounting", {})
    trials = int(before.get("trials", 0))
    return float(before["wall_s"]) / trials if trials and "wall_s" in before else None
