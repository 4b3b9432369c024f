"""The benchmark child's own housekeeping: its peak memory restarted after building, its exit without
teardown, the empty folders a failed child leaves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from autotune.child import worker


def test_the_peak_rss_restarts_after_building() -> None:
    ballast = bytearray(64 << 20)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page
    before = worker.peak_rss_mb()
    del ballast
    worker.release_setup_memory()
    assert worker.start_peak_rss() == ""
    assert worker.peak_rss_mb() < before - 48


def test_where_the_peak_cannot_be_reset_the_result_says_so(tmp_path: Path) -> None:
    note = worker.start_peak_rss(str(tmp_path / "missing" / "clear_refs"))
    assert note == "peak RSS includes building the model: cannot reset it (No such file or directory)"


def test_the_child_exits_without_teardown_after_flushing_what_it_printed() -> None:
    program = ("import atexit; from autotune.child import worker; atexit.register(print, 'torn down'); "
               "print('result written', end=''); worker.exit_now(3)")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3
    assert done.stdout == "result written"  # flushed, and no teardown ran


def test_a_failed_child_removes_only_the_empty_folders_it_created(tmp_path: Path) -> None:
    kept = tmp_path / "studies"
    kept.mkdir()
    kernels = kept / "cache" / "inductor" / "2.14"
    assert worker.outermost_missing(kernels) == kept / "cache"
    assert worker.outermost_missing(kept) is None
    kernels.mkdir(parents=True)
    worker.remove_empty(kernels, kept / "cache")
    assert list(tmp_path.iterdir()) == [kept] and list(kept.iterdir()) == []  # what existed before stays

    kernels.mkdir(parents=True)
    (kernels.parent / "written").write_text("another process's kernel")
    worker.remove_empty(kernels, kept / "cache")
    assert not kernels.exists() and (kernels.parent / "written").exists()  # stops at the first folder in use
    worker.remove_empty(kernels.parent, None)  # nothing created: nothing removed
    assert (kernels.parent / "written").exists()


def test_the_flags_the_parent_plans_are_the_ones_the_child_takes() -> None:
    """Every model knob reaches the child as a flag, integer knobs too (they have no choices)."""
    from autotune.child.sources import knobs_of
    from autotune.config.knobs import Config
    from autotune.measure.plan import BenchSpec, worker_command

    config = Config.from_mapping({"backend": "openvino", "ov_hint": "throughput", "ov_streams": 3,
                                  "ov_pinning": False})
    argv = worker_command(sys.executable, BenchSpec(model="tinycnn", item_shape=(3, 32, 32)), config)
    knobs = knobs_of(worker.parse_args([*argv[3:], "--result", "r.json"]))
    assert (knobs.backend, knobs.ov_hint, knobs.ov_streams, knobs.ov_pinning) == ("openvino", "throughput", 3, False)
