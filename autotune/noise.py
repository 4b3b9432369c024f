"""What else used the machine while a plan measured: other processes' CPU time, steal, load."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from autotune.results import InstanceResult


@dataclass(frozen=True)
class Snapshot:
    at: float
    busy_s: float
    steal_s: float
    load1: float


def snapshot() -> Snapshot:
    """CPU time of the CPUs this process may use (not a container host's other cores)."""
    per_cpu = psutil.cpu_times(percpu=True)
    mine = [per_cpu[c] for c in sorted(os.sched_getaffinity(0)) if c < len(per_cpu)] or per_cpu
    busy = steal = 0.0
    for times in mine:
        cpu_steal = getattr(times, "steal", 0.0)
        busy += sum(times) - times.idle - getattr(times, "iowait", 0.0) - cpu_steal
        steal += cpu_steal
    return Snapshot(time.monotonic(), busy, steal, os.getloadavg()[0])


def noise(before: Snapshot, after: Snapshot, results: Sequence[InstanceResult]) -> dict[str, float]:
    """Other processes' CPU (busy time not spent by our children), hypervisor steal, and the
    load average on both sides of the measuring window."""
    window = max(after.at - before.at, 1e-9)
    ours = sum(float(r.metrics.get("cpu_s", 0.0)) for r in results if r.ok)
    cpus = len(os.sched_getaffinity(0))
    other = max(after.busy_s - before.busy_s - ours, 0.0)
    return {"window_s": round(window, 3), "own_cpu_s": round(ours, 3), "other_cpu_s": round(other, 3),
            "other_cpu_share": round(other / (window * cpus), 4),
            "steal_share": round((after.steal_s - before.steal_s) / (window * cpus), 4),
            "load_before": before.load1, "load_after": after.load1}
