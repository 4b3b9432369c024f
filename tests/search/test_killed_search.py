"""`kill -9` of a search, then the same command at once: the rerun fails the killed autotune's
trial at once (its process is provably gone) and runs every trial still missing."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from optuna.trial import TrialState

from autotune.study import records, storage
from tests.conftest import ROOT

FAKE_CLI = ROOT / "tests" / "support" / "fake_cli.py"
QUICK_SPACE = ROOT / "search_spaces" / "quick.yaml"


def search(behaviour: str, url: str, cwd: Path) -> subprocess.Popen[str]:
    """`autotune search --trials 3` as a process of its own, with the fake child doing `behaviour`."""
    return subprocess.Popen([sys.executable, str(FAKE_CLI), behaviour, "search", "--model", "resnet18", "--trials",
                             "3", "--space", str(QUICK_SPACE), "--study", "killed", "--storage", url,
                             "--replicates", "1", "--fresh-replicates", "--confirm-top", "0", "--duration", "0.2"],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_a_running_trial(db: Path, proc: subprocess.Popen[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    query = ("SELECT count(*) FROM trials JOIN trial_user_attributes USING (trial_id) "
             "WHERE state = 'RUNNING' AND key = 'config'")
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
