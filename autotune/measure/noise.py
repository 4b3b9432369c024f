"""What else used the machine while a plan measured: other processes' CPU time, steal, load.

CPU time comes from /proc/stat, one `cpuN` line per CPU keyed by its id (ids can have gaps: offline
or hot-plugged CPUs). Its columns are user nice system idle iowait irq softirq steal guest
guest_nice, in USER_HZ ticks; the kernel already counts guest time in user and guest_nice in nice,
so the guest columns are not added again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.measure.results import InstanceResult

PROC_STAT = Path("/proc/stat")
BUSY_COLUMNS = (0, 1, 2, 5, 6)  # user, nice, system, irq, softirq (guest is inside user and nice)
STEAL_COLUMN = 7
TICKS_PER_S = float(os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class CpuTime:
    busy_s: float
    steal_s: float


@dataclass(frozen=True)
class Snapshot:
    at: float
    busy_s: float
    steal_s: float
    cpus: int
    load1: float


def parse_proc_stat(text: str) -> dict[int, CpuTime]:
    """Busy and steal seconds per CPU id, from the text of /proc/stat."""
    per_cpu = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        ticks = [int(x) for x in rest.split()] + [0] * 10  # old kernels have fewer columns
        per_cpu[int(name[3:])] = CpuTime(sum(ticks[i] for i in BUSY_COLUMNS) / TICKS_PER_S,
                                         ticks[STEAL_COLUMN] / TICKS_PER_S)
    return per_cpu


def _read_proc_stat() -> str:
    return PROC_STAT.read_text()


def snapshot(read_stat: Callable[[], str] = _read_proc_stat,
             cpus: Collection[int] | None = None) -> Snapshot | None:
    """CPU time of the CPUs this process may use (not a container host's other cores), or None
    where /proc/stat cannot be read (then no noise is recorded)."""
    try:
        per_cpu = parse_proc_stat(read_stat())
    except (OSError, ValueError):
        return None
    wanted = os.sched_getaffinity(0) if cpus is None else cpus
    mine = [per_cpu[c] for c in sorted(wanted) if c in per_cpu] or list(per_cpu.values())
    return Snapshot(time.monotonic(), sum(t.busy_s for t in mine), sum(t.steal_s for t in mine),
                    len(mine), os.getloadavg()[0])


def noise(before: Snapshot, after: Snapshot, results: Sequence[InstanceResult]) -> Mapping[str, float]:
    """Other processes' CPU (busy time not spent by our children in their timed loops), hypervisor
    steal, and the load average on both sides of the measuring window."""
    window = max(after.at - before.at, 1e-9)
    ours = sum(float(r.metrics.get("cpu_s", 0.0)) for r in results if r.ok)
    capacity = window * max(before.cpus, 1)
    other = max(after.busy_s - before.busy_s - ours, 0.0)
    return {"window_s": round(window, 3), "own_cpu_s": round(ours, 3), "other_cpu_s": round(other, 3),
            "other_cpu_share": round(other / capacity, 4),
            "steal_share": round((after.steal_s - before.steal_s) / capacity, 4),
            "load_before": before.load1, "load_after": after.load1}
