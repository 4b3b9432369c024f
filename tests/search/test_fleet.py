"""One study shared by many workers on a real PostgreSQL server (tests/support/pg.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.host import machine
from autotune.host.libs import Libraries
from autotune.search import fleet, opening
from autotune.study import records, storage
from tests.conftest import ROOT, lscpu
from tests.support.pg import free_port, server
from tests.support.studies import request

WORKER = ROOT / "tests" / "support" / "fleet_worker.py"
FAKE_CLI = ROOT / "tests" / "support" / "fake_cli.py"
QUICK_SPACE = ROOT / "search_spaces" / "quick.yaml"
SCALE_BENCHMARK = ROOT / "benchmarks" / "fleet_scale.py"

# Optuna's storages in this process keep pooled connections that only the garbage collector closes.
pytestmark = [pytest.mark.postgres, pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <function BaseConnection.__del__:pytest.PytestUnraisableExceptionWarning")]


def test_a_study_on_postgresql_is_created_and_loaded_with_heartbeats(pg_url: str) -> None:
    made = storage.create("s", pg_url, [optuna.study.StudyDirection.MINIMIZE], optuna.samplers.RandomSampler(),
                          optuna.pruners.NopPruner())
    made.set_user_attr("model", "m")
    loaded = storage.load("s", pg_url)
    assert loaded.user_attrs == {"model": "m"}
    assert loaded._storage.get_heartbeat_interval() == storage.HEARTBEAT_INTERVAL_S


STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def no_worker_left() -> Iterator[None]:
    """A failed test leaves no worker behind."""
    yield
    while STARTED:
        worker = STARTED.pop()
        if worker.poll() is None:
            worker.kill()
        worker.communicate()


def start_workers(url: str, study: str, trials: int, hosts: list[str], *extra: str) -> list[subprocess.Popen[str]]:
    STARTED.extend(workers := [subprocess.Popen([sys.executable, str(WORKER), url, study, str(trials), *extra],
                             env={**os.environ, machine.TEST_HOST_ENV: host}, stderr=subprocess.PIPE, text=True)
            for host in hosts])
    return workers


def finish(workers: list[subprocess.Popen[str]], timeout_s: float = 120) -> list[tuple[int, str]]:
    return [(w.returncode, err) for w in workers for _, err in [w.communicate(timeout=timeout_s)]]


def measured(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that measured their configuration themselves (not the baseline, not cut short)."""
    return [t for t in study.get_trials() if t.state.is_finished() and not t.user_attrs.get("baseline")
            and records.fail_cause(t) != records.CUT_SHORT and not records.is_duplicate(t)]


def test_three_workers_share_a_study_measuring_no_configuration_twice_and_losing_no_trial(pg_url: str) -> None:
    results = finish(start_workers(pg_url, "fleet", 15, ["w0", "w1", "w2"], "--seconds", "0.3"))
    assert results == [(0, "")] * 3
    study = storage.load("fleet", pg_url)
    trials = study.get_trials()
    assert all(t.state == TrialState.COMPLETE for t in trials) and len(trials) >= 15
    configs = [t.user_attrs["config"] for t in measured(study)]
    assert len(configs) == len(set(configs)) == len(trials) - 1
    assert [t.number for t in trials if t.user_attrs.get("baseline")] == [0]
    assert {t.user_attrs["host"] for t in trials} == {"w0", "w1", "w2"}
    for t in trials:  # each trial's speedup is over the baseline its own host measured
        reference = fleet.host_baseline(study, t.user_attrs["host"])
        assert reference is not None
        assert t.user_attrs["speedup_latency"] == pytest.approx(reference["latency_p50_ms"] / t.values[0], rel=1e-3)


def test_opening_a_study_waits_for_the_worker_claiming_a_trial(pg_url: str, tmp_path: Path,
                                                               fake_libs: Libraries) -> None:
    """A worker opening the study fails dead workers' trials and claims the study's host class:
    outside the claim's lock, a retry enqueued meanwhile was taken by a claimer in place of its own
    proposal, and two new hosts of different classes both claimed a new study."""
    here = machine.Machine(lscpu("amd_1s_smt"), fake_libs)
    asked = request(tmp_path, 1, storage=pg_url, study="locked")
    first = opening.open_search(asked, here)
    opened: list[opening.Search] = []
    with storage.exclusive(first.study):
        opener = threading.Thread(target=lambda: opened.append(opening.open_search(asked, here)))
        opener.start()
        opener.join(3)
        assert opener.is_alive() and not opened
    opener.join(60)
    assert len(opened) == 1


def test_one_worker_confirms_the_study_the_last_to_stop(pg_url: str, tmp_path: Path, fake_libs: Libraries) -> None:
    """Every worker ran its own confirmation, one of them while others still measured, each
    writing over the others' verdict."""
    here = machine.Machine(lscpu("amd_1s_smt"), fake_libs)
    opened = opening.open_search(request(tmp_path, 3, storage=pg_url, study="confirming"), here)
    claimed = fleet.claim(opened.worker())
    assert isinstance(claimed, fleet.Claimed)
    assert not fleet.claim_confirmation(opened.study, pg_url)  # a trial still runs
    opened.study.tell(claimed.trial, 100.0)
    other = storage.load("confirming", pg_url)
    assert fleet.claim_confirmation(other, pg_url)  # the last to stop
    assert not fleet.claim_confirmation(opened.study, pg_url)  # stopped together: the first confirms
    assert other.user_attrs[fleet.CONFIRMING]["finished"] == 1
    again = fleet.claim(opened.worker())
    assert isinstance(again, fleet.Claimed)
    opened.study.tell(again.trial, 90.0)
    assert fleet.claim_confirmation(opened.study, pg_url)  # new trials: confirmed again


def test_workers_started_together_on_an_empty_database_all_join_the_study(pg_url: str) -> None:
    """They race to create Optuna's schema; the losers wait and load it."""
    assert finish(start_workers(pg_url, "fleet", 1, [f"w{i}" for i in range(6)])) == [(0, "")] * 6
    assert [t.user_attrs["baseline"] for t in storage.load("fleet", pg_url).trials] == [True]


def running_trial_of(url: str, host: str, timeout_s: float = 60) -> int:
    deadline, study = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        with contextlib.suppress(storage.StudyError):  # the study is not made yet
            study = study or storage.load("fleet", url)
            running = [t.number for t in study.get_trials(states=(TrialState.RUNNING,))
                       if t.user_attrs.get("host") == host and "config" in t.user_attrs]
            if running:
                study._storage._backend.engine.dispose()  # type: ignore[attr-defined]
                return running[0]
        time.sleep(0.2)
    raise AssertionError(f"{host} never ran a trial")


def test_a_worker_killed_mid_trial_has_its_trial_failed_within_the_grace_period_and_the_others_finish(
        pg_url: str) -> None:
    victim, *others = start_workers(pg_url, "fleet", 12, ["w0", "w1", "w2"], "--seconds", "1.5")
    number = running_trial_of(pg_url, "w0")
    victim.kill()
    killed_at = time.monotonic()
    victim.communicate(timeout=10)
    assert victim.returncode == -signal.SIGKILL
    assert finish(others) == [(0, "")] * 2
    study = storage.load("fleet", pg_url)
    dead = study.trials[number]
    assert dead.state == TrialState.FAIL and records.fail_cause(dead) == records.CUT_SHORT
    assert dead.user_attrs["fail_reason"].startswith("left running by an autotune process")
    grace = 3  # fleet_worker.py's --heartbeat 1 gives a grace period of 3 s
    assert (dead.datetime_complete - dead.datetime_start).total_seconds() < time.monotonic() - killed_at + grace + 5
    retried = [t for t in study.trials if t.user_attrs.get("retry_of") == number]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE and retried[0].params == dead.params
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))


def test_a_worker_of_another_host_class_is_refused_in_one_line(pg_url: str) -> None:
    assert finish(start_workers(pg_url, "fleet", 2, ["w0"])) == [(0, "")]
    [(code, err)] = finish(start_workers(pg_url, "fleet", 4, ["w9"], "--lscpu", "xeon_2s_ht"))
    assert code == 2
    assert err.startswith("Error: this host is not of the class study 'fleet' is for (sockets: 2 here, 1 in the "
                          "study); start a study per host class, e.g. --study fleet-") and err.endswith(
                          ", or pass --allow-mixed\n") and err.count("\n") == 1
    assert len(storage.load("fleet", pg_url).trials) == 2


def test_allow_mixed_lets_another_class_in_with_its_own_baseline(pg_url: str) -> None:
    assert finish(start_workers(pg_url, "fleet", 3, ["w0"])) == [(0, "")]
    assert finish(start_workers(pg_url, "fleet", 6, ["w9"], "--lscpu", "xeon_2s_ht", "--allow-mixed",
                                "--speed", "2")) == [(0, "")]
    study = storage.load("fleet", pg_url)
    baselines = [t for t in study.trials if t.user_attrs.get("baseline")]
    assert [t.user_attrs["host"] for t in baselines] == ["w0", "w9"]  # one per host class
    assert baselines[1].values[0] == pytest.approx(baselines[0].values[0] / 2)


def cli_search(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`autotune search` on this machine (its real host class) as a process, with the fake child;
    measurement settings as fleet_worker.py's, so that only the host class differs."""
    return subprocess.run([sys.executable, str(FAKE_CLI), "ok", "search", "--model", "resnet18", "--trials", "4",
                           "--space", str(QUICK_SPACE), "--study", "fleet", "--storage", url, "--replicates", "1",
                           "--fresh-replicates", "--confirm-top", "0", *extra],
                          env={**os.environ, machine.TEST_HOST_ENV: "cli-host"}, capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)


def test_the_cli_refuses_another_host_class_in_one_line(pg_url: str, tmp_path: Path) -> None:
    assert finish(start_workers(pg_url, "fleet", 2, ["w0"], "--lscpu", "xeon_2s_ht")) == [(0, "")]
    before = storage.load("fleet", pg_url)
    here = machine.host_class(machine.this_machine())
    key = next(k for k in here if before.user_attrs[fleet.CLASS_ATTR].get(k) != here[k])
    refused = cli_search(pg_url, tmp_path)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (f"Error: this host is not of the class study 'fleet' is for ({key}: {here[key]} here, "
                              f"{before.user_attrs[fleet.CLASS_ATTR][key]} in the study); start a study per host "
                              f"class, e.g. --study fleet-{machine.class_id(here)}, or pass --allow-mixed\n")
    after = storage.load("fleet", pg_url)
    assert (len(after.trials), after.user_attrs) == (2, before.user_attrs)  # nothing written


def test_the_cli_admits_another_host_class_with_allow_mixed(pg_url: str, tmp_path: Path) -> None:
    assert finish(start_workers(pg_url, "fleet", 2, ["w0"], "--lscpu", "xeon_2s_ht")) == [(0, "")]
    before = storage.load("fleet", pg_url)
    here = machine.host_class(machine.this_machine())
    admitted = cli_search(pg_url, tmp_path, "--allow-mixed")
    assert admitted.returncode == 0, admitted.stderr
    study = storage.load("fleet", pg_url)
    baselines = [t for t in study.trials if t.user_attrs.get("baseline")]
    assert [(t.user_attrs["host"], t.user_attrs["host_class"]) for t in baselines] == [
        ("w0", before.trials[0].user_attrs["host_class"]), ("cli-host", machine.class_id(here))]
    mine = [t for t in study.trials if t.user_attrs["host"] == "cli-host" and not t.user_attrs["baseline"]]
    assert mine and all(t.state == TrialState.COMPLETE for t in study.trials)
    reference = fleet.host_baseline(study, "cli-host")
    assert reference is not None and reference["latency_p50_ms"] == baselines[1].user_attrs["latency_p50_ms"]


def test_optuna_dashboard_serves_the_postgresql_study(pg_url: str) -> None:
    assert finish(start_workers(pg_url, "fleet", 3, ["w0"])) == [(0, "")]
    port = free_port()
    dashboard = subprocess.Popen([str(Path(sys.executable).parent / "optuna-dashboard"), pg_url, "--host",
                                  "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    try:
        studies = get_json(f"http://127.0.0.1:{port}/api/studies")
        [listed] = studies["study_summaries"]
        assert listed["study_name"] == "fleet"
        detail = get_json(f"http://127.0.0.1:{port}/api/studies/{listed['study_id']}")
        assert len(detail["trials"]) == 3
    finally:
        dashboard.terminate()
        dashboard.wait(10)


def get_json(url: str, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.load(response)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_the_scale_benchmark_counts_a_worker_the_full_server_refuses_as_failed_instead_of_hanging(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server with room for the connection watcher and one worker: the others are refused
    ("too many clients") and counted failed in the table; the watcher, connected first, is never
    locked out; the run ends without its deadline."""
    monkeypatch.syspath_prepend(str(SCALE_BENCHMARK.parent))  # as running it does: its `lib` beside it
    spec = importlib.util.spec_from_file_location("fleet_scale", SCALE_BENCHMARK)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with server(max_connections=4) as full:
        result = bench.run(full, 3, 4, 0.1, tmp_path, stop_after=120)
    assert result["stopped_after_s"] is None and result["unanswered_polls"] == 0
    assert result["failed_workers"] >= 1 and result["exit_codes"] != [0]
    assert all("too many clients" in line for line in result["failures"]), result["failures"]
    assert 1 <= result["peak_connections"] <= 4 - 1 and result["max_connections"] == 4
    assert f"{result['failed_workers']} failed" in bench.row(result) and "of 4 |" in bench.row(result)
