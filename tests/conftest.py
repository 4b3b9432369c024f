from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.child import cpu, runtimes
from autotune.child.knobs import PEER_BACKENDS
from autotune.config import space_fit
from autotune.host.libs import Libraries
from autotune.host.lock import LOCK_ENV
from autotune.host.machine import Machine
from autotune.host.topology import Topology, from_lscpu_file

pytest.register_assert_rewrite("tests.support")  # before they are imported: their asserts explain failures too
from tests.support.pg import NoServer, Server, server  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent  # the repository
FIXTURES = Path(__file__).parent / "fixtures"

# Tests that run bf16 or int8 in an autotune process need a CPU where autotune allows them (its
# refusal elsewhere is tested with a made-up CPU: child/test_deploy.py, test_int8.py, config/test_space.py).
# The machines this suite runs on differ: an AMD EPYC with avx512_bf16 and VNNI, another with AVX2 only.
NEEDS_BF16 = pytest.mark.skipif(not cpu.has_bf16(), reason=f"{cpu.cpuinfo()[0]} has neither avx512_bf16 nor AMX, "
                                                           f"where autotune refuses precision=bf16")
NEEDS_PEERS = pytest.mark.skipif(not (runtimes.installed("openvino") and runtimes.installed("onnxruntime")),
                                 reason="OpenVINO or ONNX Runtime is not installed (./setup.sh installs both)")
NEEDS_INT8 = pytest.mark.skipif(not cpu.has_int8(), reason=f"{cpu.cpuinfo()[0]} has no VNNI or AMX, where "
                                                           f"autotune refuses precision=int8")


def lscpu(name: str) -> Topology:
    return from_lscpu_file(FIXTURES / "lscpu" / f"{name}.txt")


@pytest.fixture
def bf16_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 allowed in this process whatever the CPU: autotune refuses it where the CPU lacks
    avx512_bf16 and AMX because it is slow there, but torch computes it on any x86 CPU, so the
    answers and plumbing a test checks in-process hold everywhere."""
    monkeypatch.setattr(cpu, "has_bf16", lambda: True)


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


@pytest.fixture
def peer_runtimes(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Which peer runtimes (OpenVINO, ONNX Runtime) a search in this process sees installed: none,
    whatever this environment holds, until a test sets an entry True (`peer_runtimes["openvino"] = True`)."""
    installed = {backend: False for backend in PEER_BACKENDS}
    monkeypatch.setattr(space_fit, "runtimes_installed", lambda: dict(installed))
    return installed


@pytest.fixture
def here(fake_libs: Libraries, peer_runtimes: dict[str, bool]) -> Machine:
    """The machine a search without processes runs on: the 1-socket AMD with SMT (8 usable physical
    cores), every library present, no peer runtime (`peer_runtimes` adds them)."""
    return Machine(lscpu("amd_1s_smt"), fake_libs)


@pytest.fixture(autouse=True, scope="session")
def private_machine_lock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tests' own machine lock (inherited by the autotune processes they start): a test never
    waits for a real autotune measuring on this machine, nor holds one up."""
    path = tmp_path_factory.mktemp("lock") / "autotune.host.lock"
    before = os.environ.get(LOCK_ENV)
    os.environ[LOCK_ENV] = str(path)
    yield path
    if before is None:
        del os.environ[LOCK_ENV]
    else:
        os.environ[LOCK_ENV] = before


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT sequence classifier saved with save_pretrained (`tests.support.hf`): `hf:<this folder>`."""
    from tests.support.hf import save_tiny_bert

    return save_tiny_bert(tmp_path_factory.mktemp("hf") / "tiny-bert")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    """One PostgreSQL server for the session's @pytest.mark.postgres tests. Missing binaries fail
    these tests (CI installs them), never skip them."""
    try:
        with server() as running:
            yield running
    except NoServer as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def pg_url(pg_server: Server) -> Iterator[str]:
    """A fresh database of its own for one test. Optuna's storages keep pooled connections that
    only the garbage collector closes: collected here, so that their warning is not an error."""
    yield pg_server.new_database()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
