"""One run's result: a warmed process's window cut into the parts its replicates are."""

from __future__ import annotations

import pytest

from tests.support.studies import fake_result


def test_a_window_cut_into_parts_keeps_every_sample_in_order_and_splits_time_evenly() -> None:
    run = fake_result([10.0] * 10 + [20.0] * 5)  # iterations of 11 and 21 ms: 215 ms in all
    parts = run.parts(3)
    assert len(parts) == 3 and all(p.ok for p in parts)
    cut = [p.instances[0].metrics for p in parts]
    assert [x for m in cut for x in m["latencies_ms"]] == run.instances[0].metrics["latencies_ms"]
    assert [len(m["latencies_ms"]) for m in cut] == [7, 5, 3]  # each part ends where 1/3 of the time is crossed
    for m in cut:
        assert abs(m["window_s"] - 0.215 / 3) <= 0.021  # within one iteration of a third
        assert m["throughput_ips"] == pytest.approx(m["items"] / m["window_s"])
        assert m["peak_rss_mb"] == run.instances[0].metrics["peak_rss_mb"]  # the process's, in every part
    assert sum(m["items"] for m in cut) == pytest.approx(15)
    assert sum(p.wall_s for p in parts) == pytest.approx(run.wall_s)
    assert run.parts(1) == (run,)


def test_a_part_never_comes_out_empty() -> None:
    run = fake_result([1.0, 1.0, 50.0, 1.0])  # the long iteration crosses two of the three cuts
    assert [len(p.instances[0].metrics["latencies_ms"]) for p in run.parts(3)] == [1, 2, 1]
