from __future__ import annotations

from pathlib import Path

import pytest

from autotune.libs import Libraries
from autotune.topology import Topology, from_lscpu_file

FIXTURES = Path(__file__).parent / "fixtures"


def lscpu(name: str) -> Topology:
    return from_lscpu_file(FIXTURES / "lscpu" / f"{name}.txt")


@pytest.fixture
def fake_libs() -> Libraries:
    """Every library present at a made-up path, numactl usable: plans without touching the system."""
    return Libraries(
        paths={
            "libiomp5": Path("/opt/env/lib/libiomp5.so"),
            "libomp": Path("/usr/lib/x86_64-linux-gnu/libomp.so.5"),
            "jemalloc": Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
            "tcmalloc": Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
        },
        numactl=Path("/usr/bin/numactl"),
        numactl_usable=True,
        taskset=Path("/usr/bin/taskset"),
    )
