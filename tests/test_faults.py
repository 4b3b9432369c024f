"""Every fault autotune must survive: a locked or damaged study, signals, killed processes,
crashing, hanging and out-of-memory children, hostile values in what it exports, bad inputs."""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from optuna.trial import TrialState

from autotune import export, orchestrate, records, search_loop, storage, tempdirs
from autotune.errors import Interrupted
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


PLAIN_ENV = """# autotune configuration: hand-written for a test
export AUTOTUNE_INSTANCES='1'
export AUTOTUNE_BINDING='none'
export AUTOTUNE_INSTANCE_CPUS=''
export AUTOTUNE_INSTANCE_NUMA_NODES=''
"""
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))


def start_run(tmp_path: Path, pidfile: Path) -> subprocess.Popen[str]:
    """`autotune run` of a program that writes its pid and sleeps, with its own TMPDIR."""
    env_file = tmp_path / "plain.env"
    env_file.write_text(PLAIN_ENV)
    program = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    proc = subprocess.Popen([AUTOTUNE, "run", str(env_file), "--", sys.executable, "-c", program],
                            env={**os.environ, "TMPDIR": str(tmp_path)}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    return proc


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("signum", "code", "line"), [
    (signal.SIGINT, 130, "Interrupted by the user (Ctrl-C): every benchmark process was stopped."),
    (signal.SIGTERM, 143, "Interrupted by SIGTERM (asked to stop): every benchmark process was stopped."),
    (signal.SIGHUP, 129, "Interrupted by SIGHUP (the terminal closed): every benchmark process was stopped."),
])
def test_a_signal_exits_128_plus_it_and_says_which(tmp_path: Path, signum: int, code: int, line: str) -> None:
    pidfile = tmp_path / "child.pid"
    proc = start_run(tmp_path, pidfile)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code
    assert err.strip().splitlines() == [line]  # click starts a new line after a ^C
    assert gone_within(int(pidfile.read_text()), 1.0)
    assert not list(tmp_path.glob("autotune-*"))


def test_kill_9_takes_the_children_along_and_the_next_start_removes_its_folder(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    proc = start_run(tmp_path, pidfile)
    left = list(tmp_path.glob(f"autotune-apply-{proc.pid}-*"))
    assert len(left) == 1
    proc.kill()
    proc.communicate()
    assert gone_within(int(pidfile.read_text()), 1.0)
    assert left[0].is_dir()
    subprocess.run([AUTOTUNE, "knobs"], env={**os.environ, "TMPDIR": str(tmp_path)}, check=True,
                   capture_output=True)
    assert not left[0].exists()


def test_only_folders_of_dead_owners_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    mine = tmp_path / tempdirs.prefix("run")
    orphan = tmp_path / f"autotune-run-{dead.stdout.strip()}-x1"
    other = tmp_path / f"autotune-artifact-{dead.stdout.strip()}-x2"
    for folder in (mine, orphan, other):
        (folder / "inside").mkdir(parents=True)
    assert tempdirs.remove_orphans(tmp_path) == [orphan]
    assert mine.is_dir() and other.is_dir() and not orphan.exists()


def test_run_plan_names_its_folder_after_its_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_runner import plan_of

    prefixes = []
    real = tempfile.TemporaryDirectory

    def spy(*args: Any, **kw: Any) -> Any:
        prefixes.append(kw.get("prefix"))
        return real(*args, **kw)

    monkeypatch.setattr(orchestrate.tempfile, "TemporaryDirectory", spy)
    assert orchestrate.run_plan(plan_of("ok"), 30).ok
    assert prefixes == [f"autotune-run-{os.getpid()}-"]


@pytest.mark.parametrize(("stop", "reason"), [
    (KeyboardInterrupt(), "interrupted by the user (Ctrl-C)"),
    (Interrupted(signal.SIGTERM), "interrupted by SIGTERM (asked to stop)"),
    (Interrupted(signal.SIGHUP), "interrupted by SIGHUP (the terminal closed)"),
])
def test_an_interrupted_trial_records_what_stopped_it_and_runs_again(
        tmp_path: Path, here: Machine, stop: KeyboardInterrupt, reason: str) -> None:
    calls = []

    def interrupted(plan: LaunchPlan, timeout_s: float) -> RunResult:
        calls.append(plan)
        if len(calls) == 2:
            raise stop
        return fake_runner(plan, timeout_s)

    opened = search_loop.open_search(request(tmp_path, 2, seed=3), here)
    with pytest.raises(KeyboardInterrupt):
        search_loop.run_search(opened, here, lambda e: None, runner=interrupted)
    cut = opened.study.get_trials()[-1]
    assert (cut.state, cut.user_attrs["fail_reason"]) == (TrialState.FAIL, reason)
    assert records.same_config(opened.study, 99, cut.user_attrs["config"], 1) is None


def test_export_unsets_only_what_a_knob_can_set(tmp_path: Path, here: Machine) -> None:
    opened = search_loop.open_search(request(tmp_path, 2), here)
    search_loop.run_search(opened, here, lambda e: None, runner=fake_runner)
    trial = copy.deepcopy(export.pick_trial(opened.study, 0))
    plan = trial.user_attrs["plan"]
    plan["cleared"] = ["OMP_SCHEDULE", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TORCH_SHOW_CPP_STACKTRACES"]
    trial.user_attrs = {**trial.user_attrs, "plan": plan}
    unset = [line for line in export.render(opened.study, trial).splitlines() if line.startswith("unset ")]
    assert unset == [f"unset {' '.join(export.TUNING_VARS)} {' '.join(export.OPTIONAL_VARS)}"]
