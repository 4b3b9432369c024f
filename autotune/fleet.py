"""A study shared by many workers (machines on one PostgreSQL study): the host class a study is
for, each host's own baseline, and what other workers are measuring right now.

A study is for one host class (`machine.host_class`): a worker of another class is refused, unless
`--allow-mixed`. Every host measures PyTorch's defaults before its first trial (the host that runs
the study's baseline trial uses that one), and every trial's speedup is over its own host's
baseline, so that host-to-host spread does not read as a knob's effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.machine import class_id
from autotune.replicates import Measurement
from autotune.storage import StudyError

CLASS_ATTR = "host_class"  # on the study: the class it is for; on a trial: its host's class id
HOST_BASELINE = "host_baseline:"  # + host name, on the study: that host's own baseline
REFERENCE_KEYS = ("latency_p50_ms", "throughput_ips")
Identity = tuple[str, int]


def claim_class(study: optuna.Study, host_class: Mapping[str, Any], allow_mixed: bool) -> list[str]:
    """A new study records this host's class; an existing one refuses a host of another class
    (one line: a study per class, or --allow-mixed). Returns notes."""
    recorded = study.user_attrs.get(CLASS_ATTR)
    if recorded is None:
        study.set_user_attr(CLASS_ATTR, dict(host_class))
        return []
    differ = [key for key in host_class if recorded.get(key) != host_class[key]]
    if not differ:
        return []
    key = differ[0]
    if allow_mixed:
        return [f"this host's class differs from study {study.study_name}'s ({key}); --allow-mixed ranks them "
                f"together, each trial's speedup over its own host's baseline"]
    raise StudyError(f"this host is not of the class study {study.study_name!r} is for ({key}: {host_class[key]} "
                     f"here, {recorded.get(key)} in the study); start a study per host class, e.g. --study "
                     f"{study.study_name}-{class_id(dict(host_class))}, or pass --allow-mixed")


def host_baseline(study: optuna.Study, host: str) -> dict[str, float] | None:
    """This host's own baseline (p50 latency, throughput), or None before it measured one."""
    recorded = study.user_attrs.get(HOST_BASELINE + host)
    if recorded is not None:
        return {key: float(recorded[key]) for key in REFERENCE_KEYS}
    ran = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
           if t.user_attrs.get("baseline") and t.user_attrs.get("host") == host]
    return {key: float(ran[0].user_attrs[key]) for key in REFERENCE_KEYS} if ran else None


def record_host_baseline(study: optuna.Study, host: str, measurement: Measurement) -> dict[str, float]:
    summary = measurement.summary()
    reference = {key: float(summary[key]) for key in REFERENCE_KEYS}
    study.set_user_attr(HOST_BASELINE + host, reference)
    return reference


def in_flight(study: optuna.Study, digest: str) -> set[Identity]:
    """(config, batch size) of the trials other workers are measuring now under these settings: a
    proposal treats them as measured."""
    return {(str(t.user_attrs["config"]), int(t.user_attrs.get("batch_size", 0)))
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.user_attrs.get("settings_digest") == digest and "config" in t.user_attrs
            and not t.user_attrs.get("baseline")}


def baseline_taken(study: optuna.Study, klass: str) -> bool:
    """The study's baseline trial for this host class has run or is running (exactly one runs)."""
    return any(t.user_attrs.get("baseline") and t.user_attrs.get(CLASS_ATTR, klass) == klass
               for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)))
