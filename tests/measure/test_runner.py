"""The runner against a fake child: every way a benchmark can go wrong becomes a failed result."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from autotune.config.knobs import Config
from autotune.host import libs
from autotune.measure.children import ignored_preload
from autotune.measure.plan import BenchSpec, InstancePlan, LaunchPlan
from autotune.measure.results import RunResult
from autotune.measure.runner import Series, built_beside, run_plan, run_series
from tests.support.plans import WINDOW_S, plan_of


def no_children_left() -> bool:
    return not psutil.Process().children(recursive=True)


def test_two_good_instances_aggregate() -> None:
    result = run_plan(plan_of("ok", "ok"), timeout_s=60)
    assert result.ok, result.reason
    assert result.throughput_ips == 8.0
    assert result.latency_p50_ms == 11.5
    assert result.peak_rss_mb == 200.0
    assert result.setup_peak_rss_mb == 300.0
    assert no_children_left()


def test_every_instance_measures_over_the_same_window() -> None:
    result = run_plan(plan_of("ok", "ok", "ok"), timeout_s=60)
    assert result.ok, result.reason
    windows = [i.metrics["window"] for i in result.instances]
    assert windows[0] == windows[1] == windows[2]
    assert windows[0]["end"] - windows[0]["start"] == pytest.approx(WINDOW_S)
    assert all(i.metrics["late_start_s"] < 0.05 for i in result.instances)


def test_the_noise_window_is_the_timed_loop_not_the_exit() -> None:
    result = run_plan(plan_of("slow-exit", "ok"), timeout_s=60)
    assert result.ok, result.reason
    assert WINDOW_S <= result.noise["window_s"] < WINDOW_S + 0.5  # the child took 1 s more to exit


def test_an_ignored_preload_fails_the_instance() -> None:
    result = run_plan(plan_of("ok", env={"LD_PRELOAD": "/nonexistent/libiomp5.so"}), timeout_s=60)
    assert not result.ok
    assert result.reason == ("instance 0: LD_PRELOAD of libiomp5 was ignored: the child resolved OpenMP "
                             "from nowhere, malloc from libc")


def test_a_preload_that_took_effect_passes() -> None:
    jemalloc = libs.discover().require("jemalloc")
    result = run_plan(plan_of("ok", env={"LD_PRELOAD": str(jemalloc)}), timeout_s=60)
    assert result.ok, result.reason
    assert Path(result.instances[0].metrics["runtime"]["malloc_library"]).name.startswith("libjemalloc")


def test_preloads_compare_by_real_path_or_library_name() -> None:
    runtime = {"openmp_library": "/opt/intel/lib/libiomp5.so", "malloc_library": "/usr/lib/libjemalloc.so.2"}
    assert ignored_preload("/venv/lib/libiomp5.so /usr/lib/libjemalloc.so.2", runtime) == ""
    assert ignored_preload("", {}) == ""
    assert ignored_preload("/usr/lib/libiomp5.so:/usr/lib/libtcmalloc_minimal.so.4", runtime) == (
        "LD_PRELOAD of libtcmalloc_minimal was ignored: the child resolved OpenMP from libiomp5, "
        "malloc from libjemalloc")


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


def test_a_child_that_failed_the_guard_says_so_apart_from_its_reason() -> None:
    wrong = run_plan(plan_of("wrong-answers"), timeout_s=60)
    assert wrong.reason == "instance 0: wrong answers: max relative error 0.2 > tolerance 0.001"
    assert wrong.instances[0].wrong_answers and wrong.summary()["instances"][0]["wrong_answers"] is True
    assert not run_plan(plan_of("bench-error"), timeout_s=60).instances[0].wrong_answers
    assert not run_plan(plan_of("crash-early"), timeout_s=60).instances[0].wrong_answers


def test_crash_late_keeps_the_stderr_tail() -> None:
    result = run_plan(plan_of("crash-late"), timeout_s=60)
    assert "about to crash" in result.instances[0].stderr_tail


def test_one_instance_failing_before_the_barrier_stops_the_others() -> None:
    result = run_plan(plan_of("ok", "crash-early"), timeout_s=60)
    assert not result.ok
    assert result.instances[1].reason == "crashed with SIGSEGV"
    assert result.instances[0].reason == "stopped because instance 1 failed"
    assert result.reason == "instance 1: crashed with SIGSEGV"  # the cause, not the instance it stopped


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
    _gone(int(pidfile.read_text()))


def test_a_helper_left_by_a_child_that_succeeded_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "helper.pid"
    result = run_plan(plan_of("helper-left", env={"GRANDCHILD_PIDFILE": str(pidfile)}), timeout_s=30)
    assert result.ok, result.reason
    _gone(int(pidfile.read_text()))


def _gone(pid: int) -> None:
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_command_that_cannot_start_is_a_failed_result() -> None:
    good = plan_of("ok").instances[0]
    plan = LaunchPlan(Config(), BenchSpec("fake", (1,)), "none",
                      (good, InstancePlan(1, (0,), 0, {}, ("/nonexistent/numactl", "x"))))
    result = run_plan(plan, timeout_s=30)
    assert not result.ok
    assert result.instances[0].reason == "stopped because instance 1 could not start"
    assert result.instances[1].reason.startswith("could not start: [Errno 2] No such file or directory")
    assert no_children_left()


def _setup(result: RunResult, key: str) -> float:
    return float(result.instances[0].metrics["setup"][key])


def _window(result: RunResult) -> dict[str, float]:
    return dict(result.instances[0].metrics["window"])


def series(plans: list[LaunchPlan], timeout_s: float, memory_mb: float = 1e6) -> list[RunResult]:
    return list(run_series(plans, timeout_s, available_mb=lambda: memory_mb))


def held(result: RunResult) -> bool:
    return _setup(result, "released_at") > _setup(result, "built_at")


def test_a_series_builds_two_plans_together_and_measures_each_alone() -> None:
    start = time.monotonic()
    results = series([plan_of("slow-build"), plan_of("slow-build"), plan_of("slow-build")], 60)
    elapsed = time.monotonic() - start
    assert all(r.ok for r in results), [r.reason for r in results]
    first, second, third = results
    assert not held(first)  # a plan runs alone until it has once succeeded: its memory is then known
    assert abs(_setup(second, "built_at") - _setup(third, "built_at")) < 0.5  # built side by side
    assert _setup(third, "released_at") >= _window(second)["end"]  # its turn came after the other's window
    assert _window(third)["start"] > _window(second)["end"]
    assert sum(r.wall_s for r in results) == pytest.approx(elapsed, abs=0.3)  # the walls add up
    assert elapsed < 3 * 1.0 + 2.0  # two builds of 1 s overlapped
    assert no_children_left()


def test_plans_whose_peaks_do_not_fit_in_memory_together_run_one_by_one() -> None:
    # A fake plan peaks at 150 MB; two need 300 MB, more than 80% of 300 MB.
    results = series([plan_of("ok")] * 4, 60, memory_mb=300)
    assert all(r.ok for r in results) and not any(held(r) for r in results)
    assert any(held(r) for r in series([plan_of("ok")] * 4, 60, memory_mb=400))


def test_plans_not_run_yet_pair_when_their_expected_peaks_fit() -> None:
    plans = [plan_of("ok"), plan_of("ok")]
    paired = list(run_series(plans, 60, available_mb=lambda: 400, expected_mb=lambda plan: 150.0))
    assert [held(r) for r in paired] == [True, True]  # built together from the start
    too_big = list(run_series(plans, 60, available_mb=lambda: 400, expected_mb=lambda plan: 250.0))
    assert not any(held(r) for r in too_big)


@pytest.mark.parametrize("order", [("crash-early", "ok"), ("ok", "crash-early"), ("crash-at-warmup", "ok"),
                                   ("ok", "crash-at-warmup")])
def test_a_plan_that_fails_in_a_series_fails_alone(order: tuple[str, str]) -> None:
    first, second = (plan_of(f"{b}-when-held") for b in order)
    results = series([first, second, first, second], 60)
    assert all(r.ok for r in results[:2])  # alone, each ran as it should
    paired = results[2:]
    assert [r.ok for r in paired] == [b == "ok" for b in order]
    assert [r.reason for r in paired if not r.ok] == ["instance 0: crashed with SIGSEGV"]
    assert no_children_left()


def test_an_instance_failing_while_built_side_by_side_stops_its_plan_only() -> None:
    failing, good = plan_of("ok", "crash-early-when-held"), plan_of("ok")
    *_, first, second = series([failing, good, failing, good], 60)
    assert first.instances[0].reason == "stopped because instance 1 failed"
    assert first.instances[1].reason == "crashed with SIGSEGV"
    assert second.ok, second.reason
    assert no_children_left()


def test_a_plan_hanging_while_it_builds_times_out_and_the_other_runs() -> None:
    hanging, good = plan_of("hang-early-when-held"), plan_of("ok")
    *_, hung, fine = series([hanging, good, hanging, good], 2)
    assert hung.reason.startswith("instance 0: timed out after 2s before measuring")
    assert fine.ok, fine.reason
    assert no_children_left()


def test_a_plans_timeout_counts_its_build_and_its_turn_not_its_wait() -> None:
    slow = plan_of("slow-build", window_s=1.6)  # about 1 s building, then 1.7 s of its turn
    results = series([slow, slow, slow], 4)
    assert held(results[2])
    assert all(r.ok for r in results), [r.reason for r in results]  # the last ended over 4 s after it started


def test_a_series_closed_early_leaves_no_process() -> None:
    plans = run_series([plan_of("slow-build")] * 3, 60, available_mb=lambda: 1e6)
    assert next(plans).ok and next(plans).ok  # the second was built beside the third
    plans.close()
    assert no_children_left()


def test_each_plan_runs_alone_once_then_two_at_a_time() -> None:
    assert built_beside(10, 4) == 18  # a confirmation of 3 candidates in 10 rounds: 2 pairs a round after the first
    assert built_beside(1, 4) == built_beside(1, 1) == built_beside(8, 1) == 0
    assert built_beside(3, 5) == 4  # an odd round leaves one alone: rounds are series of their own


def test_a_series_over_several_calls_builds_what_succeeded_before_beside_another() -> None:
    """The confirmation calls one `Series` round by round: its second round pairs what its first
    ran alone, as one long series would."""
    rounds = Series(available_mb=lambda: 1e6)
    first = list(rounds([plan_of("ok")], 60))
    second = list(rounds([plan_of("ok")] * 2, 60))
    assert all(r.ok for r in first + second), [r.reason for r in first + second]
    assert not held(first[0]) and [held(r) for r in second] == [True, True]  # built together from the start
    assert not any(held(r) for r in series([plan_of("ok")] * 2, 60)[:1])  # a new series knows nothing yet
