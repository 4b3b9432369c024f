"""How one run is measured: CPU-time accounting, the noise flag, peak memory, what a trial stores."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune.child import worker
from autotune.measure import noise, replicates
from autotune.measure.results import InstanceResult, RunResult
from autotune.study import records

HZ = noise.TICKS_PER_S
# CPU ids with gaps (1, 3 and 4 offline), guest time inside user and guest_nice inside nice.
PROC_STAT = """cpu  9000 900 900 9000 90 9 9 90 900 90
cpu0 1000 0 100 5000 10 0 0 0 0 0
cpu2 300 20 100 4000 50 5 5 30 200 10
cpu5 100 0 50 4000 0 0 0 10 0 0
intr 1 2 3
"""


def test_cpu_times_are_keyed_by_cpu_id_and_guest_time_counts_once() -> None:
    per_cpu = noise.parse_proc_stat(PROC_STAT)
    assert sorted(per_cpu) == [0, 2, 5]
    assert per_cpu[2] == noise.CpuTime((300 + 20 + 100 + 5 + 5) / HZ, 30 / HZ)


def test_a_snapshot_counts_only_this_process_cpus() -> None:
    snap = noise.snapshot(lambda: PROC_STAT, cpus={2, 5, 7})
    assert snap is not None and snap.cpus == 2
    assert snap.busy_s == pytest.approx((430 + 150) / HZ)
    assert snap.steal_s == pytest.approx(40 / HZ)


def test_no_proc_stat_means_no_noise_record() -> None:
    def unreadable() -> str:
        raise FileNotFoundError("/proc/stat")

    assert noise.snapshot(unreadable) is None


def test_other_cpu_share_is_over_the_window_and_the_cpus_measured() -> None:
    before = noise.Snapshot(at=10.0, busy_s=100.0, steal_s=1.0, cpus=2, load1=0.5)
    after = noise.Snapshot(at=12.0, busy_s=103.0, steal_s=1.4, cpus=2, load1=0.7)
    mine = InstanceResult(0, True, "", 0, "", {"cpu_s": 2.0})
    found = noise.noise(before, after, [mine])
    assert found["other_cpu_share"] == 0.25 and found["steal_share"] == 0.1 and found["window_s"] == 2.0


def run_with(latencies: list[float], other_cpu_share: float) -> RunResult:
    metrics = {"latencies_ms": latencies, "iterations_ms": latencies, "throughput_ips": 100.0, "peak_rss_mb": 50.0,
               "setup_peak_rss_mb": 80.0, "window_s": 2.0, "items": len(latencies), "cpu_s": 1.0}
    return RunResult(True, "", (InstanceResult(0, True, "", 0, "", metrics),), 2.0,
                     {"other_cpu_share": other_cpu_share})


def test_other_processes_busy_on_the_cpus_flag_the_measurement_noisy() -> None:
    steady = [10.0, 10.1, 10.0, 9.9, 10.0]
    quiet = replicates.Measurement((run_with(steady, 0.1), run_with(steady, 0.2)))
    assert not quiet.noisy and quiet.summary()["noisy_reason"] == ""
    busy = replicates.Measurement((run_with(steady, 0.1), run_with(steady, 0.88)))
    summary = busy.summary()
    assert summary["noisy"] is True and summary["other_cpu_share_max"] == 0.88
    assert summary["noisy_reason"] == "other processes used 88% of the CPUs > 25%"


def test_both_reasons_are_recorded() -> None:
    spread = replicates.Measurement((run_with([10.0, 20.0, 30.0, 40.0], 0.9),))
    assert spread.noisy_reason == "IQR/median 60% > 10%; other processes used 90% of the CPUs > 25%"


def test_a_trial_stores_a_bounded_summary_of_200k_samples() -> None:
    samples = [10.0 + (i % 997) / 100 for i in range(200_000)]
    measurement = replicates.Measurement((run_with(samples, 0.1),))
    study = optuna.create_study()
    trial = study.ask()
    start = time.monotonic()
    records.record_metrics(trial, measurement, None)
    assert time.monotonic() - start < 5
    attrs = study.get_trials()[0].user_attrs
    assert len(json.dumps(attrs)) < 4000
    assert attrs["samples"] == 200_000 and "samples_ms" not in attrs
    percentiles = attrs["latency_percentiles_ms"]
    assert len(percentiles) == 101 and percentiles[0] == 10.0 and percentiles[100] == 19.96
    assert percentiles[50] == attrs["latency_p50_ms"]


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
