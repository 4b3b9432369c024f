"""The runner against a fake child: every way a benchmark can go wrong becomes a failed result."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from autotune.knobs import Config
from autotune.launch import BenchSpec, InstancePlan, LaunchPlan
from autotune.orchestrate import run_plan
from autotune.stats import percentile

FAKE = str(Path(__file__).parent / "fake_worker.py")


def plan_of(*behaviours: str, env: dict[str, str] | None = None) -> LaunchPlan:
    instances = tuple(
        InstancePlan(i, (0,), 0, env or {}, (sys.executable, FAKE, b)) for i, b in enumerate(behaviours)
    )
    return LaunchPlan(Config(), BenchSpec("fake", (1,)), "none", instances)


def no_children_left() -> bool:
    return not psutil.Process().children(recursive=True)


def test_two_good_instances_aggregate() -> None:
    result = run_plan(plan_of("ok", "ok"), timeout_s=60)
    assert result.ok, result.reason
    assert result.throughput_ips == 8.0
    assert result.latency_p50_ms == 11.5
    assert result.peak_rss_mb == 200.0
    assert no_children_left()


def test_plan_env_reaches_the_child_and_nothing_else_leaks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "99")
    result = run_plan(plan_of("ok", env={"KMP_BLOCKTIME": "1"}), timeout_s=60)
    seen = result.instances[0].metrics["runtime"]["env"]
    assert seen["KMP_BLOCKTIME"] == "1"
    assert "OMP_NUM_THREADS" not in seen


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        ("crash-early", "crashed with SIGSEGV"),
        ("crash-late", "crashed with SIGABRT"),
        ("exit-7", "exited with code 7: something went wrong"),
        ("no-result", "exited without writing a result"),
        ("bench-error", "mkldnn: aten::foo has no mkldnn kernel"),
    ],
)
def test_a_failing_child_is_a_failed_result(behaviour: str, reason: str) -> None:
    result = run_plan(plan_of(behaviour), timeout_s=60)
    assert not result.ok
    assert result.reason == f"instance 0: {reason}"
    assert no_children_left()


def test_crash_late_keeps_the_stderr_tail() -> None:
    result = run_plan(plan_of("crash-late"), timeout_s=60)
    assert "about to crash" in result.instances[0].stderr_tail


def test_one_instance_failing_before_the_barrier_stops_the_others() -> None:
    result = run_plan(plan_of("ok", "crash-early"), timeout_s=60)
    assert not result.ok
    assert result.instances[1].reason == "crashed with SIGSEGV"
    assert result.instances[0].reason == "stopped because instance 1 failed"
    assert result.reason == "instance 0: stopped because instance 1 failed"


@pytest.mark.parametrize(("behaviour", "when"), [("hang-early", "before measuring"),
                                                 ("hang-late", "while measuring")])
def test_a_hung_child_is_killed_at_the_timeout(behaviour: str, when: str) -> None:
    start = time.monotonic()
    result = run_plan(plan_of(behaviour), timeout_s=2)
    assert time.monotonic() - start < 20
    assert not result.ok
    assert result.instances[0].reason.startswith(f"timed out after 2s {when}")
    assert no_children_left()


def test_the_whole_process_group_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    result = run_plan(plan_of("grandchild-hang", env={"GRANDCHILD_PIDFILE": str(pidfile)}), timeout_s=3)
    assert not result.ok
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 90) == 5.0
    assert percentile([0.0, 10.0], 90) == 9.0


def test_a_command_that_cannot_start_is_a_failed_result() -> None:
    good = plan_of("ok").instances[0]
    plan = LaunchPlan(Config(), BenchSpec("fake", (1,)), "none",
                      (good, InstancePlan(1, (0,), 0, {}, ("/nonexistent/numactl", "x"))))
    result = run_plan(plan, timeout_s=30)
    assert not result.ok
    assert result.instances[0].reason == "stopped because instance 1 could not start"
    assert result.instances[1].reason.startswith("could not start: [Errno 2] No such file or directory")
    assert no_children_left()
