"""What a study is for, recorded once when it is created and checked on every resume: the model and
objective it was opened with, the settings it measures under (their digest names a trial's), the
host it ran on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from typing import Any

import optuna

from autotune import __version__
from autotune.config.space_fit import recorded_differs
from autotune.host.machine import Machine, fingerprint, host_name
from autotune.study.storage import StudyError


def host_fingerprint(machine: Machine) -> dict[str, Any]:
    """Where the study was made, for people: the host's name beside what makes timings comparable."""
    import torch

    return {"hostname": host_name(), **fingerprint(machine), "torch": torch.__version__, "autotune": __version__}


def claim(study: optuna.Study, wanted: Mapping[str, Any], space: dict[str, Any],
          description: Mapping[str, Any], other_class: bool = False) -> None:
    """A new study gets what it was made for; an existing one must have been made for the same.
    A host of `other_class` (admitted by --allow-mixed) may search up to its own cores."""
    attrs = study.user_attrs
    if "model" not in attrs:  # new (fleet.claim_class may have written the host class already)
        for key, value in {**wanted, "space": space, **description}.items():
            study.set_user_attr(key, value)
        return
    check_wanted(study, wanted)
    differs = recorded_differs(attrs.get("space", space), space, cores_may_differ=other_class)
    if differs and other_class:
        raise StudyError(f"study {study.study_name!r} cannot take this host's trials: {differs} (--allow-mixed "
                         f"lets only the thread and instance counts follow a host's cores); install what this host "
                         f"lacks, or start a study per host class with another --study name")
    if differs:
        raise StudyError(f"study {study.study_name!r} was made with another search space (or this machine's "
                         f"libraries or cores changed since); use another --study name or the same --space")


def check_wanted(study: optuna.Study, wanted: Mapping[str, Any]) -> None:
    """An existing study must have been made for the same model, batch, objective and pins."""
    attrs = study.user_attrs
    for key, value in wanted.items():
        if attrs.get(key, value) != value:
            raise StudyError(f"study {study.study_name!r} was made for {key}={attrs.get(key)}, not "
                             f"{value}; use another --study name or the same {key}")


def claim_settings(study: optuna.Study, settings: Mapping[str, Any], flags: Mapping[str, str],
                   mixed: Collection[str] = ()) -> list[str]:
    """A study is resumed only under the settings it was measured with; `flags` names the option
    behind each setting, `mixed` those that may differ (a host class `--allow-mixed` lets in). A
    study from before settings were recorded adopts today's, and says so."""
    recorded = study.user_attrs.get("settings")
    if recorded is None:
        study.set_user_attr("settings", dict(settings))
        study.set_user_attr("settings_digest", settings_digest(settings))
        return [f"study {study.study_name} was made before autotune recorded its measurement settings "
                f"(input shape, timing, replicates, tolerance, torch, this machine); it now records today's, "
                f"and its earlier trials are measured again rather than reused"]
    for key, value in json.loads(json.dumps(dict(settings))).items():
        if key in recorded and recorded[key] != value and key not in mixed:
            raise StudyError(f"study {study.study_name!r} was measured with {key}={_shown(recorded[key])}, not "
                             f"{_shown(value)}; use another --study name{_same(key, flags)}")
    return []


def _shown(value: Any) -> str:
    return "the default" if value is None else str(value)


def _same(key: str, flags: Mapping[str, str]) -> str:
    if key in flags:
        return f" or the same {flags[key]}"
    return " (measurements from another machine or torch do not mix)"


def settings_digest(settings: Mapping[str, Any]) -> str:
    """Names the settings a trial was measured under: only a trial with the same digest is reused."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
