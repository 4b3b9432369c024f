"""Standard output and error a command cannot use (cli/streams.py), and a cache folder no child
could write into: each is one line and a documented exit code, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.cli import AUTOTUNE, run_cli


def _run(shell: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", shell], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_a_full_standard_output_is_one_line_and_exit_1(tmp_path: Path) -> None:
    done = _run(f"{AUTOTUNE} knobs > /dev/full", tmp_path)
    assert done.returncode == 1
    assert done.stderr == ("Error: cannot write to standard output (No space left on device); what the command "
                           "measured or wrote is kept in its study and files; send the output where it can be "
                           "written\n")


@pytest.mark.parametrize("closing", [">&-", "2>&-", ">&- 2>&-"])
def test_closed_streams_are_discarded_and_the_command_s_code_stands(tmp_path: Path, closing: str) -> None:
    done = _run(f"{AUTOTUNE} knobs {closing}", tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    bad = _run(f"{AUTOTUNE} bench --model not-a-model {closing}", tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr + bad.stdout


def test_a_full_standard_error_leaves_the_exit_code_to_tell(tmp_path: Path) -> None:
    done = _run(f"{AUTOTUNE} bench --model not-a-model 2>/dev/full", tmp_path)
    assert (done.returncode, done.stdout) == (2, "")


@pytest.mark.parametrize("command", [["search", "--trials", "2"], ["bench"]])
def test_a_cache_folder_that_cannot_be_written_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        command: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    code, out, err = run_cli(capsys, *command, "--model", "resnet18", "--cache-dir", "file/cache")
    assert (code, out) == (2, "")
    assert err == ("Error: --cache-dir 'file/cache' is not a writable folder (Not a directory); make it writable "
                   "or choose another (compiled models and the kernel probe are kept there)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no study, no cache
