"""autotune's command line: in this process (`run_cli`, its exit code and output), and as the
installed command in a process of its own (`AUTOTUNE`, `autotune`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli.main import main

AUTOTUNE = str(Path(sys.executable).with_name("autotune"))  # the console script beside this Python
# A real search that takes a couple of minutes: resnet18, the quick space, short windows, 2 replicates.
# One configuration measured briefly: what a test of a bench process needs, not a timing.
QUICK_BENCH = ["--duration", "0.3", "--warmup", "1", "--warmup-time", "0.1", "--min-iterations", "3"]
QUICK_SEARCH = ["--model", "resnet18", "--space", "quick", "--duration", "0.3", "--warmup", "1", "--warmup-time",
                "0.1", "--min-iterations", "5", "--replicates", "2"]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`autotune ARGS...` in this process: its exit code, stdout and stderr."""
    with pytest.raises(SystemExit) as info:
        main(list(args))
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


def autotune(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The installed `autotune ARGS...` run in `cwd`, its output captured."""
    return subprocess.run([AUTOTUNE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def assert_one_error_line(capsys: pytest.CaptureFixture[str], folder: Path, message: str, *args: str) -> None:
    """`autotune ARGS...` is a bad input: exit 2, nothing on stdout, one `Error:` line starting with
    `message`, no traceback, and nothing written in `folder` (where it ran)."""
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith(message), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert list(folder.iterdir()) == []
