"""This machine (or a described one) as autotune sees it: topology, libraries, CPU features."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.host import libs, topology
from autotune.host.libs import Libraries
from autotune.host.topology import Topology, format_cpus
from autotune.model import backends, cpu
from autotune.model.cpu import ISA_FLAGS, cpuinfo

# For tests only: the name this process gives its host, so that processes on one machine act as
# the workers of several hosts. Never set it on a real fleet.
TEST_HOST_ENV = "AUTOTUNE_TEST_HOST_ID"


@dataclass(frozen=True)
class Machine:
    topology: Topology
    libs: Libraries
    described: bool = False  # True when planning for a machine given by --lscpu


def this_machine() -> Machine:
    topo = topology.detect()
    first = topo.usable_cores[0] if topo.usable_cores else None
    probe = (first.cpus[0], first.node) if first else None
    return Machine(topo, libs.discover(probe_cpu=probe))


def described_machine(lscpu: Path) -> Machine:
    """Another machine: its CPUs from the file, libraries as found here (their paths may differ)."""
    return Machine(topology.from_lscpu_file(lscpu), libs.discover(), described=True)


def torch_versions() -> dict[str, str | None]:
    import torch

    config = torch.__config__.show()
    onednn = re.search(r"(?:oneDNN|MKL-DNN) v([\w.]+)", config)
    return {
        "torch": torch.__version__,
        "onednn": onednn.group(1) if onednn else None,
        "mkldnn_available": str(torch.backends.mkldnn.is_available()).lower(),
    }


def fingerprint(machine: Machine) -> dict[str, Any]:
    """What makes timings from two hosts incomparable: CPU model and ISA, cores, memory. Not the
    hostname, which a container changes on every start."""
    topo = machine.topology
    return {"cpu_model": cpuinfo()[0], "isa": list(cpu.isa()), "sockets": len(topo.sockets),
            "physical_cores": len(topo.all_cores), "logical_cpus": len(topo.cpus),
            "usable_physical_cores": len(topo.usable_cores), "memory_gib": memory_gib()}


def host_class(machine: Machine) -> dict[str, Any]:
    """What must match for timings of two hosts to share one ranking: the fingerprint, NUMA nodes,
    torch and oneDNN, the kernel."""
    versions = torch_versions()
    return {**fingerprint(machine), "numa_nodes": len(machine.topology.nodes), "torch": versions["torch"],
            "onednn": versions["onednn"], "kernel": platform.release()}


def class_id(host_class: dict[str, Any]) -> str:
    """A short name for a host class (8 hex digits of its digest)."""
    return hashlib.sha256(json.dumps(host_class, sort_keys=True).encode()).hexdigest()[:8]


def host_name() -> str:
    """Who this host is in a study's records: its hostname (or the tests' override)."""
    return os.environ.get(TEST_HOST_ENV) or socket.gethostname()


def host_identity(machine: Machine) -> dict[str, str]:
    """Which host did something, for a study's records: its name and its class id."""
    return {"host": host_name(), "host_class": class_id(host_class(machine))}


def memory_gib() -> int | None:
    """Total memory, rounded to GiB (the kernel's own reservations vary by a few MiB per boot)."""
    try:
        found = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return round(int(found.group(1)) / 2**20) if found else None


def report(machine: Machine) -> dict[str, Any]:
    """Everything `autotune doctor` shows, as plain data."""
    topo, found = machine.topology, machine.libs
    model, flags = cpuinfo()
    siblings = {c: s for c, s in topo.smt_siblings().items() if s}
    return {
        "cpu_model": model,
        "sockets": len(topo.sockets),
        "physical_cores": len(topo.all_cores),
        "logical_cpus": len(topo.cpus),
        "threads_per_core": topo.threads_per_core,
        "smt_siblings": {str(c): list(s) for c, s in siblings.items()},
        "numa_nodes": len(topo.nodes),
        "usable_cpus": format_cpus(topo.allowed),
        "usable_physical_cores": len(topo.usable_cores),
        "cpu_quota_cores": topology.cpu_quota(),
        "isa": {flag: flag in flags for flag in ISA_FLAGS},
        "isa_limits": cpu.isa_limits(),
        **torch_versions(),
        "libraries": {
            name: {"path": str(path) if path else None,
                   "install": None if path else libs.LIBRARIES[name].install}
            for name, path in found.paths.items()
        },
        "numactl": {"path": str(found.numactl) if found.numactl else None,
                    "usable": found.numactl_usable, "problem": found.numactl_problem or None,
                    "install": None if found.numactl else libs.NUMACTL_INSTALL},
        "taskset": str(found.taskset) if found.taskset else None,
        "runtimes": runtimes_report(),
    }


def runtimes_report() -> dict[str, dict[str, Any]]:
    """Each backend that needs packages beyond torch, to run a model (its name) or to generate text
    (its name with ` generate`): their versions (None: missing) and, where one is missing, the
    command that installs them."""
    found: dict[str, dict[str, Any]] = {}
    for b in backends.REGISTRY:
        for generates, name in ((False, b.name), (True, f"{b.name} generate")):
            packages = backends.needs(b.name, generates)
            if packages:
                found[name] = {"name": packages.name, "versions": packages.versions(),
                               "install": None if backends.installed(b.name, generates) else packages.install}
    return found
