from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.host.libs import LIBRARIES, discover, find_library, parse_ldconfig

CI = os.environ.get("CI") == "true"


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


def test_versioned_names_in_multiarch_and_llvm_dirs(tmp_path: Path) -> None:
    multiarch = tmp_path / "usr/lib/x86_64-linux-gnu"
    jemalloc = touch(multiarch / "libjemalloc.so.2")
    touch(multiarch / "libtcmalloc_minimal_debug.so.4")
    tcmalloc = touch(multiarch / "libtcmalloc_minimal.so.4.5.10")
    libomp = touch(tmp_path / "usr/lib/llvm-14/lib/libomp.so.5")
    found = discover(dirs=[tmp_path / "env/lib", multiarch, tmp_path / "usr/lib/llvm-14/lib"],
                     ldconfig_text="")
    assert found.paths["jemalloc"] == jemalloc
    assert found.paths["tcmalloc"] == tcmalloc
    assert found.paths["libomp"] == libomp
    assert found.paths["libiomp5"] is None


def test_python_environment_first_and_unversioned_name_preferred(tmp_path: Path) -> None:
    env_lib = tmp_path / "venv/lib"
    iomp = touch(env_lib / "libiomp5.so")
    touch(tmp_path / "usr/lib/libiomp5.so")
    touch(env_lib / "libjemalloc.so.2")
    plain = touch(env_lib / "libjemalloc.so")
    found = discover(dirs=[env_lib, tmp_path / "usr/lib"], ldconfig_text="")
    assert found.paths["libiomp5"] == iomp
    assert found.paths["jemalloc"] == plain


def test_ldconfig_cache_is_the_last_resort(tmp_path: Path) -> None:
    hidden = touch(tmp_path / "opt/odd/libtcmalloc.so.4")
    text = f"\tlibtcmalloc.so.4 (libc6,x86-64) => {hidden}\n\tlibc.so.6 (libc6,x86-64) => /lib/libc.so.6\n"
    assert parse_ldconfig(text)[0] == hidden
    assert find_library(LIBRARIES["tcmalloc"], [tmp_path / "empty"], parse_ldconfig(text)) == hidden


def test_name_matching_rejects_lookalikes() -> None:
    spec = LIBRARIES["jemalloc"]
    assert spec.matches("libjemalloc.so") and spec.matches("libjemalloc.so.2")
    assert not spec.matches("libjemalloc.so.2.tmp") and not spec.matches("libjemalloc_pic.a")
    assert not LIBRARIES["libomp"].matches("libomptarget.so")


@pytest.mark.skipif(not CI and not Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2").exists(),
                    reason="system libraries are installed by ./setup.sh (always in CI)")
def test_real_machine_finds_every_library() -> None:
    found = discover(probe_cpu=(sorted(os.sched_getaffinity(0))[0], 0))
    missing = [name for name, path in found.paths.items() if path is None]
    assert missing == []
    assert found.paths["jemalloc"] is not None and found.paths["jemalloc"].name.startswith("libjemalloc.so")
    assert found.numactl is not None
