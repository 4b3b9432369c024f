"""This machine's CPU time as the kernel counts it, and what share of it others took.

CPU time comes from /proc/stat, one `cpuN` line per CPU keyed by its id (ids can have gaps: offline
or hot-plugged CPUs). Its columns are user nice system idle iowait irq softirq steal guest
guest_nice, in USER_HZ ticks; the kernel already counts guest time in user and guest_nice in nice,
so the guest columns are not added again. Read around a measuring window (`measure/noise.py`) and
around the kernel probe (`capabilities.run_child`): what other processes and the hypervisor took
while something measured is one rule, `busy_reason`.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from autotune.base.thresholds import BUSY_MACHINE

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


def children_cpu_s() -> float:
    """CPU seconds (user and system) of this process's children that have ended and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def others(before: Snapshot, after: Snapshot, own_cpu_s: float) -> tuple[float, float]:
    """Between two snapshots, the share of the CPUs' capacity that other processes (busy time not
    `own_cpu_s`, what the measured processes spent) and the hypervisor (steal) took."""
    capacity = max(after.at - before.at, 1e-9) * max(before.cpus, 1)
    other = max(after.busy_s - before.busy_s - own_cpu_s, 0.0)
    return other / capacity, (after.steal_s - before.steal_s) / capacity


def busy_reason(other_share: float, steal_share: float) -> str:
    """Why a window shared the machine, or "": other processes' or the hypervisor's share of the
    CPUs above BUSY_MACHINE."""
    reasons = []
    if other_share > BUSY_MACHINE:
        reasons.append(f"other processes used {other_share:.0%} of the CPUs > {BUSY_MACHINE:.0%}")
    if steal_share > BUSY_MACHINE:
        reasons.append(f"the hypervisor took {steal_share:.0%} of the CPUs (steal) > {BUSY_MACHINE:.0%}")
    return "; ".join(reasons)
