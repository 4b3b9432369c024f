from __future__ import annotations

import gc
import os
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.config import space_fit
from autotune.host import capabilities, topology
from autotune.host.capabilities import PROBE_DIR_ENV
from autotune.host.libs import Libraries
from autotune.host.lock import LOCK_ENV
from autotune.host.machine import Machine
from autotune.host.topology import Topology, from_lscpu_file
from autotune.model import backends
from autotune.model.knobs import PEER_BACKENDS

pytest.register_assert_rewrite("tests.support")  # before they are imported: their asserts explain failures too
from tests.support import probes  # noqa: E402
from tests.support.pg import NoServer, Server, server  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent  # the repository
FIXTURES = Path(__file__).parent / "fixtures"

# A suite started as a shell's background job (`sh -c '...' &`) ignores SIGINT, every process it
# starts inherits that, and Python then installs no Ctrl-C handler: the tests that press Ctrl-C would
# wait in vain. A handler of the suite's own is reset to the default in each child, so they hear it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The tests' autotune processes keep one kernel probe for this host (under test-artifacts/, which git
# ignores), so that the suite probes once per machine; and the marks below read it.
os.environ.setdefault(PROBE_DIR_ENV, str(ROOT / "test-artifacts" / "probe"))
HOST_PROBE = capabilities.load(ROOT / "test-artifacts", len(topology.detect().usable_cores))


def _refused(precision: str, runtime: str = "torch") -> str:
    return next(filter(None, (HOST_PROBE.refusal(runtime, precision, op) for op in ("conv", "matmul"))), "")


# Tests that run bf16 or int8 in an autotune process need a CPU whose kernel probe offers them (their
# refusal is tested with made-up probes: host/test_capabilities.py, config/test_space.py, test_int8.py).
# The machines this suite runs on differ: an AMD EPYC with avx512_bf16 and VNNI, another with AVX2 only.
NEEDS_BF16 = pytest.mark.skipif(bool(_refused("bf16")),
                                reason=f"this CPU's kernel probe refuses bf16: {_refused('bf16')}")
NEEDS_PEERS = pytest.mark.skipif(not (backends.installed("openvino") and backends.installed("onnxruntime")),
                                 reason="OpenVINO or ONNX Runtime is not installed (./setup.sh installs both)")
NEEDS_INT8 = pytest.mark.skipif(bool(_refused("int8")),
                                reason=f"this CPU's kernel probe refuses int8: {_refused('int8')}")


@pytest.fixture(autouse=True)
def made_up_probe(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search or bench in this process sees a CPU where every precision runs (`tests.support.probes`),
    whatever this one is, unless the test runs real benchmarks (e2e) or tests the probe itself (real_probe)."""
    if request.node.get_closest_marker("e2e") or request.node.get_closest_marker("real_probe"):
        return
    monkeypatch.setattr(capabilities, "load", lambda *args, **kwargs: probes.everything_runs())


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


@pytest.fixture
def peer_runtimes(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Which peer runtimes (OpenVINO, ONNX Runtime) a search in this process sees installed: none,
    whatever this environment holds, until a test sets an entry True (`peer_runtimes["openvino"] = True`)."""
    installed = {backend: False for backend in PEER_BACKENDS}
    monkeypatch.setattr(space_fit, "runtimes_installed", lambda generates=False: dict(installed))
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
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama as an F32 GGUF file with a byte-level vocabulary (`tests.support.gguf_files`);
    skipped without the `gguf` package that writes it."""
    pytest.importorskip("gguf", reason="the gguf package writes the test's GGUF file (pip install gguf)")
    from tests.support.gguf_files import write_tiny_gguf

    folder = tmp_path_factory.mktemp("gguf")
    return write_tiny_gguf(folder / "Tiny-Llama.F32.gguf", folder)


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
