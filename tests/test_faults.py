"""Every fault autotune must survive: a locked or damaged study, signals, killed processes,
crashing, hanging and out-of-memory children, hostile values in what it exports, bad inputs."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import sqlalchemy.exc
from optuna.trial import TrialState

from autotune.base import tempdirs
from autotune.base.errors import Interrupted
from autotune.deploy import export, user_run
from autotune.host.libs import Libraries
from autotune.host.machine import Machine
from autotune.measure import runner
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import PlanRunner, ReplicatePolicy
from autotune.measure.results import RunResult
from autotune.search import loop, opening
from autotune.study import records, storage
from tests.conftest import FIXTURES, lscpu
from tests.support import envs
from tests.support.cli import AUTOTUNE, run_cli
from tests.support.databases import damage_pages, hold_lock
from tests.support.plans import FAKE_WORKER, plan_of
from tests.support.studies import SPACE, fake_runner, request


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
    opened = opening.open_search(request(tmp_path, 3, replicates=_one()), here)
    db = tmp_path / "studies" / f"{opened.name}.db"
    holders: list[subprocess.Popen[str]] = []
    loop.run_search(opened, here, lambda e: None, runner=locking_runner(db, 6.5, 2, holders))
    assert holders[0].wait(timeout=10) == 0
    trials = opened.study.get_trials()
    assert len(trials) == 3
    for trial in trials:  # each recorded what its run measured (the fake crashes mkldnn=on)
        assert (trial.state, trial.user_attrs["status"]) in ((TrialState.COMPLETE, "ok"), (TrialState.FAIL, "failed"))
        assert ("latency_p50_ms" in trial.user_attrs
                or trial.user_attrs["fail_reason"] == "instance 0: crashed with SIGSEGV")
    assert capfd.readouterr().err.count(storage.WAITING) == 1


def test_a_lock_past_the_wait_keeps_the_measurement_and_the_next_start_records_it(
        tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "LOCK_WAIT_S", 1.0)
    opened = opening.open_search(request(tmp_path, 3, replicates=_one()), here)
    db = tmp_path / "studies" / f"{opened.name}.db"
    holders: list[subprocess.Popen[str]] = []
    with pytest.raises(storage.StudyLocked) as info:
        loop.run_search(opened, here, lambda e: None, runner=locking_runner(db, 12, 2, holders))
    kept = tmp_path / "studies" / f"{opened.name}.trial-1.unsaved.json"
    assert str(info.value) == (f"the study database {opened.storage} stayed locked by another process for 1 s; "
                               f"trial 1's measurement is kept in {kept}; close what holds the database "
                               "(optuna-dashboard, sqlite3) and rerun the same command")
    saved = json.loads(kept.read_text())
    assert saved["trial"] == 1 and saved["state"] in ("COMPLETE", "FAIL") and saved["runs"]
    assert saved["summary"].get("latency_p50_ms") == (saved["values"] or [None])[0]
    holders[0].kill()
    holders[0].wait()
    again = opening.open_search(request(tmp_path, 3, replicates=_one()), here)
    restored = again.study.get_trials()[1]
    assert restored.state == TrialState[saved["state"]] and not kept.exists()
    assert restored.values == (saved["values"] or None) and restored.user_attrs["restored_from"] == str(kept)
    if saved["state"] == "COMPLETE":
        assert restored.user_attrs["latency_p50_ms"] == saved["summary"]["latency_p50_ms"]
    assert f"trial 1's measurement, kept in {kept} while the study was locked, is recorded now" in again.notes


def _one() -> ReplicatePolicy:
    return ReplicatePolicy(replicates=1, max_extra=0)


@pytest.fixture
def damaged_study(tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch) -> Path:
    opened = opening.open_search(request(tmp_path, 6), here)
    loop.run_search(opened, here, lambda e: None, runner=fake_runner)
    db = tmp_path / "studies" / f"{opened.name}.db"
    damage_pages(db)
    monkeypatch.chdir(tmp_path)
    return db


@pytest.mark.parametrize("command", [
    ["export", "best.env"], ["confirm", "--rounds", "6"], ["compare", "0", "1", "--rounds", "5"],
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


def _full(statement: str) -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError(statement, {}, sqlite3.OperationalError("database or disk is full"))


def test_a_full_disk_under_the_study_is_one_line_said_once(tmp_path: Path) -> None:
    """A second storage failure while the first is handled (a rollback, a cleanup) has that error as
    its context: the line is that error's, not wrapped again (a search that filled its disk printed
    it three times over)."""
    url = f"sqlite:///{tmp_path}/s.db"
    with pytest.raises(storage.StudyError) as caught, storage.storage_errors(url):
        try:
            with storage.storage_errors(url):
                raise _full("INSERT INTO trials")
        except storage.StudyError:
            raise _full("ROLLBACK")  # noqa: B904  (its context: the error above)
    assert str(caught.value) == (
        f"the disk holding the study database {url} is full (database or disk is full); free space there "
        "(`autotune cache` shows what compiled models take, `autotune cache --prune --older-than 1d` removes those "
        "unused for a day) and run again: the trials recorded so far are kept")


PLAIN_ENV = envs.hand_written()


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
    prefixes = []
    real = tempfile.TemporaryDirectory

    def spy(*args: Any, **kw: Any) -> Any:
        prefixes.append(kw.get("prefix"))
        return real(*args, **kw)

    monkeypatch.setattr(runner.tempfile, "TemporaryDirectory", spy)
    assert runner.run_plan(plan_of("ok"), 30).ok
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

    opened = opening.open_search(request(tmp_path, 2, seed=3), here)
    with pytest.raises(KeyboardInterrupt):
        loop.run_search(opened, here, lambda e: None, runner=interrupted)
    cut = opened.study.get_trials()[-1]
    assert (cut.state, cut.user_attrs["fail_reason"]) == (TrialState.FAIL, reason)
    assert records.same_config(opened.study, 99, cut.user_attrs["config"], 1, opened.settings_digest) is None


def test_export_unsets_what_autotune_sets_and_nothing_of_the_shells(tmp_path: Path, here: Machine) -> None:
    opened = opening.open_search(request(tmp_path, 2), here)
    loop.run_search(opened, here, lambda e: None, runner=fake_runner)
    trial = copy.deepcopy(export.pick_trial(opened.study, 0))
    plan = trial.user_attrs["plan"]
    plan["cleared"] = ["OMP_SCHEDULE", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TORCH_SHOW_CPP_STACKTRACES"]
    trial.user_attrs = {**trial.user_attrs, "plan": plan}
    unset = [line for line in export.render(opened.study, trial).splitlines() if line.startswith("unset ")]
    words = unset[0].split()[1:]
    assert len(unset) == 1 and not set(words) & set(plan["cleared"])
    assert set(export.TUNING_VARS) <= set(words) <= {*export.TUNING_VARS, *export.CONFIGURATION_VARS}
    assert "AUTOTUNE_OMP_THREADS" in words and "AUTOTUNE_BACKEND" not in words  # the defaults set only the backend


def test_run_keeps_the_shells_variables_that_source_keeps(tmp_path: Path, here: Machine) -> None:
    opened = opening.open_search(request(tmp_path, 2), here)
    loop.run_search(opened, here, lambda e: None, runner=fake_runner)
    path = tmp_path / "best.env"
    export.write(path, export.render(opened.study, export.pick_trial(opened.study, 0)))
    shell = {"PATH": "/bin", "OPENBLAS_CORETYPE": "Haswell", "TORCH_SHOW_CPP_STACKTRACES": "1",
             "OMP_NUM_THREADS": "64", "LD_PRELOAD": "/x.so"}
    [launch] = user_run.user_launches(export.read(path), ["true"], here.libs, shell)
    sourced = subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in shell.items()), "bash", "-c",
                              f"source {path} && env -0"], capture_output=True, check=True).stdout
    expected = dict(item.split("=", 1) for item in sourced.decode().split("\0") if item and "=" in item)
    for name in ("OPENBLAS_CORETYPE", "TORCH_SHOW_CPP_STACKTRACES", "OMP_NUM_THREADS", "LD_PRELOAD"):
        assert launch.env.get(name) == expected.get(name), name
    assert launch.env["OPENBLAS_CORETYPE"] == "Haswell" and "OMP_NUM_THREADS" not in launch.env

TRAIN_MODE_PT = """
import sys, torch
sys.path.insert(0, sys.argv[2])
import tinynets
m = tinynets.cnn().train()
torch.jit.save(torch.jit.script(m), sys.argv[1])
"""
TINY = FIXTURES / "models"


@pytest.fixture(scope="module")
def train_mode_pt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pt") / "cnn_train.pt"
    subprocess.run([sys.executable, "-W", "ignore", "-c", TRAIN_MODE_PT, str(path), str(TINY)], check=True,
                   capture_output=True)
    return path


def test_a_torchscript_file_saved_in_train_mode_runs_in_eval_mode(train_mode_pt: Path) -> None:
    from autotune.child.sources import load_model

    model = load_model(str(train_mode_pt), "")
    assert not model.training


@pytest.mark.e2e
@pytest.mark.parametrize("knob", ["weight_cache=on", "backend=torchscript"])
def test_a_train_mode_torchscript_file_can_be_frozen(tmp_path: Path, train_mode_pt: Path, knob: str) -> None:
    proc = subprocess.run([AUTOTUNE, "bench", "--model", str(train_mode_pt), "--input-shape", "3x32x32", "--set",
                           knob, "--duration", "0.2", "--warmup-time", "0", "--min-iterations", "3", "--json",
                           "--cache-dir", str(tmp_path / "cache")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["result"]["ok"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, fake_libs_module: Libraries) -> Path:
    """A folder with a finished study, a good env file and damaged copies of it, and odd files."""
    root = tmp_path_factory.mktemp("work")
    here = Machine(lscpu("amd_1s_smt"), fake_libs_module)
    opened = opening.open_search(opening.SearchRequest(
        model="resnet18", trials=4, space=SPACE, studies_dir=root / "studies", seed=0), here)
    loop.run_search(opened, here, lambda e: None, runner=fake_runner)
    good = export.render(opened.study, export.pick_trial(opened.study, 0))
    (root / "good.env").write_text(good)
    for name, old, new in [("lots", "AUTOTUNE_BATCH_SIZE='1'", "AUTOTUNE_BATCH_SIZE='lots'"),
                           ("zero", "AUTOTUNE_BATCH_SIZE='1'", "AUTOTUNE_BATCH_SIZE='0'"),
                           ("binding", "AUTOTUNE_BINDING='none'", "AUTOTUNE_BINDING='magic'"),
                           ("injected", "AUTOTUNE_BINDING='none'", "AUTOTUNE_BINDING=$(touch PWNED)")]:
        assert old in good, old
        (root / f"{name}.env").write_text(good.replace(old, new))
    # the file sets AUTOTUNE_INSTANCE_CPUS already: its value damaged (a second line is refused as a duplicate)
    (root / "cpus.env").write_text(re.sub(r"AUTOTUNE_INSTANCE_CPUS='[^']*'", "AUTOTUNE_INSTANCE_CPUS='0,x'", good))
    for name, line in [("knob", "export AUTOTUNE_ALLOCATOR='mimalloc'"), ("instances", "export AUTOTUNE_INSTANCES='x'"),
                       ("tolerance", "export AUTOTUNE_TOLERANCE='nan'"),
                       ("calibration", "export AUTOTUNE_CALIBRATION_BATCHES='0'")]:
        (root / f"{name}.env").write_text(envs.with_line(good, line))
    (root / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (root / "notenv.txt").write_text("export A=1\n")
    (root / "bad.yaml").write_text("knobs: [unclosed\n")
    (root / "unknown.yaml").write_text("knobs:\n  omp_thread: [1, 2]\n")
    (root / "empty.yaml").write_text("")
    (root / "folder.env").mkdir()
    os.mkfifo(root / "pipe.out")  # renamed over, a pipe (or a device) would be gone
    (root / "empty.db").write_bytes(b"")
    (root / "text.pt").write_text("not a model\n")
    (root / "text.pt2").write_text("not a model\n")
    with contextlib.closing(sqlite3.connect(root / "other.db")) as db:
        db.execute("CREATE TABLE t (x)")
    return root


@pytest.fixture(scope="module")
def fake_libs_module() -> Libraries:
    return Libraries(paths={name: Path(f"/opt/fake/{name}.so") for name in ("libiomp5", "libomp", "jemalloc",
                                                                           "tcmalloc")},
                     numactl=Path("/usr/bin/numactl"), numactl_usable=True, taskset=Path("/usr/bin/taskset"))


R18 = ["--model", "resnet18"]
SEARCH = ["search", *R18, "--trials", "3"]
BAD_INPUTS: list[tuple[list[str], str]] = [
    # plan: the model, knobs, shapes, files
    (["plan"], "Missing option '--model'"),
    (["plan", "--model", "resnet5"], "unknown model 'resnet5'; did you mean resnet50"),
    (["plan", "--model", "x.txt"], "unknown model 'x.txt'"),
    (["plan", "--model", "missing.pt"], "cannot read model file 'missing.pt': No such file or directory"),
    (["plan", "--model", "nosuchmodule:factory"], "no module named 'nosuchmodule'"),
    (["plan", "--model", "text.pt"], "model file 'text.pt' is not one PyTorch saved (not a zip archive); save the "
                                     "model with torch.jit.save (.pt) or torch.export.save (.pt2)"),
    (["bench", "--model", "text.pt2"], "model file 'text.pt2' is not one PyTorch saved (not a zip archive)"),
    (["plan", *R18, "--set", "omp_thread=2"], "unknown knob 'omp_thread'; did you mean omp_threads?"),
    (["plan", *R18, "--set", "allocator=mimalloc"], "allocator=mimalloc is not allowed; use default, jemalloc"),
    (["plan", *R18, "--set", "noequals"], "--set 'noequals' is not KNOB=VALUE"),
    (["plan", *R18, "--set", "=3"], "--set '=3' is not KNOB=VALUE"),
    (["plan", *R18, "--set", "omp_threads=0"], "omp_threads=0"),
    (["plan", *R18, "--set", "omp_threads=abc"], "omp_threads=abc"),
    (["plan", *R18, "--set", "instances=0"], "instances=0"),
    (["plan", *R18, "--set", "precision=fp16"], "precision=fp16 is not allowed; use fp32, bf16"),
    (["plan", *R18, "--set", "backend=inductor", "--set", "mkldnn=on"], "mkldnn applies only with backend=eager"),
    (["plan", *R18, "--set", "kmp_blocktime=5"], "kmp_blocktime"),
    (["plan", *R18, "--batch-size", "0"], "--batch-size 0 is not allowed; use 1 or more"),
    (["plan", *R18, "--batch-size", "-3"], "--batch-size -3 is not allowed; use 1 or more"),
    (["plan", *R18, "--batch-size", "x"], "Invalid value for '--batch-size'"),
    (["plan", *R18, "--input-shape", ""], "--input-shape '' is not a shape"),
    (["plan", *R18, "--input-shape", "3x0x224"], "--input-shape '3x0x224' is not a shape"),
    (["plan", *R18, "--input-shape", "abc"], "--input-shape 'abc' is not a shape"),
    (["plan", *R18, "--input-shape", "3x-1"], "--input-shape '3x-1' is not a shape"),
    (["plan", *R18, "--lscpu", "/nonexistent/lscpu.txt"], "cannot read --lscpu file '/nonexistent/lscpu.txt'"),
    (["plan", *R18, "--lscpu", "binary.bin"], "cannot read --lscpu file 'binary.bin'"),
    (["plan", *R18, "--lscpu", "notenv.txt"], ""),
    (["plan", *R18, "--example-inputs", "/nonexistent/in.pt"], "--example-inputs '/nonexistent/in.pt' is not a file"),
    (["plan", *R18, "--example-inputs", ""], "--example-inputs '' is not a file"),
    (["plan", *R18, "--example-inputs", "binary.bin"], "--example-inputs: cannot load example inputs"),
    (["plan", *R18, "--input-shape", "3x32x32", "--example-inputs", "binary.bin"],
     "give --input-shape or --example-inputs, not both"),
    (["plan", *R18, "--bogus"], "No such option '--bogus'."),
    (["plan", *R18, "extra"], "Got unexpected extra argument (extra)"),
    # bench: the measuring options
    (["bench"], "Missing option '--model'"),
    (["bench", "--model", "resnet5"], "unknown model 'resnet5'"),
    (["bench", *R18, "--tolerance", "-5"], "--tolerance -5 is not a tolerance; give a relative error of 0 or more"),
    (["bench", *R18, "--tolerance", "nan"], "--tolerance nan is not a tolerance"),
    (["bench", *R18, "--tolerance", "inf"], "--tolerance inf is not a tolerance"),
    (["bench", *R18, "--tolerance", "abc"], "Invalid value for '--tolerance'"),
    (["bench", *R18, "--duration", "-1"], "Invalid value for '--duration'"),
    (["bench", *R18, "--duration", "0"], "Invalid value for '--duration'"),
    (["bench", *R18, "--warmup", "-1"], "Invalid value for '--warmup'"),
    (["bench", *R18, "--warmup-time", "-1"], "Invalid value for '--warmup-time'"),
    (["bench", *R18, "--min-iterations", "0"], "Invalid value for '--min-iterations'"),
    (["bench", *R18, "--timeout", "0"], "Invalid value for '--timeout'"),
    (["bench", *R18, "--timeout", "abc"], "Invalid value for '--timeout'"),
    (["bench", *R18, "--cache-dir", "binary.bin"], "Invalid value for '--cache-dir'"),
    (["bench", *R18, "--input-shape", ""], "--input-shape '' is not a shape"),
    (["bench", *R18, "--set", "allocator=x"], "allocator=x is not allowed"),
    (["bench", *R18, "--batch-size", "0"], "--batch-size 0 is not allowed"),
    (["bench", *R18, "--example-inputs", "/nonexistent/in.pt"], "--example-inputs '/nonexistent/in.pt'"),
    # search: the study, the space, the objective
    (["search", *R18], "Missing option '--trials'"),
    ([*SEARCH[:-1], "0"], "--trials 0 is not allowed; use 1 or more"),
    ([*SEARCH[:-1], "-1"], "--trials -1 is not allowed; use 1 or more"),
    ([*SEARCH[:-1], "x"], "Invalid value for '--trials'"),
    ([*SEARCH, "--space", "nosuch"], "no search space 'nosuch'"),
    ([*SEARCH, "--space", "binary.bin"], "cannot read search space binary.bin: not a text file"),
    ([*SEARCH, "--space", "bad.yaml"], "bad.yaml: not valid YAML at line"),
    ([*SEARCH, "--space", "unknown.yaml"], "unknown.yaml"),
    ([*SEARCH, "--space", "empty.yaml"], "empty.yaml: expected a mapping `knobs:`"),
    ([*SEARCH, "--space", "/nonexistent/space.yaml"], "cannot read search space /nonexistent/space.yaml"),
    ([*SEARCH, "--objective", "fastest"], "--objective 'fastest' is not allowed; use latency, throughput or both"),
    ([*SEARCH, "--batch-size", "1,x"], "--batch-size '1,x' is not allowed"),
    ([*SEARCH, "--batch-size", "0"], "--batch-size '0' is not allowed"),
    ([*SEARCH, "--batch-size", ""], "--batch-size '' is not allowed"),
    ([*SEARCH, "--batch-size", "99999999"], "--batch-size 99999999: one batch of 3x224x224 float32 inputs needs "),
    (["plan", *R18, "--batch-size", "99999999"], "--batch-size 99999999: one batch of 3x224x224 float32 inputs"),
    ([*SEARCH, "--study", "a" * 101], "--study is 101 characters long; give a name of at most 100"),
    ([*SEARCH, "--objective", "throughput", "--batch-size", "1,,2"], "--batch-size '1,,2' is not allowed"),
    ([*SEARCH, "--objective", "throughput", "--batch-size", "1,2,"], "--batch-size '1,2,' is not allowed"),
    ([*SEARCH, "--batch-size", "1,2"], "a list of batch sizes is searched only with --objective throughput"),
    ([*SEARCH, "--max-latency-ms", "50"], "--max-latency-ms needs --objective throughput"),
    ([*SEARCH, "--objective", "throughput", "--max-latency-ms", "-1"], "--max-latency-ms needs"),
    ([*SEARCH, "--max-latency-ms", "x"], "Invalid value for '--max-latency-ms'"),
    ([*SEARCH, "--replicates", "0"], "Invalid value for '--replicates'"),
    ([*SEARCH, "--confirm-top", "-1"], "Invalid value for '--confirm-top'"),
    ([*SEARCH, "--confirm-rounds", "3"], "Invalid value for '--confirm-rounds'"),
    ([*SEARCH, "--min-effect", "-0.1"], "Invalid value for '--min-effect'"),
    ([*SEARCH, "--min-effect", "11"], "Invalid value for '--min-effect'"),
    ([*SEARCH, "--tolerance", "-5"], "--tolerance -5 is not a tolerance"),
    ([*SEARCH, "--tolerance", "nan"], "--tolerance nan is not a tolerance"),
    ([*SEARCH, "--study", "bad name!"], "--study 'bad name!' is not a usable name"),
    ([*SEARCH, "--study", ""], "--study '' is not a usable name"),
    ([*SEARCH, "--storage", "notaurl"], "--storage 'notaurl' is not a storage URL"),
    ([*SEARCH, "--storage", "foo://h/db"], "--storage foo://h/db: 'foo' is not a database autotune can use; give "
                                           "sqlite:///PATH.db or postgresql+psycopg://user@host/db"),
    ([*SEARCH, "--storage", "mysql://u:secret@h/db"], "--storage mysql://u:***@h/db needs the Python driver "
                                                      "'MySQLdb', which is not installed; install it"),
    (["studies", "--storage", "sqlite+nope:///x.db"], "--storage sqlite+nope:///x.db: 'sqlite+nope' is not a "
                                                      "database"),
    (["report", "--storage", "postgresql+psycopg2://u@h/db"], "--storage postgresql+psycopg2://u@h/db needs the "
                                                               "Python driver 'psycopg2'"),
    ([*SEARCH, "--input-shape", ""], "--input-shape '' is not a shape"),
    ([*SEARCH, "--seed", "x"], "Invalid value for '--seed'"),
    ([*SEARCH, "--timeout", "0"], "Invalid value for '--timeout'"),
    ([*SEARCH, "--timeout", "nan"], "Invalid value for '--timeout': 'nan' is not a finite number."),
    ([*SEARCH, "--warmup-time", "nan"], "Invalid value for '--warmup-time': 'nan' is not a finite number."),
    ([*SEARCH, "--duration", "inf"], "Invalid value for '--duration': 'inf' is not a finite number."),
    ([*SEARCH, "--min-effect", "nan"], "Invalid value for '--min-effect': 'nan' is not a finite number."),
    ([*SEARCH, "--objective", "throughput", "--max-latency-ms", "nan"],
     "Invalid value for '--max-latency-ms': 'nan' is not a finite number."),
    ([*SEARCH, "--duration", "-1"], "Invalid value for '--duration'"),
    ([*SEARCH, "--example-inputs", "/nonexistent/in.pt"], "--example-inputs '/nonexistent/in.pt'"),
    (["search", "--model", "resnet5", "--trials", "3"], "unknown model 'resnet5'"),
    ([*SEARCH, "--study", "resnet18-bs1-latency", "--batch-size", "2"], "study 'resnet18-bs1-latency' was made for"),
    ([*SEARCH, "--set", "omp_threads=999"], "--set omp_threads=999 is above the"),
    ([*SEARCH, "--set", "backend=magic"], "backend=magic is not allowed"),
    ([*SEARCH, "--set", "kmp_blocktime=0"], "kmp_blocktime applies only with omp_runtime=intel"),
    ([*SEARCH, "--set", "allocator"], "--set 'allocator'"),
    ([*SEARCH, "--study", "resnet18-bs1-latency", "--set", "allocator=default"],
     "study 'resnet18-bs1-latency' was searched with no --set pins, not --set allocator=default"),
    ([*SEARCH, "--time-budget", "20x"], "--time-budget '20x' is not a duration"),
    ([*SEARCH, "--time-budget", "15"], "--time-budget '15' is not a duration; give a positive number with s, m, h"),
    ([*SEARCH, "--time-budget", "0m"], "--time-budget '0m' is not a duration"),
    # confirm
    (["confirm", "--study", "nosuch"], "no study 'nosuch' in studies/"),
    (["confirm", "--rounds", "3"], "Invalid value for '--rounds': 3 is not in the range x>=5."),
    (["confirm", "--top", "0"], "Invalid value for '--top'"),
    (["confirm", "--storage", "notaurl"], "cannot open the study storage notaurl: Could not parse"),
    (["confirm", "--min-effect", "-1"], "Invalid value for '--min-effect'"),
    (["confirm", "--storage", "sqlite:///missing.db"], "no study database at missing.db; "),
    (["confirm", "--min-effect", "nan"], "Invalid value for '--min-effect': 'nan' is not a finite number."),
    (["confirm", "--timeout", "0"], "Invalid value for '--timeout'"),
    (["confirm", "--study", "bad/../name"], "no study 'bad/../name'"),
    # compare
    (["compare", "0"], "Missing argument 'SECOND'"),
    (["compare", "0", "1", "--fail-if-slower", "lots"], "--fail-if-slower 'lots' is not a margin"),
    (["compare", "0", "1", "--fail-if-slower", "5%", "--rounds", "5"], "--rounds 5 can never show a slowdown"),
    (["compare", "defaults", "good.env"], "'defaults' is a configuration; comparing configurations needs --model"),
    (["compare", "defaults", "bogus=1", "--model", "resnet18"], "unknown knob 'bogus'"),
    (["compare", "0", "1", "--study", "nosuch"], "no study 'nosuch' in studies/"),
    (["compare", "0", "99"], "trial 99 of study 'resnet18-bs1-latency' did not complete"),
    (["compare", "a.env", "b.env"], "cannot read env file a.env"),
    (["compare", "notenv.txt", "good.env"], "notenv.txt is not an autotune env file"),
    (["compare", "binary.bin", "good.env"], "cannot read env file binary.bin: not text"),
    (["compare", "good.env", "lots.env"], "lots.env: AUTOTUNE_BATCH_SIZE='lots' is not a batch size"),
    (["compare", "good.env", "knob.env"], "knob.env: allocator=mimalloc is not allowed"),
    (["compare", "good.env", "tolerance.env"], "tolerance.env: AUTOTUNE_TOLERANCE=nan is not a tolerance"),
    (["compare", "good.env", "calibration.env"], "calibration.env: AUTOTUNE_CALIBRATION_BATCHES='0' is not a number"),
    (["compare", "0", "1", "--rounds", "2"], "Invalid value for '--rounds'"),
    (["compare", "0", "1", "--objective", "both"], "--objective 'both' is not allowed; use latency or throughput"),
    (["compare", "0", "1", "--min-effect", "-1"], "Invalid value for '--min-effect'"),
    # export
    (["export"], "Missing argument 'PATH'"),
    (["export", "best.env", "--study", "nosuch"], "no study 'nosuch' in studies/"),
    (["export", "best.env", "--trial", "x"], "Invalid value for '--trial'"),
    (["export", "best.env", "--trial", "99"], "study 'resnet18-bs1-latency' has no trial 99"),
    (["export", "studies", "--trial", "0"], "cannot write studies: it is a directory"),
    (["export", "/nonexistent/dir/best.env", "--trial", "0"], "cannot write /nonexistent/dir/best.env"),
    (["export", "e.env", "--storage", "sqlite:///missing.db", "--study", "x"], "no study database at missing.db; "),
    (["export", "e.env", "--storage", "sqlite:///empty.db"], "empty.db is not a study database (an empty file)"),
    (["export", "e.env", "--study", "x", "--storage", "sqlite:///other.db"],
     "other.db is not a study database (another program's database)"),
    (["export", "pipe.out", "--trial", "0"], "cannot write pipe.out: not a regular file (a device, pipe or socket)"),
    (["export", "best.env", "--storage", "notaurl"], "cannot open the study storage notaurl: Could not parse"),
    (["export", "best.env", "--timeout", "0"], "Invalid value for '--timeout'"),
    (["export", "best.env", "--artifacts", "binary.bin"], "Invalid value for '--artifacts'"),
    # report
    (["report", "--study", "nosuch"], "no study 'nosuch' in studies/"),
    (["report", "-o", "studies"], "cannot write studies: it is a directory; give a file name like report.html"),
    (["report", "-o", "/nonexistent/dir/r.html"], "cannot write /nonexistent/dir/r.html: the folder /nonexistent/dir "
                                                  "does not exist; create it or give -o a path in an existing folder"),
    (["report", "--storage", "notaurl"], "cannot open the study storage notaurl: Could not parse"),
    (["report", "--storage", "sqlite:///empty.db"], "empty.db is not a study database (an empty file)"),
    (["report", "-o", "pipe.out"], "cannot write pipe.out: not a regular file (a device, pipe or socket)"),
    (["report", "--bogus"], "No such option '--bogus'."),
    # profile
    (["profile", "--study", "nosuch"], "no study 'nosuch' in studies/"),
    (["profile", "--trial", "99"], "study 'resnet18-bs1-latency' has no trial 99"),
    (["profile", "--trial", "x"], "Invalid value for '--trial'"),
    (["profile", "good.env", "--trial", "0"], "give ENV_FILE or a study's trial (--trial, --study, --storage), not"),
    (["profile", "good.env", "--study", "resnet18-bs1-latency"], "give ENV_FILE or a study's trial"),
    (["profile", "nosuch.env"], "cannot read env file nosuch.env"),
    (["profile", "notenv.txt"], "notenv.txt is not an autotune env file"),
    (["profile", "knob.env"], "knob.env: allocator=mimalloc is not allowed"),
    (["profile", "folder.env"], "Invalid value for '[ENV_FILE]': File 'folder.env' is a directory."),
    (["profile", "--iterations", "0"], "Invalid value for '--iterations': 0 is not in the range x>=1."),
    (["profile", "--out", "good.env/traces"], "--out 'good.env/traces' is not a writable folder (Not a directory)"),
    (["profile", "good.env", "--out", "binary.bin"], "--out 'binary.bin' is not a writable folder"),
    (["profile", "--storage", "notaurl"], "cannot open the study storage notaurl: Could not parse"),
    (["profile", "--timeout", "0"], "Invalid value for '--timeout'"),
    # run
    (["run"], "Missing argument 'ENV_FILE'"),
    (["run", "good.env"], "Missing argument 'COMMAND...'"),
    (["run", "nosuch.env", "--", "true"], "cannot read env file nosuch.env"),
    (["run", "folder.env", "--", "true"], "Invalid value for 'ENV_FILE'"),
    (["run", "binary.bin", "--", "true"], "cannot read env file binary.bin: not text"),
    (["run", "notenv.txt", "--", "true"], "notenv.txt is not an autotune env file"),
    (["run", "lots.env", "--", "true"], "lots.env: AUTOTUNE_BATCH_SIZE='lots' is not a batch size"),
    (["run", "zero.env", "--", "true"], "zero.env: AUTOTUNE_BATCH_SIZE='0' is not a batch size"),
    (["run", "tolerance.env", "--", "true"], "tolerance.env: AUTOTUNE_TOLERANCE=nan is not a tolerance"),
    (["run", "calibration.env", "--", "true"], "calibration.env: AUTOTUNE_CALIBRATION_BATCHES='0' is not a number"),
    (["run", "knob.env", "--", "true"], "knob.env: allocator=mimalloc is not allowed"),
    (["run", "instances.env", "--", "true"], "instances.env: instances=x is not allowed; use an integer"),
    (["run", "cpus.env", "--", "true"], "cpus.env: AUTOTUNE_INSTANCE_* values are damaged"),
    (["run", "binding.env", "--", "true"], "binding.env: AUTOTUNE_BINDING='magic' is not a binding"),
    (["run", "injected.env", "--", "true"], "injected.env"),
    (["run", "good.env", "--", "no-such-program-here"], "command not found: 'no-such-program-here'"),
    # cache: the flags that only make sense with --prune, ages
    (["cache", "--older-than", "30d"], "--older-than, --include-exported and --dry-run only apply with --prune"),
    (["cache", "--dry-run"], "--older-than, --include-exported and --dry-run only apply with --prune"),
    (["cache", "--prune", "--older-than", "soon"], "--older-than 'soon' is not a duration"),
    (["cache", "--prune", "--older-than", "-3d"], "--older-than '-3d' is not a duration"),
    (["cache", "--cache-dir", "good.env"], "Invalid value for '--cache-dir'"),
    # knobs takes one knob at most, models nothing
    (["knobs", "--bogus"], "No such option '--bogus'."),
    (["knobs", "extra"], "unknown knob 'extra'; knobs are: backend,"),
    (["knobs", "omp_threads", "extra"], "Got unexpected extra argument (extra)"),
    (["models", "extra"], "Got unexpected extra argument (extra)"),
    (["studies", "--storage", "studies/x.db"], "--storage 'studies/x.db' is not a storage URL; use e.g. "
                                               "sqlite:///studies/NAME.db"),
    (["studies", "extra"], "Got unexpected extra argument (extra)"),
    (["studies", "--storage", "sqlite:///missing.db"], "no study database at missing.db; "),
    (["studies", "--storage", "sqlite:///other.db"], "other.db is not a study database"),
    (["studies", "--storage", "postgresql+psycopg://me:secretpw@127.0.0.1:1/db"],
     "cannot open the study storage postgresql+psycopg://me:***@127.0.0.1:1/db: "),
    (["doctor", "--bogus"], "No such option '--bogus'."),
    (["plna"], "No such command 'plna'."),
]


def snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS, ids=[" ".join(a)[:60] for a, _ in BAD_INPUTS])
def test_every_bad_input_is_one_error_line_exit_2_and_writes_nothing(
        workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str],
        message: str) -> None:
    monkeypatch.chdir(workdir)
    before = snapshot(workdir)
    code, out, err = run_cli(capsys, *args)
    assert (code, out) == (2, "")
    assert err.startswith(f"Error: {message}"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert snapshot(workdir) == before


def test_the_bad_input_list_covers_every_command() -> None:
    from autotune.cli.main import cli

    assert len(BAD_INPUTS) >= 90
    assert {args[0] for args, _ in BAD_INPUTS} >= set(cli.commands) - {"doctor", "models"}


OOM_CHILD = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
             "hog = [bytearray(1 << 26) for _ in range(64)]")


def child_plan(*command: str) -> LaunchPlan:
    from autotune.config.knobs import Config
    from autotune.measure.plan import BenchSpec, InstancePlan

    return LaunchPlan(Config(), BenchSpec("fake", (1,)), "none", (InstancePlan(0, (0,), 0, {}, command),))


@pytest.mark.parametrize(("command", "timeout_s", "reason"), [
    ((sys.executable, FAKE_WORKER, "crash-early"), 30, "crashed with SIGSEGV"),
    ((sys.executable, FAKE_WORKER, "hang-late"), 3, "timed out after 3s"),
    ((sys.executable, "-c", OOM_CHILD), 30, "exited with code 1"),
])
def test_a_failing_child_is_a_recorded_failure_and_leaves_nothing(
        command: tuple[str, ...], timeout_s: float, reason: str) -> None:
    result = runner.run_plan(child_plan(*command), timeout_s)
    assert not result.ok and reason in result.reason
    assert not psutil.Process().children(recursive=True)
