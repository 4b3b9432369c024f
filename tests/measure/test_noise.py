"""What else ran on the measured CPUs during a run's window: CPU-time accounting from /proc/stat."""

from __future__ import annotations

import pytest

from autotune.host import cpustat
from autotune.measure import noise
from autotune.measure.results import InstanceResult

HZ = cpustat.TICKS_PER_S
# CPU ids with gaps (1, 3 and 4 offline), guest time inside user and guest_nice inside nice.
PROC_STAT = """cpu  9000 900 900 9000 90 9 9 90 900 90
cpu0 1000 0 100 5000 10 0 0 0 0 0
cpu2 300 20 100 4000 50 5 5 30 200 10
cpu5 100 0 50 4000 0 0 0 10 0 0
intr 1 2 3
"""


def test_cpu_times_are_keyed_by_cpu_id_and_guest_time_counts_once() -> None:
    per_cpu = cpustat.parse_proc_stat(PROC_STAT)
    assert sorted(per_cpu) == [0, 2, 5]
    assert per_cpu[2] == cpustat.CpuTime((300 + 20 + 100 + 5 + 5) / HZ, 30 / HZ)


def test_a_snapshot_counts_only_this_process_cpus() -> None:
    snap = cpustat.snapshot(lambda: PROC_STAT, cpus={2, 5, 7})
    assert snap is not None and snap.cpus == 2
    assert snap.busy_s == pytest.approx((430 + 150) / HZ)
    assert snap.steal_s == pytest.approx(40 / HZ)


def test_no_proc_stat_means_no_noise_record() -> None:
    def unreadable() -> str:
        raise FileNotFoundError("/proc/stat")

    assert cpustat.snapshot(unreadable) is None


def test_other_cpu_share_is_over_the_window_and_the_cpus_measured() -> None:
    before = cpustat.Snapshot(at=10.0, busy_s=100.0, steal_s=1.0, cpus=2, load1=0.5)
    after = cpustat.Snapshot(at=12.0, busy_s=103.0, steal_s=1.4, cpus=2, load1=0.7)
    mine = InstanceResult(0, True, "", 0, "", {"cpu_s": 2.0})
    found = noise.noise(before, after, [mine])
    assert found["other_cpu_share"] == 0.25 and found["steal_share"] == 0.1 and found["window_s"] == 2.0
