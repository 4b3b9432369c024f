"""Whether a process recorded earlier still runs, told from what it recorded of itself: its pid,
where that pid means something (this kernel's boot and pid namespace), and when it started (a pid
is reused once its process is gone)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from autotune.base.thresholds import SAME_START_S

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
PID_NAMESPACE = "/proc/self/ns/pid"


def alive(pid: int) -> bool:
    """A process with this pid exists (perhaps another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_time(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), or None when there is none."""
    try:
        return round(float(psutil.Process(pid).create_time()), 2)
    except psutil.Error:
        return None


def pid_space() -> str:
    """Where this process's pid names one process: this boot of the kernel and this pid namespace
    (a container has its own). "" where the system does not say (then no pid is judged)."""
    try:
        return f"{BOOT_ID.read_text().strip()}/{os.readlink(PID_NAMESPACE)}"
    except OSError:
        return ""


def gone(pid: int, space: str, started: float | None) -> bool:
    """Process `pid` of pid space `space`, started at `started` (None: not recorded), provably no
    longer runs: the space is this process's, and no process has that pid, or the one that has it
    started at another time (its pid was reused). False when that cannot be told from here."""
    if not space or space != pid_space():
        return False
    if not alive(pid):
        return True
    now = start_time(pid)
    return started is not None and now is not None and abs(now - started) > SAME_START_S
