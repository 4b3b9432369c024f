"""A trial's measurement kept beside a study while its database stayed locked (`trial_outcome._unsaved`
writes it), read back whole or refused, and recorded on its trial when the study opens again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.measure.objectives import Limits
from autotune.model import schema
from autotune.model.files import read_text
from autotune.study.quality_records import record_limits
from autotune.study.records import ERROR, WRONG_ANSWERS, record_failure, record_pruned
from autotune.study.storage import StudyError

# What `trial_outcome._unsaved` keeps beside a study while its database stays locked: read only through `kept`.
KEPT = schema.record(
    {"trial": schema.integer, "state": schema.choice("COMPLETE", "PRUNED", "FAIL"),
     "values": schema.list_of(schema.number), "reason": schema.text},
    {"summary": schema.record({}, {"latency_p90_ms": schema.optional(schema.number), "generation": schema.optional(
        schema.record({}, {"tpot_p90_ms": schema.optional(schema.number)}))}),
     "cause": schema.text, WRONG_ANSWERS: schema.flag})


def kept(path: Path) -> dict[str, Any]:
    """A measurement kept aside (`KEPT`); refused in one line naming the file when it cannot be read
    or is not one, so that nothing half of it is recorded."""
    try:
        data = schema.loads(read_text(path), KEPT)
    except (OSError, UnicodeDecodeError, schema.SchemaError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not text" if isinstance(exc, UnicodeDecodeError) \
            else str(exc)
        raise StudyError(f"the measurement kept in {path} cannot be read ({why}); move it out of that folder to "
                         f"resume without it") from None
    return data


def restore_kept(study: optuna.Study, path: Path, limits: Limits) -> int | None:
    """A trial's measurement kept aside while the study was locked, recorded now on that trial if
    it is still RUNNING (then the file is removed); its number, or None when there was nothing to do."""
    data = kept(path)
    frozen = next((t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if t.number == data.get("trial")), None)
    if frozen is None:
        return None
    state = TrialState[data["state"]]
    if state == TrialState.COMPLETE and len(data["values"]) != len(study.directions):
        raise StudyError(f"the measurement kept in {path} holds {len(data['values'])} values for a study of "
                         f"{len(study.directions)} objectives; move it out of that folder to resume without it")
    trial = optuna.Trial(study, frozen._trial_id)
    for key, value in data.get("summary", {}).items():
        trial.set_user_attr(key, value)
    trial.set_user_attr("restored_from", str(path))
    if state == TrialState.FAIL:
        record_failure(trial, data["reason"], data.get("cause", ERROR))
        if data.get(WRONG_ANSWERS) is True:
            trial.set_user_attr(WRONG_ANSWERS, True)
    elif state == TrialState.PRUNED:
        record_pruned(trial, data["reason"])
    else:
        trial.set_user_attr("status", "ok")
        record_limits(trial, limits, data.get("summary", {}))
    study.tell(trial, data["values"] if state == TrialState.COMPLETE else None, state=state)
    path.unlink()
    return frozen.number
