from __future__ import annotations

import pytest

from autotune.base.errors import ConfigError
from autotune.config.knobs import Config


def test_empty_configuration_is_pytorch_defaults() -> None:
    config = Config.from_assignments([])
    assert config.values == ()
    assert config.describe() == "defaults"
    assert config.get("omp_runtime") == "gnu"
    assert config.get("omp_threads") is None


def test_values_are_typed_and_ordered_like_the_registry() -> None:
    config = Config.from_assignments(["allocator=jemalloc", "mkldnn=on", "omp_threads=2"])
    assert config.values == (("mkldnn", True), ("omp_threads", 2), ("allocator", "jemalloc"))
    assert config.describe() == "mkldnn=on omp_threads=2 allocator=jemalloc"


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("omp_thread=2", "unknown knob 'omp_thread'; did you mean omp_threads? knobs are: backend, mkldnn,"),
        ("allocator=jemaloc", "allocator=jemaloc is not allowed; use default, jemalloc, tcmalloc"),
        ("omp_threads=0", "omp_threads=0 is not allowed; use an integer from 1 to 4096"),
        ("mkldnn=maybe", "mkldnn=maybe is not allowed; use on, off"),
        ("omp_threads", "--set 'omp_threads' is not KNOB=VALUE, e.g. --set omp_threads=2"),
        ("kmp_blocktime=1", "kmp_blocktime applies only with omp_runtime=intel (here omp_runtime=gnu); "
                            "set omp_runtime or drop kmp_blocktime"),
    ],
)
def test_bad_assignments_say_what_is_allowed(assignment: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_assignments([assignment])
    assert str(info.value).startswith(message)


def test_omp_proc_bind_is_not_for_intel_openmp() -> None:
    with pytest.raises(ConfigError, match="omp_proc_bind applies only with omp_runtime=gnu/llvm"):
        Config.from_assignments(["omp_runtime=intel", "omp_proc_bind=close"])
    llvm = Config.from_assignments(["omp_runtime=llvm", "omp_proc_bind=close"])
    assert llvm.get("omp_proc_bind") == "close"


def test_a_knob_given_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match="--set gives omp_threads twice"):
        Config.from_assignments(["omp_threads=1", "omp_threads=2"])


def test_layout_knobs_follow_the_backend_and_mkldnn() -> None:
    with pytest.raises(ConfigError, match=r"mkldnn applies only with backend=eager \(here backend=inductor\)"):
        Config.from_assignments(["backend=inductor", "mkldnn=on"])
    with pytest.raises(ConfigError, match=r"precision applies only with mkldnn=off \(here mkldnn=on\)"):
        Config.from_assignments(["mkldnn=on", "precision=bf16"])
    config = Config.from_assignments(["backend=torchscript", "memory_format=channels_last", "precision=bf16"])
    assert config.describe() == "backend=torchscript memory_format=channels_last precision=bf16"
