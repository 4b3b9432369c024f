"""One run's result: a warmed process's window cut into the parts its replicates are."""

from __future__ import annotations

import pytest

from autotune.measure.results import InstanceResult, RunResult
from tests.support.studies import fake_result


def instance(index: int, iterations_ms: list[float], late_start_s: float = 0.0) -> InstanceResult:
    """An instance that heard `go` `late_start_s` after START and ran `iterations_ms` back to back,
    as the child records it (its span: from START to its last iteration's end)."""
    window_s = sum(iterations_ms) / 1e3
    metrics = {"latencies_ms": iterations_ms, "iterations_ms": iterations_ms, "items": len(iterations_ms),
               "late_start_s": late_start_s, "window_s": window_s, "span_s": late_start_s + window_s,
               "throughput_ips": len(iterations_ms) / (late_start_s + window_s), "peak_rss_mb": 1.0}
    return InstanceResult(index, True, "", 0, "", metrics)


def test_throughput_counts_the_common_window_not_each_instances_own_time() -> None:
    """A window of 1 s: instance 0 on time, 10 iterations of 100 ms; instance 1 heard `go` 0.2 s
    late and its 8th iteration of 110 ms straddles END, ending at 1.08 s. The machine delivered 18
    items in 1.08 s; each instance's own rate summed (10 + 8/0.88) said 19.1 items/s."""
    run = RunResult(True, "", (instance(0, [100.0] * 10), instance(1, [110.0] * 8, late_start_s=0.2)), 1.2)
    assert run.throughput_ips == pytest.approx(18 / 1.08)


def test_fresh_and_warm_replicates_of_the_same_samples_give_the_same_throughput() -> None:
    samples = [[10.0] * 12, [12.0] * 10, [15.0] * 8]  # 120 ms each
    fresh = [RunResult(True, "", (instance(0, s),), 0.12) for s in samples]
    warm = RunResult(True, "", (instance(0, [x for s in samples for x in s]),), 0.36).parts(3)
    assert [r.throughput_ips for r in warm] == pytest.approx([r.throughput_ips for r in fresh])
    assert [r.throughput_ips for r in fresh] == pytest.approx([100.0, 1000 / 12, 1000 / 15])


def test_a_window_cut_into_parts_keeps_every_sample_in_order_and_splits_time_evenly() -> None:
    run = fake_result([10.0] * 10 + [20.0] * 5)  # iterations of 11 and 21 ms: 215 ms in all
    parts = run.parts(3)
    assert len(parts) == 3 and all(p.ok for p in parts)
    cut = [p.instances[0].metrics for p in parts]
    assert [x for m in cut for x in m["latencies_ms"]] == run.instances[0].metrics["latencies_ms"]
    assert [len(m["latencies_ms"]) for m in cut] == [7, 5, 3]  # each part ends where 1/3 of the time is crossed
    for m in cut:
        assert abs(m["window_s"] - 0.215 / 3) <= 0.021  # within one iteration of a third
        assert m["throughput_ips"] == pytest.approx(m["items"] / m["span_s"])
        assert m["peak_rss_mb"] == run.instances[0].metrics["peak_rss_mb"]  # the process's, in every part
    assert sum(m["items"] for m in cut) == pytest.approx(15)
    assert sum(p.wall_s for p in parts) == pytest.approx(run.wall_s)
    assert sum(m["span_s"] for m in cut) == pytest.approx(1.0)  # the run's window, shared by the clock
    assert run.parts(1) == (run,)


def test_a_part_never_comes_out_empty() -> None:
    run = fake_result([1.0, 1.0, 50.0, 1.0])  # the long iteration crosses two of the three cuts
    assert [len(p.instances[0].metrics["latencies_ms"]) for p in run.parts(3)] == [1, 2, 1]
