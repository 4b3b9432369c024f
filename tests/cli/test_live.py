"""Live progress: the search's ETA, the child's phases reaching the parent, and silence on a pipe."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.child import worker
from autotune.cli import display, live
from autotune.config.knobs import Config
from autotune.host.machine import Machine
from autotune.measure.children import MEASURING, WAITING
from autotune.measure.runner import run_plan
from autotune.search import loop, opening
from tests.fixtures.models import tinynets
from tests.support.plans import plan_of
from tests.support.studies import ok_runner, request


def event(finished: int, finished_before: int, elapsed_s: float, total: int = 12) -> loop.TrialEvent:
    return loop.TrialEvent("start", 7, Config(), finished=finished, total=total, elapsed_s=elapsed_s,
                                  finished_before=finished_before)


def test_the_eta_after_a_resume_counts_only_this_sessions_trials() -> None:
    # 9 trials ran in an earlier session; this one ran 1 in 60 s: 2 more take about 2 minutes
    assert live._remaining(event(10, 9, 60.0)) == "elapsed 1:00, ~2:00 left"
    assert live._remaining(event(9, 9, 5.0)) == "elapsed 0:05"  # nothing finished here yet: no guess


def test_a_resumed_search_tells_the_display_what_ran_before(tmp_path: Path, here: Machine) -> None:
    """Every configuration runs (ok_runner): a crash's rerun would add a trial that is no more of --trials."""
    first = opening.open_search(request(tmp_path, 2), here)
    loop.run_search(first, here, lambda e: None, runner=ok_runner)
    events: list[loop.TrialEvent] = []
    again = opening.open_search(request(tmp_path, 3), here)
    loop.run_search(again, here, events.append, runner=ok_runner)
    assert [(e.kind, e.finished, e.finished_before) for e in events] == [("start", 2, 2), ("done", 3, 2)]


def test_the_childs_phase_lines_reach_the_callback_in_order() -> None:
    heard: list[tuple[int, str]] = []
    result = run_plan(plan_of("phases", "ok"), timeout_s=60, on_phase=lambda i, p: heard.append((i, p)))
    assert result.ok, result.reason
    assert [p for i, p in heard if i == 0] == ["building", "compiling", WAITING, MEASURING]
    assert [p for i, p in heard if i == 1] == [WAITING, MEASURING]  # a child without phase lines still runs


def test_the_real_child_says_what_it_builds_before_ready(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(worker, "die_with_parent", lambda pid: None)  # the test process is no benchmark child
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.syspath_prepend(str(Path(tinynets.__file__).parent))
    read_fd, write_fd = os.pipe()
    try:
        code = worker.main(["--model", "tinynets:cnn", "--item-shape", "3x32x32", "--backend", "torchscript",
                            "--cache-dir", str(tmp_path), "--result", str(tmp_path / "result.json"),
                            "--ready-fd", str(write_fd), "--probe"])
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as said:
        lines = said.read().decode().splitlines()
    assert (code, lines) == (0, ["phase building", "phase compiling", "phase loading the compiled model"])


class FakeStatus:
    def __init__(self, text: str) -> None:
        self.texts = [text]

    def start(self) -> None:
        pass

    def update(self, text: str) -> None:
        self.texts.append(text)

    def stop(self) -> None:
        pass


class FakeTerminal:
    is_terminal = True

    def status(self, text: str) -> FakeStatus:
        self.shown = FakeStatus(text)
        return self.shown


def test_the_status_line_shows_the_replicate_and_what_it_does(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = FakeTerminal()
    monkeypatch.setattr(display, "err", terminal)
    progress = live.SearchProgress("latency", replicates=3)
    progress(event(10, 9, 60.0))
    for _ in range(4):  # three replicates, then one more for a noisy trial
        progress.run_started()
    progress.phase(0, "compiling")
    progress.phase(1, "warming up")  # the first instance speaks for all
    head, tail = "trial 7 (11/12): baseline (PyTorch defaults)", "elapsed 1:00, ~2:00 left"
    assert terminal.shown.texts == [f"{head}  {tail}", f"{head}  replicate 1/3:  starting  {tail}",
                                    f"{head}  replicate 2/3:  starting  {tail}",
                                    f"{head}  replicate 3/3:  starting  {tail}",
                                    f"{head}  replicate 4 (extra: noisy):  starting  {tail}",
                                    f"{head}  replicate 4 (extra: noisy):  compiling  {tail}"]


def test_warm_replicates_are_one_run_then_extra_ones() -> None:
    assert live._replicate(1, 3, warm=True) == "replicates 1-3 (one warmed process):"
    assert live._replicate(2, 3, warm=True) == "replicate 4 (extra: noisy):"


def test_nothing_reaches_stderr_when_it_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert not display.err.is_terminal
    progress = live.SearchProgress("latency", replicates=3)
    progress(event(10, 9, 60.0))
    progress.run_started()
    progress.phase(0, "compiling")
    with display.status("measuring resnet18") as on_phase:
        on_phase(0, "compiling")
    progress.close()
    assert capsys.readouterr() == ("", "")
