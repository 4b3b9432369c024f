"""`--eval-data` and `--max-quality-drop` on the command line: each mistake that can be told without
the model is one `Error:` line, exit code 2, nothing written (those the model must read are in
tests/e2e/test_quality.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.cli import assert_one_error_line

MODEL = ["--model", "resnet18"]
LM = ["--model", "hf:gpt2", "--task", "generate"]


def _made(folder: Path) -> dict[str, Path]:
    """Bad data of every kind, made beside the folder autotune runs in (outside it: it must stay empty)."""
    data = folder.parent / "data"
    data.mkdir()
    (data / "empty.pt").write_bytes(b"")
    (data / "flat").mkdir()
    (data / "flat" / "a.png").write_bytes(b"\x89PNG")
    os.mkfifo(data / "pipe")
    (data / "book.txt").write_text("a text")
    return {"empty": data / "empty.pt", "flat": data / "flat", "pipe": data / "pipe", "book": data / "book.txt",
            "folder": data}


@pytest.mark.parametrize("command", [["bench", "--cache-dir", "cache"], ["search", "--trials", "2"]])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*MODEL, "--eval-data", "{missing}"],
         "Error: --eval-data '{missing}' cannot be read (No such file or directory); give a file of labelled "
         "inputs (torch.save), a folder of class folders of images, or for --task generate a text file"),
        ([*MODEL, "--eval-data", "{empty}"], "Error: --eval-data '{empty}' is empty; give the data to judge"),
        ([*MODEL, "--eval-data", "{flat}"],
         "Error: --eval-data '{flat}' has no class folders, so no labels: put each class's images in a folder"),
        ([*MODEL, "--eval-data", "{pipe}"], "Error: --eval-data '{pipe}' is not a regular file (a pipe or a device)"),
        ([*LM, "--eval-data", "{folder}"],
         "Error: --eval-data '{folder}' is a folder; --task generate reads a plain text file"),
    ],
)
def test_bad_data_is_one_line_exit_2_and_nothing_written(capsys: pytest.CaptureFixture[str], empty: Path,
                                                         command: list[str], args: list[str], message: str) -> None:
    paths = {name: str(path) for name, path in _made(empty).items()} | {"missing": str(empty.parent / "missing")}
    assert_one_error_line(capsys, empty, message.format(**paths), *command, *(a.format(**paths) for a in args))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*MODEL, "--max-quality-drop", "1"],
         "Error: --max-quality-drop needs --eval-data or --eval: quality is judged on your data"),
        ([*MODEL, "--eval-data", "{book}", "--max-quality-drop", "-1"],
         "Error: --max-quality-drop '-1' is not a drop; give 0 or more, like 1 (accuracy points) or 2% (of "
         "perplexity)"),
        ([*MODEL, "--eval-data", "{book}", "--max-quality-drop", "two"],
         "Error: --max-quality-drop 'two' is not a drop"),
        ([*MODEL, "--eval-data", "{book}", "--max-quality-drop", "nan%"],
         "Error: --max-quality-drop 'nan%' is not a drop"),
        ([*MODEL, "--eval-data", "{book}", "--max-quality-drop", "inf"],
         "Error: --max-quality-drop 'inf' is not a drop"),
    ],
)
def test_a_drop_is_a_number_on_the_users_data(capsys: pytest.CaptureFixture[str], empty: Path, args: list[str],
                                              message: str) -> None:
    paths = {name: str(path) for name, path in _made(empty).items()}
    assert_one_error_line(capsys, empty, message, "search", "--trials", "2", *(a.format(**paths) for a in args))


def test_export_picks_by_drop_only_with_quality_figures(capsys: pytest.CaptureFixture[str], empty: Path) -> None:
    assert_one_error_line(capsys, empty, "Error: give --trial or --max-quality-drop, not both",
                          "export", "best.env", "--trial", "1", "--max-quality-drop", "1")
    assert_one_error_line(capsys, empty, "Error: --max-quality-drop 'x' is not a drop",
                          "export", "best.env", "--max-quality-drop", "x")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--eval", "metrics"], "Error: --eval 'metrics' is not MODULE:FUNCTION (a function called with the model"),
        (["--eval", "my-metrics:f", "--eval-direction", "higher"],
         "Error: --eval 'my-metrics:f' is not MODULE:FUNCTION"),
        (["--eval", "metrics:f"], "Error: --eval metrics:f needs --eval-direction higher or lower"),
        (["--eval-direction", "lower"], "Error: --eval-direction says which way --eval's metric is better; add --eval"),
        (["--eval", "metrics:f", "--eval-direction", "up"], "Error: Invalid value for '--eval-direction'"),
    ],
)
def test_a_metric_is_module_function_with_a_direction(capsys: pytest.CaptureFixture[str], empty: Path,
                                                      args: list[str], message: str) -> None:
    for command in (["bench", "--cache-dir", "cache"], ["search", "--trials", "2"]):
        assert_one_error_line(capsys, empty, message, *command, *MODEL, *args)
