"""`kill -9` of a search, then the same command at once: the rerun fails the killed autotune's
trial at once (its process is provably gone) and runs every trial still missing."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from optuna.trial import TrialState

from autotune.base import processes
from autotune.base.errors import TopologyError
from autotune.config import recipes
from autotune.config.knobs import Config
from autotune.config.recipes import Recipe
from autotune.host.machine import Machine
from autotune.measure import requests
from autotune.measure.plan import LaunchPlan
from autotune.search import fleet, loop, opening
from autotune.study import records, storage
from tests.conftest import ROOT
from tests.support.studies import ok_runner, request

FAKE_CLI = ROOT / "tests" / "support" / "fake_cli.py"
QUICK_SPACE = ROOT / "search_spaces" / "quick.yaml"


def search(behaviour: str, url: str, cwd: Path, space: Path = QUICK_SPACE) -> subprocess.Popen[str]:
    """`autotune search --trials 3` as a process of its own, with the fake child doing `behaviour`."""
    return subprocess.Popen([sys.executable, str(FAKE_CLI), behaviour, "search", "--model", "resnet18", "--trials",
                             "3", "--space", str(space), "--study", "killed", "--storage", url, "--seed", "1",
                             "--replicates", "1", "--fresh-replicates", "--confirm-top", "0", "--duration", "0.2"],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_a_running_trial(db: Path, proc: subprocess.Popen[str], timeout_s: float = 60, key: str = "config") -> None:
    deadline = time.monotonic() + timeout_s
    query = ("SELECT count(*) FROM trials JOIN trial_user_attributes USING (trial_id) "
             f"WHERE state = 'RUNNING' AND key = '{key}'")
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if db.is_file():
            try:
                with sqlite3.connect(db) as conn:
                    if conn.execute(query).fetchone()[0]:
                        return
            except sqlite3.OperationalError:  # the schema is not made yet, or locked a moment
                pass
        time.sleep(0.2)
    raise AssertionError("the search never ran a trial")


def test_a_search_killed_mid_trial_and_run_again_at_once_runs_every_trial(tmp_path: Path) -> None:
    db = tmp_path / "killed.db"
    url = f"sqlite:///{db}"
    first = search("hang-early", url, tmp_path)  # its first trial never ends
    wait_for_a_running_trial(db, first)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    again = search("ok", url, tmp_path)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert "every configuration of the space has run" not in err
    study = storage.load("killed", url)
    killed = study.trials[0]
    assert killed.state == TrialState.FAIL and records.fail_cause(killed) == records.CUT_SHORT
    assert killed.user_attrs["fail_reason"] == (f"left running by an autotune process (pid {first.pid}) that was "
                                                f"killed: that process no longer runs on this host")
    assert records.finished(study) == 3 and records.distinct_configs(study) == 3
    assert [t.user_attrs.get("retry_of") for t in study.trials][:2] == [None, 0]
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))



def test_a_search_killed_in_a_recipe_s_trial_runs_that_recipe_again_as_it_was(tmp_path: Path) -> None:
    """The retry of the killed trial sets the recipe's knobs and samples none besides."""
    space_file = tmp_path / "compile.yaml"
    space_file.write_text("knobs:\n  backend: [eager, inductor]\n  memory_format: [contiguous, channels_last]\n"
                          "  instances: {low: 1, high: max}\n  omp_threads: {low: 1, high: max}\n")
    db = tmp_path / "killed.db"
    url = f"sqlite:///{db}"
    first = search("hang-unless-defaults", url, tmp_path, space_file)
    wait_for_a_running_trial(db, first, timeout_s=120, key="recipe")
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    again = search("ok", url, tmp_path, space_file)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert "Inconsistent parameter values" not in err
    study = storage.load("killed", url)
    killed, retry = study.trials[1], study.trials[2]
    assert records.fail_cause(killed) == records.CUT_SHORT and killed.user_attrs["recipe"] == "compile+channels_last"
    assert (retry.state, retry.params, retry.user_attrs["recipe"]) == (TrialState.COMPLETE, killed.params,
                                                                     "compile+channels_last")
    assert retry.user_attrs["config"] == "backend=inductor memory_format=channels_last"
    assert records.finished(study) == 3 and not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))


THREADS_ONLY = Recipe("threads only", Config.from_mapping({"omp_threads": 8}))  # as gpt-fast's: no instances


def test_a_resumed_search_retries_the_killed_trial_exactly_and_runs_the_recipes_it_owed(
        tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 in trial 1 (a recipe that sets omp_threads, not instances), then the same command: the
    retry once took the recipe's knobs plus a freshly sampled instances=2 (8 threads x 2 instances on
    8 cores: a configuration that cannot run, counted as a trial), and the recipe after it never ran."""
    space_file = tmp_path / "threads.yaml"
    space_file.write_text("knobs:\n  instances: {low: 1, high: max}\n  omp_threads: {low: 1, high: max}\n"
                          "  allocator: [default, jemalloc]\n")
    owed = Recipe("jemalloc", Config.from_mapping({"allocator": "jemalloc"}))
    monkeypatch.setattr(recipes, "recipes", lambda *args, **kwargs: [THREADS_ONLY, owed])
    wanted = request(tmp_path, 4, space=space_file, seed=3)
    opened = opening.open_search(replace(wanted, trials=1), here)
    loop.run_search(opened, here, lambda event: None, runner=ok_runner)  # the baseline
    opened = opening.open_search(wanted, here)
    claimed = fleet.claim(opened.worker())  # what the killed autotune fixed in the study, then ran
    assert isinstance(claimed, fleet.Claimed) and claimed.config == THREADS_ONLY.config
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = processes.start_time(dead.pid)
    dead.wait()
    claimed.trial.set_user_attr("pid", dead.pid)
    claimed.trial.set_user_attr("pid_started", started)

    resumed = opening.open_search(wanted, here)  # the same command again
    assert resumed.notes[-1] == f"trial {claimed.trial.number} was left running by a killed autotune; marked failed"
    loop.run_search(resumed, here, lambda event: None, runner=ok_runner)
    trials = resumed.study.get_trials()
    killed, retry = trials[1], trials[2]
    assert records.fail_cause(killed) == records.CUT_SHORT
    assert (retry.state, retry.params, retry.user_attrs["config"]) == (TrialState.COMPLETE, killed.params,
                                                                     "omp_threads=8")
    assert (retry.user_attrs["recipe"], retry.user_attrs["retry_of"]) == ("threads only", 1)
    assert retry.user_attrs["proposed_by"] == "retry of a killed autotune's trial"
    assert trials[3].user_attrs.get("recipe") == "jemalloc" and trials[3].state == TrialState.COMPLETE
    assert records.finished(resumed.study) == 4 and len(trials) == 5
    assert not [t.number for t in trials if records.fail_cause(t) not in (None, records.CUT_SHORT)]



def test_a_configuration_this_machine_cannot_run_takes_no_trial_and_is_not_proposed_again(
        tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    """One that no plan fits here (enqueued through Optuna, say): recorded with why, and the search
    still measures --trials configurations."""
    make_plan, refused = requests.make_plan, []

    def plan(bench: requests.BenchRequest, machine: Machine) -> LaunchPlan:
        if bench.config.values and not refused:
            refused.append(bench.config)
            raise TopologyError("omp_threads=8 x instances=2 = 16 threads is above the 8 usable physical cores")
        return make_plan(bench, machine)

    monkeypatch.setattr(requests, "make_plan", plan)
    opened = opening.open_search(request(tmp_path, 3), here)
    loop.run_search(opened, here, lambda event: None, runner=ok_runner)
    trials = opened.study.get_trials()
    [cannot] = [t for t in trials if records.fail_cause(t) == records.CANNOT_RUN]
    assert cannot.user_attrs["fail_reason"].endswith("is above the 8 usable physical cores")
    assert cannot.user_attrs["config"] == refused[0].describe() and not records.counts(cannot)
    assert records.finished(opened.study) == 3 and len(trials) == 4
    assert records.identity(cannot) in fleet.taken(trials, opened.settings_digest)  # never proposed again
