"""`autotune search` for real on a small model: the study, resume after Ctrl-C, export, run, and the
real optuna-dashboard serving it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from autotune.study import records
from tests.support.cli import QUICK_SEARCH, autotune

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent


def load(cwd: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{cwd / 'studies' / name}.db")


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    cwd = tmp_path_factory.mktemp("search")
    return cwd, autotune(cwd, "search", *QUICK_SEARCH, "--trials", "4", "--confirm-top", "1", "--confirm-rounds", "5")


def test_search_makes_a_study_whose_trial_zero_is_the_baseline(
        searched: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    cwd, proc = searched
    assert proc.returncode == 0, proc.stderr
    study = load(cwd, "resnet18-bs1-latency")
    trials = study.get_trials()
    assert len(records.counted(trials)) == 4  # more may have run: a stop on a noisy window is measured again
    assert all(records.counts(t) or records.fail_cause(t) == records.UNDECIDED or t.user_attrs.get(records.SKIPPED)
               for t in trials)
    assert trials[0].user_attrs["baseline"] is True and trials[0].params == {}
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert complete and all("latency_p50_ms" in t.user_attrs and "speedup_latency" in t.user_attrs
                            for t in complete)
    assert all("instance_0_command" in t.user_attrs for t in trials if "duplicate_of" not in t.user_attrs)
    assert study.user_attrs["created_by"].startswith("autotune search --model resnet18")
    assert "trial   0 [1/4]" in proc.stderr and "baseline (PyTorch defaults)" in proc.stderr
    assert "Best trials of study resnet18-bs1-latency" in proc.stdout


def test_search_ends_with_a_stored_confirmation(searched: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    cwd, proc = searched
    verdict = load(cwd, "resnet18-bs1-latency").user_attrs["confirmation"]
    assert verdict["rounds"] == 5 and verdict["baseline_trial"] == 0
    assert len(verdict["candidates"]) <= 1
    assert ("Confirmed: " in proc.stdout) == verdict["significant"]
    assert "round 5/5: trial 0 (baseline)" in proc.stderr
    for trial in load(cwd, "resnet18-bs1-latency").get_trials():
        if trial.state == TrialState.COMPLETE and "duplicate_of" not in trial.user_attrs:
            assert trial.user_attrs["replicates"] >= 2
            # the interval is the pooled samples' median's; latency_p50_ms is the replicates' median
            low, high = trial.user_attrs["latency_ci_ms"]
            assert low <= trial.user_attrs["latency_percentiles_ms"][50] <= high
            assert len(trial.user_attrs["latency_percentiles_ms"]) == 101 and "samples_ms" not in trial.user_attrs
            assert "other_cpu_share_max" in trial.user_attrs and "child_cpu_utilization" in trial.user_attrs


def test_compare_two_trials_prints_a_speedup_with_its_interval(
        searched: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    cwd, _ = searched
    other = next(t.number for t in load(cwd, "resnet18-bs1-latency").get_trials()
                 if t.state == TrialState.COMPLETE and t.number > 0)
    proc = autotune(cwd, "compare", "0", str(other), "--rounds", "5")
    assert proc.returncode == 0, proc.stderr
    assert f"trial {other} vs trial 0: " in proc.stdout and "93.8% CI (full range)" in proc.stdout  # 5 rounds
    assert proc.stderr.count("round ") == 10


def test_export_and_run_reproduce_the_best_trial(searched: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    cwd, _ = searched
    proc = autotune(cwd, "export", "best.env")
    assert proc.returncode == 0, proc.stderr
    subprocess.run(["bash", "-n", str(cwd / "best.env")], check=True)
    probe = "import json, os; print(json.dumps({'env': dict(os.environ), 'cpus': sorted(os.sched_getaffinity(0))}))"
    run = autotune(cwd, "run", "best.env", "--", sys.executable, "-c", probe)
    assert run.returncode == 0, run.stderr
    seen = [json.loads(line) for line in run.stdout.splitlines()]
    exported = int((cwd / "best.env").read_text().split("trial ")[1].split()[0])
    plan = load(cwd, "resnet18-bs1-latency").get_trials()[exported].user_attrs["plan"]
    assert len(seen) == len(plan["instances"])
    for inst in plan["instances"]:
        child = next(s for s in seen if s["env"]["AUTOTUNE_INSTANCE_INDEX"] == str(inst["index"]))
        for key, value in inst["env"].items():
            assert child["env"][key] == value
        if plan["binding"] != "none":
            assert child["cpus"] == inst["cpus"]


def test_optuna_dashboard_serves_the_study_with_its_attributes(
        searched: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    cwd, _ = searched
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([str(BIN / "optuna-dashboard"), f"sqlite:///{cwd}/studies/resnet18-bs1-latency.db",
                               "--host", "127.0.0.1", "--port", str(port), "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        studies = _get(port, "/api/studies")["study_summaries"]
        assert [s["study_name"] for s in studies] == ["resnet18-bs1-latency"]
        detail = _get(port, f"/api/studies/{studies[0]['study_id']}")
        assert len(detail["trials"]) == len(load(cwd, "resnet18-bs1-latency").get_trials()) >= 4
        zero = {a["key"]: a["value"] for a in detail["trials"][0]["user_attrs"]}
        assert zero["baseline"] == "True" and zero["config"] == "defaults"
        assert float(zero["latency_p50_ms"]) > 0
        study_attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
        assert json.loads(study_attrs["host"])["physical_cores"] >= 1
    finally:
        server.terminate()
        server.wait(timeout=30)


def _get(port: int, path: str) -> Any:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return json.loads(response.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_resume_after_ctrl_c_loses_nothing_and_leaves_no_running_trial(tmp_path: Path) -> None:
    args = [str(BIN / "autotune"), "search", *QUICK_SEARCH, "--trials", "5", "--study", "resume", "--confirm-top", "0"]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = tmp_path / "studies" / "resume.db"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        # Read the study only once a benchmark runs: the file exists and its schema is complete. Stop
        # it inside a trial (not while a noisy baseline is measured again, which records nothing).
        if db.exists() and _workers(proc.pid) and _finished_so_far(tmp_path) >= 2 and _running(tmp_path):
            break
        time.sleep(0.3)
    workers = _workers(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    time.sleep(0.5)
    assert not [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    before = load(tmp_path, "resume").get_trials()
    assert TrialState.RUNNING not in [t.state for t in before]
    kept = {t.number: (t.state, t.values) for t in before
            if t.state.is_finished() and t.user_attrs.get("fail_reason") != "interrupted by the user (Ctrl-C)"}
    assert len(kept) >= 2
    assert before[-1].user_attrs.get("fail_reason") == "interrupted by the user (Ctrl-C)"
    again = autotune(tmp_path, "search", *QUICK_SEARCH, "--trials", "5", "--study", "resume", "--confirm-top", "0")
    assert again.returncode == 0, again.stderr
    after = load(tmp_path, "resume").get_trials()
    cut_short = [t for t in after if t.user_attrs.get("fail_cause") == "cut_short"]
    # the trial cut short took no trial of --trials; more may have run: a stop on a noisy window is measured again
    assert len(records.counted(after)) == 5 and len(cut_short) == 1 and cut_short[0] not in records.counted(after)
    assert {t.number: (t.state, t.values) for t in after if t.number in kept} == kept
    assert sum(bool(t.user_attrs.get("baseline")) for t in after) == 1


def _finished_so_far(cwd: Path) -> int:
    try:
        return _finished(load(cwd, "resume"))
    except KeyError:  # the file exists, the study is not created yet
        return 0


def _running(cwd: Path) -> bool:
    try:
        return bool(load(cwd, "resume").get_trials(states=(TrialState.RUNNING,)))
    except KeyError:
        return False


def _finished(study: optuna.Study) -> int:
    return len(study.get_trials(states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)))


def _workers(pid: int) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True)
                if "autotune.child.worker" in " ".join(p.cmdline())]
    except psutil.Error:
        return []


def test_bad_space_file_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("knobs:\n  kmp_blocktime: [1]\n")
    proc = autotune(tmp_path, "search", "--model", "resnet18", "--trials", "2", "--space", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"Error: {bad}: knobs.kmp_blocktime: can never be sampled")
    assert proc.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]

