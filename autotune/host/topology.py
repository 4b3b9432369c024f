"""What CPUs this machine (or a described one) has and which of them autotune may use.

The source of truth is `lscpu --parse=CPU,Core,Socket,Node` text, so another machine can be
described by saving that command's output and passing it with `--lscpu FILE`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autotune.base.errors import TopologyError

LSCPU_ARGS = ("lscpu", "--parse=CPU,Core,Socket,Node")


@dataclass(frozen=True, order=True)
class LogicalCpu:
    """One logical CPU as lscpu reports it; `core` is unique only together with `socket`."""

    socket: int
    core: int
    node: int
    cpu: int


@dataclass(frozen=True)
class PhysicalCore:
    """A physical core: its usable logical CPUs (SMT siblings), first one preferred for binding."""

    socket: int
    core: int
    node: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    """All logical CPUs of a machine plus the subset this process may run on."""

    cpus: tuple[LogicalCpu, ...]
    allowed: frozenset[int]

    @property
    def sockets(self) -> tuple[int, ...]:
        return tuple(sorted({c.socket for c in self.cpus}))

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({c.node for c in self.cpus}))

    @property
    def all_cores(self) -> tuple[PhysicalCore, ...]:
        return _group_cores(self.cpus)

    @property
    def usable_cores(self) -> tuple[PhysicalCore, ...]:
        """Physical cores with at least one allowed logical CPU, listing only allowed CPUs."""
        return _group_cores(c for c in self.cpus if c.cpu in self.allowed)

    @property
    def threads_per_core(self) -> int:
        return max((len(core.cpus) for core in self.all_cores), default=1)

    def smt_siblings(self) -> dict[int, tuple[int, ...]]:
        """Each logical CPU mapped to the other logical CPUs of its physical core."""
        return {
            cpu: tuple(c for c in core.cpus if c != cpu)
            for core in self.all_cores
            for cpu in core.cpus
        }


def _group_cores(cpus: Iterable[LogicalCpu]) -> tuple[PhysicalCore, ...]:
    groups: dict[tuple[int, int], list[LogicalCpu]] = {}
    for cpu in sorted(cpus):
        groups.setdefault((cpu.socket, cpu.core), []).append(cpu)
    cores = [
        PhysicalCore(socket, core, members[0].node, tuple(sorted(m.cpu for m in members)))
        for (socket, core), members in groups.items()
    ]
    return tuple(sorted(cores, key=lambda c: (c.node, c.socket, c.cpus[0])))


def parse_lscpu(text: str, source: str = "lscpu output") -> tuple[LogicalCpu, ...]:
    """Parse `lscpu --parse=CPU,Core,Socket,Node`; an empty Node field (no NUMA) means node 0."""
    cpus = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        cpus.append(_parse_lscpu_line(line, number, source))
    if not cpus:
        raise TopologyError(
            f"{source} lists no CPUs; give the output of `{' '.join(LSCPU_ARGS)}`"
        )
    if len({c.cpu for c in cpus}) != len(cpus):
        raise TopologyError(f"{source} lists the same CPU id twice; is it two files joined?")
    return tuple(cpus)


def _parse_lscpu_line(line: str, number: int, source: str) -> LogicalCpu:
    fields = line.split(",")
    try:
        if len(fields) < 3:
            raise ValueError
        cpu, core, socket = (int(f) for f in fields[:3])
        node = int(fields[3]) if len(fields) > 3 and fields[3] != "" else 0
    except ValueError:
        raise TopologyError(
            f"{source} line {number}: expected CPU,Core,Socket,Node numbers, got {line!r}; "
            f"make it with `{' '.join(LSCPU_ARGS)}`"
        ) from None
    return LogicalCpu(socket=socket, core=core, node=node, cpu=cpu)


def from_lscpu_file(path: Path) -> Topology:
    """A described machine: every CPU in the file is usable (unless lines are commented out)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TopologyError(
            f"cannot read --lscpu file {str(path)!r}: {reason}; "
            f"save `{' '.join(LSCPU_ARGS)}` from the target machine into it"
        ) from None
    cpus = parse_lscpu(text, source=f"--lscpu file {str(path)!r}")
    return Topology(cpus=cpus, allowed=frozenset(c.cpu for c in cpus))


def detect() -> Topology:
    """This machine, restricted to the CPUs this process may run on (affinity and cpuset)."""
    allowed = frozenset(os.sched_getaffinity(0))
    try:
        out = subprocess.run(LSCPU_ARGS, capture_output=True, text=True, check=True, timeout=30)
        cpus = parse_lscpu(out.stdout)
    except (OSError, subprocess.SubprocessError, TopologyError):
        cpus = _from_sysfs(Path("/sys/devices/system/cpu"), allowed)
    return Topology(cpus=cpus, allowed=allowed & {c.cpu for c in cpus})


def _from_sysfs(root: Path, allowed: frozenset[int]) -> tuple[LogicalCpu, ...]:
    """Fallback when lscpu is missing: read core and package ids from sysfs."""
    cpus = []
    for cpu in sorted(allowed):
        topo = root / f"cpu{cpu}" / "topology"
        try:
            core = int((topo / "core_id").read_text())
            socket = int((topo / "physical_package_id").read_text())
        except (OSError, ValueError):
            core, socket = cpu, 0
        nodes = sorted(root.glob(f"cpu{cpu}/node*"))
        node = int(nodes[0].name[4:]) if nodes else 0
        cpus.append(LogicalCpu(socket=socket, core=core, node=node, cpu=cpu))
    return tuple(cpus)


def cpu_quota() -> float | None:
    """The cgroup v2 CPU quota in cores (`cpu.max`), or None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def format_cpus(cpus: Iterable[int]) -> str:
    """Compact list as numactl and taskset take it: 0-3,8,10-11."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(ranges)
