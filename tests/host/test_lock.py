"""One benchmark per machine at a time: a second autotune waits for the first (saying for whom) or,
with --no-wait, fails at once; a lock whose holder was killed is taken over."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.host.lock import LOCK_ENV, MachineBusy, lock_path, machine_lock
from tests.conftest import ROOT

HOLD = ("import sys, time\n"
        "from autotune.host.lock import machine_lock\n"
        "with machine_lock(sys.argv[1], True, lambda line: None):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n")
STARTED = r"started \d\d:\d\d"


@pytest.fixture
def holder(tmp_path_factory: pytest.TempPathFactory,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[subprocess.Popen[str]]:
    """Another autotune search holding the machine, in its own process, on a lock of this test's
    own: the holder is killed at the end, and its stale entry in the session's lock would greet the
    next test that takes that lock with a take-over note."""
    monkeypatch.setenv(LOCK_ENV, str(tmp_path_factory.mktemp("lock") / "autotune.host.lock"))
    with subprocess.Popen([sys.executable, "-c", HOLD, "search"], cwd=ROOT, stdout=subprocess.PIPE,
                          text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "held\n"
            yield proc
        finally:
            proc.kill()


def who(proc: subprocess.Popen[str]) -> str:
    return f"autotune search, pid {proc.pid}, {STARTED}"


def test_no_wait_fails_at_once_naming_the_holder_and_leaves_its_lock_alone(
        holder: subprocess.Popen[str]) -> None:
    before = lock_path().read_text()
    with pytest.raises(MachineBusy) as busy, machine_lock("bench", False, print):
        pytest.fail("the lock was taken while another autotune held it")
    assert re.fullmatch(f"this machine is busy: {who(holder)} is measuring \\(lock {re.escape(str(lock_path()))}\\); "
                        "run again when it has finished, or without --no-wait to wait for it", str(busy.value))
    assert lock_path().read_text() == before and f'"pid": {holder.pid}' in before


def test_a_second_one_waits_saying_for_whom_then_runs_when_the_first_is_done(
        holder: subprocess.Popen[str]) -> None:
    said: list[str] = []
    entered = threading.Event()

    def second() -> None:
        with machine_lock("bench", True, said.append):
            entered.set()

    waiting = threading.Thread(target=second)
    waiting.start()
    time.sleep(1.0)
    assert not entered.is_set()
    assert len(said) == 1 and re.fullmatch(
        f"waiting for {who(holder)} \\(one benchmark per machine at a time; Ctrl-C to give up\\)", said[0])
    holder.send_signal(signal.SIGINT)  # the first one finishes (a clean exit)
    waiting.join(timeout=10)
    assert entered.is_set() and len(said) == 1  # no take-over note: nobody was killed
    assert lock_path().read_text() == ""


def test_the_lock_of_a_killed_holder_is_taken_over(holder: subprocess.Popen[str]) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    said: list[str] = []
    with machine_lock("bench", False, said.append):
        assert f'"command": "bench", "pid": {os.getpid()}' in lock_path().read_text()
    assert len(said) == 1 and re.fullmatch(
        f"note: took over the machine lock {re.escape(str(lock_path()))} from {who(holder)}, which was killed",
        said[0])


def test_the_lock_file_is_made_writable_by_every_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_ENV, str(tmp_path / "machine.lock"))
    old = os.umask(0o022)
    try:
        with machine_lock("bench", False, print):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "machine.lock").stat().st_mode) == 0o666


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    return int(info.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("command", [["search", "--trials", "2"], ["bench"]])
def test_no_wait_on_a_busy_machine_is_one_line_exit_2_and_writes_nothing(
        holder: subprocess.Popen[str], capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, *command, "--model", "resnet18", "--no-wait")
    assert code == 2
    assert re.fullmatch(f"Error: this machine is busy: {who(holder)} is measuring \\(lock .*\\); run again when it "
                        "has finished, or without --no-wait to wait for it\n", err)
    assert list(tmp_path.iterdir()) == []


def test_a_lock_that_cannot_be_opened_is_one_line_saying_what_to_do(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(LOCK_ENV, str(tmp_path / "no" / "such" / "dir.lock"))
    code, err = run_cli(capsys, "bench", "--model", "resnet18")
    assert (code, err) == (2, f"Error: cannot open the machine lock {tmp_path}/no/such/dir.lock: No such file or "
                              f"directory; set {LOCK_ENV} to a file every autotune user can write\n")


@pytest.mark.e2e
def test_a_second_search_waits_for_the_first_then_runs(holder: subprocess.Popen[str], tmp_path: Path) -> None:
    quick = ["--model", "resnet18", "--space", "quick", "--duration", "0.3", "--warmup", "1", "--warmup-time",
             "0.1", "--min-iterations", "5", "--replicates", "1", "--trials", "1", "--confirm-top", "0"]
    with subprocess.Popen([str(Path(sys.executable).parent / "autotune"), "search", *quick], cwd=tmp_path,
                          stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as second:
        try:
            assert second.stderr is not None
            assert re.fullmatch(f"waiting for {who(holder)} \\(one benchmark per machine at a time; Ctrl-C to give "
                                "up\\)\n", second.stderr.readline())
            time.sleep(1.0)
            assert not (tmp_path / "studies").exists()  # nothing is written while it waits
            holder.send_signal(signal.SIGINT)
            _, err = second.communicate(timeout=600)
        finally:
            second.kill()
    assert second.returncode == 0, err
    assert (tmp_path / "studies" / "resnet18-bs1-latency.db").is_file()
