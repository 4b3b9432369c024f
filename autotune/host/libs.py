"""Finding the shared libraries and tools the knobs need, where distributions really put them.

Launchers that look only for `libjemalloc.so` in `$CONDA_PREFIX/lib` miss Debian's
`/usr/lib/x86_64-linux-gnu/libjemalloc.so.2`; this module accepts versioned names and searches the
Python environment, the multiarch directories, LLVM's private directories and `ldconfig -p`.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autotune.base.errors import LibraryMissing


@dataclass(frozen=True)
class LibrarySpec:
    """A preloadable library: accepted file names (by stem, any version suffix) and its package."""

    name: str
    stems: tuple[str, ...]
    install: str
    purpose: str

    def matches(self, filename: str) -> bool:
        return any(re.fullmatch(re.escape(stem) + r"\.so(\.\d+)*", filename) for stem in self.stems)


PIP = f"{Path(sys.executable).name} -m pip install"
LIBRARIES: Mapping[str, LibrarySpec] = {
    spec.name: spec
    for spec in (
        LibrarySpec("libiomp5", ("libiomp5",), f"{PIP} intel-openmp", "omp_runtime=intel"),
        LibrarySpec("libomp", ("libomp",), "apt-get install libomp5", "omp_runtime=llvm"),
        LibrarySpec("jemalloc", ("libjemalloc",), "apt-get install libjemalloc2", "allocator=jemalloc"),
        LibrarySpec(
            "tcmalloc",
            ("libtcmalloc", "libtcmalloc_minimal"),
            "apt-get install libtcmalloc-minimal4",
            "allocator=tcmalloc",
        ),
    )
}
NUMACTL_INSTALL = "apt-get install numactl"


@dataclass(frozen=True)
class Libraries:
    """What was found: a path per library (None when missing) and the binding tools."""

    paths: Mapping[str, Path | None]
    numactl: Path | None = None
    numactl_usable: bool = False
    numactl_problem: str = ""
    taskset: Path | None = None
    searched: tuple[Path, ...] = field(default=())

    def require(self, name: str) -> Path:
        path = self.paths.get(name)
        if path is None:
            spec = LIBRARIES[name]
            raise LibraryMissing(
                f"{spec.purpose} needs {name}, which is not installed; install it with "
                f"`{spec.install}` or pick another value"
            )
        return path


def default_search_dirs() -> list[Path]:
    """Python environment first (pip's intel-openmp lives there), then the system's places."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    dirs = [Path(sys.prefix, "lib"), Path(sys.base_prefix, "lib")]
    for var in ("CONDA_PREFIX", "VIRTUAL_ENV"):
        if os.environ.get(var):
            dirs.append(Path(os.environ[var], "lib"))
    dirs += [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    dirs += [Path(p) for p in ("/usr/local/lib", f"/usr/lib/{multiarch}", f"/lib/{multiarch}")]
    dirs += [Path(p) for p in ("/usr/lib64", "/lib64", "/usr/lib")]
    dirs += [Path(p) for p in sorted(glob.glob("/usr/lib/llvm-*/lib"), reverse=True)]
    return list(dict.fromkeys(dirs))


def parse_ldconfig(text: str) -> list[Path]:
    """Paths from `ldconfig -p` lines like `libjemalloc.so.2 (libc6,x86-64) => /usr/lib/.../x`."""
    return [Path(line.split("=>", 1)[1].strip()) for line in text.splitlines() if "=>" in line]


def find_library(spec: LibrarySpec, dirs: Sequence[Path], known: Iterable[Path] = ()) -> Path | None:
    """First matching file in `dirs` (unversioned name preferred), then in ldconfig's list."""
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory), key=len)
        except OSError:
            continue
        for name in names:
            if spec.matches(name) and (directory / name).is_file():
                return directory / name
    return next((p for p in known if spec.matches(p.name) and p.is_file()), None)


def probe_numactl(numactl: Path, cpu: int, node: int) -> str:
    """Empty when numactl can bind here; otherwise its complaint (containers often forbid it)."""
    try:
        result = subprocess.run(
            [str(numactl), f"--physcpubind={cpu}", f"--membind={node}", "true"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if result.returncode == 0:
        return ""
    return (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]


def discover(
    dirs: Sequence[Path] | None = None,
    ldconfig_text: str | None = None,
    probe_cpu: tuple[int, int] | None = None,
) -> Libraries:
    """Search for every library; `probe_cpu` (cpu, node) also checks that numactl really binds."""
    dirs = default_search_dirs() if dirs is None else list(dirs)
    known = parse_ldconfig(_ldconfig() if ldconfig_text is None else ldconfig_text)
    paths = {name: find_library(spec, dirs, known) for name, spec in LIBRARIES.items()}
    numactl = _which("numactl")
    problem = "not installed" if numactl is None else ""
    if numactl is not None and probe_cpu is not None:
        problem = probe_numactl(numactl, *probe_cpu)
    return Libraries(
        paths=paths,
        numactl=numactl,
        numactl_usable=numactl is not None and not problem,
        numactl_problem=problem,
        taskset=_which("taskset"),
        searched=tuple(dirs),
    )


def _which(tool: str) -> Path | None:
    found = shutil.which(tool)
    return Path(found) if found else None


def _ldconfig() -> str:
    for tool in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            return subprocess.run(
                [tool, "-p"], capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
    return ""
