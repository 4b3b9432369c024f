"""Every fault autotune must survive: a locked or damaged study, signals, killed processes,
crashing, hanging and out-of-memory children, hostile values in what it exports, bad inputs."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from optuna.trial import TrialState

from autotune import search_loop, storage
from autotune.launch import LaunchPlan
from autotune.libs import Libraries
from autotune.machine import Machine
from autotune.replicates import PlanRunner, ReplicatePolicy
from autotune.results import RunResult
from tests.conftest import lscpu
from tests.test_study import fake_runner, request

HOLD = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


@pytest.fixture
def here(fake_libs: Libraries) -> Machine:
    return Machine(lscpu("amd_1s_smt"), fake_libs)


def hold_lock(db: Path, seconds: float) -> subprocess.Popen[str]:
    """A second process holding BEGIN EXCLUSIVE on the study, as optuna-dashboard or sqlite3 can."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with proc.stdout:
        assert proc.stdout.readline().strip() == "locked"
    return proc


def locking_runner(db: Path, seconds: float, at_call: int, holders: list[subprocess.Popen[str]]) -> PlanRunner:
    """Measures like fake_runner; the `at_call`-th run locks the study as it ends."""
    calls = []

    def run(plan: LaunchPlan, timeout_s: float) -> RunResult:
        calls.append(plan)
        if len(calls) == at_call:
            holders.append(hold_lock(db, seconds))
        return fake_runner(plan, timeout_s)

    return run


def test_a_study_locked_during_a_trial_waits_and_loses_nothing(tmp_path: Path, here: Machine,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    opened = search_loop.open_search(request(tmp_path, 3, replicates=_one()), here)
    db = tmp_path / "studies" / f"{opened.name}.db"
    holders: list[subprocess.Popen[str]] = []
    search_loop.run_search(opened, here, lambda e: None, runner=locking_runner(db, 6.5, 2, holders))
    assert holders[0].wait(timeout=10) == 0
    trials = opened.study.get_trials()
    assert len(trials) == 3
    for trial in trials:  # each recorded what its run measured (the fake crashes mkldnn=on)
        assert (trial.state, trial.user_attrs["status"]) in ((TrialState.COMPLETE, "ok"), (TrialState.FAIL, "failed"))
        assert ("latency_p50_ms" in trial.user_attrs
                or trial.user_attrs["fail_reason"] == "instance 0: crashed with SIGSEGV")
    assert capfd.readouterr().err.count(storage.WAITING) == 1


def test_a_lock_past_the_wait_keeps_the_measurement_and_the_next_start_fails_the_trial(
        tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "LOCK_WAIT_S", 1.0)
    opened = search_loop.open_search(request(tmp_path, 3, replicates=_one()), here)
    db = tmp_path / "studies" / f"{opened.name}.db"
    holders: list[subprocess.Popen[str]] = []
    with pytest.raises(storage.StudyLocked) as info:
        search_loop.run_search(opened, here, lambda e: None, runner=locking_runner(db, 12, 2, holders))
    kept = tmp_path / "studies" / f"{opened.name}.trial-1.unsaved.json"
    assert str(info.value) == (f"the study database {opened.storage} stayed locked by another process for 1 s; "
                               f"trial 1's measurement is kept in {kept}; close what holds the database "
                               "(optuna-dashboard, sqlite3) and rerun the same command")
    saved = json.loads(kept.read_text())
    assert saved["trial"] == 1 and saved["state"] in ("COMPLETE", "FAIL") and saved["runs"]
    assert saved["summary"].get("latency_p50_ms") == (saved["values"] or [None])[0]
    holders[0].kill()
    holders[0].wait()
    again = search_loop.open_search(request(tmp_path, 3, replicates=_one()), here)
    assert [t.state for t in again.study.get_trials()] == [TrialState.COMPLETE, TrialState.FAIL]
    assert again.study.get_trials()[1].user_attrs["fail_reason"].startswith("left running by an autotune process")
    assert any("trial 1 was left running" in note for note in again.notes)


def _one() -> ReplicatePolicy:
    return ReplicatePolicy(replicates=1, max_extra=0)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from autotune.cli import main

    with pytest.raises(SystemExit) as info:
        main(list(args))
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


def damage_pages(db: Path, seed: int = 1, pages: int = 3) -> None:
    """Random bytes over whole pages in the middle of a valid file; the header stays intact."""
    data = bytearray(db.read_bytes())
    size, rng = 4096, random.Random(seed)
    for page in rng.sample(range(2, len(data) // size), pages):
        data[page * size:(page + 1) * size] = rng.randbytes(size)
    db.write_bytes(bytes(data))


@pytest.fixture
def damaged_study(tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch) -> Path:
    opened = search_loop.open_search(request(tmp_path, 6), here)
    search_loop.run_search(opened, here, lambda e: None, runner=fake_runner)
    db = tmp_path / "studies" / f"{opened.name}.db"
    damage_pages(db)
    monkeypatch.chdir(tmp_path)
    return db


@pytest.mark.parametrize("command", [
    ["export", "best.env"], ["confirm", "--rounds", "5"], ["compare", "0", "1", "--rounds", "5"],
    ["search", "--model", "resnet18", "--trials", "8", "--study", "resnet18-bs1-latency"],
    ["export", "best.env", "--storage", "sqlite:///studies/resnet18-bs1-latency.db"],
])
def test_a_study_damaged_in_the_middle_is_one_line_naming_it(
        damaged_study: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    before = damaged_study.read_bytes()
    code, out, err = run_cli(capsys, *command)
    assert code == 2 and out == ""
    named = "studies/" if "--storage" in command else f"{damaged_study.parent.resolve()}/"
    assert err.startswith(f"Error: the study database {named}resnet18-bs1-latency.db is damaged (database disk "
                          "image is malformed: ")
    assert err.endswith("); restore it from a copy or use another --study\n") and err.count("\n") == 1
    assert damaged_study.read_bytes() == before and not Path("best.env").exists()


def test_a_truncated_study_is_damaged_too(damaged_study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    damaged_study.write_bytes(damaged_study.read_bytes()[:5000])
    code, _, err = run_cli(capsys, "export", "best.env")
    assert (code, err) == (2, f"Error: the study database {damaged_study.resolve()} is damaged (database disk "
                              "image is malformed); restore it from a copy or use another --study\n")
