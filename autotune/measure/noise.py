"""What else used the machine while a plan measured: other processes' CPU time, steal, load
(read from /proc/stat by `host/cpustat.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.host.cpustat import Snapshot, others
from autotune.measure.results import InstanceResult


def noise(before: Snapshot, after: Snapshot, results: Sequence[InstanceResult]) -> Mapping[str, float]:
    """Other processes' CPU (busy time not spent by our children in their timed loops), hypervisor
    steal, and the load average on both sides of the measuring window."""
    window = max(after.at - before.at, 1e-9)
    ours = sum(float(r.metrics.get("cpu_s", 0.0)) for r in results if r.ok)
    other_share, steal_share = others(before, after, ours)
    return {"window_s": round(window, 3), "own_cpu_s": round(ours, 3),
            "other_cpu_s": round(other_share * window * max(before.cpus, 1), 3),
            "other_cpu_share": round(other_share, 4), "steal_share": round(steal_share, 4),
            "load_before": before.load1, "load_after": after.load1}
