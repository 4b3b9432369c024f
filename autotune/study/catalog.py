"""`autotune studies`: every study under studies/ (or in one storage), one row each, read without
changing anything. A database that cannot be read (damaged, locked) is a row saying so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from autotune.measure import quality
from autotune.measure.objectives import metric_of, speedup_attr, unit_of
from autotune.study import confirmations, quality_records, records, storage
from autotune.study.storage import SQLITE, StudyError


def studies(studies_dir: Path, url: str | None = None) -> list[dict[str, Any]]:
    """A row per study in the storage `url`, or in each `*.db` under `studies_dir`."""
    if url is not None:  # named by the user: one that cannot be read is an error, not a row
        if "://" not in url:
            raise StudyError(f"--storage {url!r} is not a storage URL; use e.g. sqlite:///studies/NAME.db")
        return _read(url)
    return [row for db in sorted(studies_dir.glob("*.db")) for row in _rows(f"{SQLITE}{db.resolve()}")]


def _rows(url: str) -> list[dict[str, Any]]:
    try:
        return _read(url)
    except StudyError as exc:
        return [{"name": _stem(url), "storage": storage.shown(url), "error": str(exc)}]


def _read(url: str) -> list[dict[str, Any]]:
    storage.check_existing(url)
    storage.check_intact(url)
    with storage.storage_errors(url):
        names = optuna.get_all_study_names(url)
        return [row(storage.load(name, url), url) for name in names]


def _stem(url: str) -> str:
    return Path(url[len(SQLITE):]).stem if url.startswith(SQLITE) else url


def row(study: optuna.Study, url: str) -> dict[str, Any]:
    """What a study was made for, how far it got, its best trial and whether that was confirmed."""
    attrs = study.user_attrs
    trials = study.get_trials(deepcopy=False)
    return {"name": study.study_name, "storage": storage.shown(url), "error": "", "model": attrs.get("model"),
            "objective": attrs.get("objective"), "batch_size": attrs.get("batch_size"),
            "trials": {"complete": sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials),
                       "total": len(trials)},
            "best": _best(study), "confirmation": verdict(attrs.get("confirmation"), confirmations.count(attrs)),
            "host": attrs.get("host", {})}


def _best(study: optuna.Study) -> dict[str, Any] | None:
    best = records.best_trials(study)
    if not best:
        return None
    objective = str(study.user_attrs.get("objective", "latency"))
    judged = best[0].user_attrs.get(records.QUALITY)
    return {"trial": best[0].number, "value": best[0].values[0], "unit": unit_of(metric_of(objective)),
            "speedup": records.speedup(best[0], speedup_attr(objective), study.user_attrs),
            "quality_drop": quality.drop_of(judged), "quality_unit": (judged or {}).get("unit"),
            "quality_front": len(quality_records.quality_front(study))}


def verdict(confirmation: dict[str, Any] | None, count: int = 1) -> dict[str, Any] | None:
    """The latest confirmation in a word (`confirmed`: a candidate won; `baseline`: none did), its
    outcome against the baseline (beats, slower, equivalent, undecided: the closest candidate's when
    none won), and which of the study's `count` confirmations it is."""
    if not confirmation:
        return None
    return {"word": "confirmed" if confirmation["significant"] else "baseline",
            "winner_trial": confirmation["winner_trial"], "speedup": confirmation.get("speedup"),
            "recommended_trial": confirmations.recommended(confirmation),
            "against_recipe": _versus(confirmation.get("against_recipe")),
            "against_peer": _versus(confirmation.get("against_peer")),
            "outcome": confirmation.get("outcome"), "decided": confirmation.get("decided"),
            "rounds": confirmation.get("rounds"), "number": int(confirmation.get("number", 1)), "of": count}


def _versus(found: dict[str, Any] | None) -> dict[str, Any] | None:
    """The winner against a reference (the best expert recipe or the best peer) in a few fields."""
    return None if not found else {k: found.get(k) for k in ("trial", "recipe", "status", "speedup")}
