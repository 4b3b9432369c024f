"""`autotune studies`: one row per study, an unreadable database one row saying why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from optuna.trial import TrialState

from autotune.cli.display import JSON_SCHEMA_VERSION
from autotune.host.machine import Machine
from autotune.search import loop, opening
from autotune.study import records, storage
from tests.support.cli import run_cli
from tests.support.databases import damage_pages, hold_lock
from tests.support.studies import fake_runner, request


def searched(tmp_path: Path, here: Machine, trials: int, **kw: object) -> str:
    opened = opening.open_search(request(tmp_path, trials, **kw), here)
    loop.run_search(opened, here, lambda e: None, runner=fake_runner)
    return opened.name


def test_each_study_is_a_row_with_its_best_and_host(tmp_path: Path, here: Machine,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    latency = searched(tmp_path, here, 4)
    throughput = searched(tmp_path, here, 2, objective="throughput")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "studies", "--json")
    doc = json.loads(out)
    assert (code, err, doc["kind"], doc["schema_version"]) == (0, "", "studies", JSON_SCHEMA_VERSION)
    rows = {row["name"]: row for row in doc["studies"]}
    assert set(rows) == {latency, throughput}
    row = rows[latency]
    assert (row["model"], row["objective"], row["batch_size"], row["error"]) == ("resnet18", "latency", 1, "")
    study = storage.load(latency, row["storage"])
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    best = min(complete, key=lambda t: t.values[0])
    assert row["trials"] == {"complete": len(complete), "total": len(study.trials)}  # a crash's rerun too
    assert records.finished(study) == 4
    assert row["best"] == {"trial": best.number, "value": best.values[0], "unit": "ms",
                           "speedup": best.user_attrs["speedup_latency"], "quality_drop": None, "quality_unit": None,
                           "quality_front": 0}  # searched without --eval-data
    assert row["confirmation"] is None
    assert row["host"] == study.user_attrs["host"] and row["host"]["usable_physical_cores"] == 8
    assert rows[throughput]["best"]["unit"] == "items/s"
    code, out, _ = run_cli(capsys, "studies")
    assert f"{study.user_attrs['host']['cpu_model']}, 8 cores" in out
    shown = f"trial {best.number}: {best.values[0]:.2f} ms ({best.user_attrs['speedup_latency']:.2f}x)"
    assert code == 0 and latency in out and shown in out and "not yet" in out


def test_a_damaged_or_locked_database_is_one_row_saying_so(tmp_path: Path, here: Machine,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    good = searched(tmp_path, here, 2)
    damaged = searched(tmp_path, here, 6, study="damaged")
    locked = searched(tmp_path, here, 1, study="locked")
    damage_pages(tmp_path / "studies" / f"{damaged}.db")
    monkeypatch.chdir(tmp_path)
    holder = hold_lock(tmp_path / "studies" / f"{locked}.db", 30)
    try:
        code, out, _ = run_cli(capsys, "studies", "--json")
    finally:
        holder.kill()
        holder.wait()
    rows = {row["name"]: row for row in json.loads(out)["studies"]}
    assert code == 0 and rows[good]["error"] == ""
    assert rows[damaged]["error"].startswith(f"the study database {tmp_path.resolve()}/studies/damaged.db is damaged")
    assert "is locked by another process" in rows[locked]["error"]


def test_an_empty_folder_says_how_to_make_a_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "studies") == (0, "no studies in studies/; make one with `autotune search --model "
                                             "resnet18 --trials 20`\n", "")
    assert json.loads(run_cli(capsys, "studies", "--json")[1])["studies"] == []


def test_one_storage_lists_the_studies_it_holds(tmp_path: Path, here: Machine,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    name = searched(tmp_path, here, 1)
    url = f"sqlite:///{tmp_path / 'studies' / name}.db"
    code, out, _ = run_cli(capsys, "studies", "--storage", url, "--json")
    assert code == 0 and [(r["name"], r["storage"]) for r in json.loads(out)["studies"]] == [(name, url)]
