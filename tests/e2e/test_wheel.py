"""The wheel installs: built from this checkout, installed into a new virtual environment outside it,
`autotune` runs from another folder, with the search spaces the wheel ships.

Offline and without a second torch: the wheel goes in with --no-deps, and a .pth file in the new
environment puts this environment's site-packages after its own. A plain path line in a .pth is
not searched for .pth files itself, so the editable autotune installed here stays out of sight.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from autotune.config import space
from autotune.config.knobs import KNOBS

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
                                    "studies", "test-artifacts")


def run(cwd: Path, *command: str | Path) -> subprocess.CompletedProcess[str]:
    """A command with no PYTHONPATH (this suite may run with one pointing at the checkout), and a
    wide terminal so that no table wraps a knob's name."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"COLUMNS": "250"}
    return subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of a copy of the checkout: a stale build/ of the checkout cannot slip into it."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    done = run(tmp_path, sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
               "--disable-pip-version-check", "--wheel-dir", tmp_path / "dist", source)
    assert done.returncode == 0, done.stderr
    (built,) = (tmp_path / "dist").glob("autotune-*.whl")
    return built


def install(tmp_path: Path, wheel: Path) -> Path:
    """A new virtual environment holding the wheel and, through a .pth, this environment's packages;
    its python."""
    env_dir = tmp_path / "env"
    venv.EnvBuilder(symlinks=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    done = run(tmp_path, sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
               "--disable-pip-version-check", wheel)
    assert done.returncode == 0, done.stderr
    site = run(tmp_path, python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    ours = sysconfig.get_paths()
    (Path(site) / "dev-environment.pth").write_text("".join(f"{p}\n" for p in dict.fromkeys(
        (ours["purelib"], ours["platlib"]))))
    return python


def test_the_wheel_holds_the_package_and_the_search_spaces_only(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "autotune").rglob("*.py")}
    spaces = {f"autotune/search_spaces/{p.name}" for p in (ROOT / "search_spaces").glob("*.yaml")}
    assert spaces and modules
    assert modules - names == set()  # pyproject.toml lists the packages: a new one must be added there
    assert spaces - names == set()
    assert {n for n in names if not n.startswith("autotune-")} == modules | spaces  # no tests/, benchmarks/


def test_the_installed_wheel_runs_from_another_folder(wheel: Path, tmp_path: Path) -> None:
    python = install(tmp_path, wheel)
    env_dir = python.parents[1]
    autotune = env_dir / "bin" / "autotune"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    found = run(elsewhere, python, "-c", "import autotune, json; from autotune.config import space; "
                "quick = space.find('quick'); "
                "print(json.dumps([autotune.__file__, str(quick), space.load(quick).names()]))")
    assert found.returncode == 0, found.stderr
    package, quick, names = json.loads(found.stdout)
    assert Path(package).is_relative_to(env_dir), package  # the wheel's autotune, not the checkout's
    assert Path(quick).is_relative_to(env_dir) and Path(quick).name == "quick.yaml", quick
    assert tuple(names) == space.load(ROOT / "search_spaces" / "quick.yaml").names()

    knobs = run(elsewhere, autotune, "knobs")
    assert knobs.returncode == 0, knobs.stderr
    assert all(name in knobs.stdout for name in KNOBS), knobs.stdout

    plan = run(elsewhere, autotune, "plan", "--model", "resnet18", "--json")
    assert plan.returncode == 0, plan.stderr
    launched = json.loads(plan.stdout)
    assert launched["bench"]["model"] == "resnet18"
    child = launched["instances"][0]["command"]
    assert Path(child[0]).parent == env_dir / "bin" and child[1:3] == ["-m", "autotune.child.worker"], child

    shipped = ", ".join(sorted(p.stem for p in (ROOT / "search_spaces").glob("*.yaml")))
    unknown = run(elsewhere, autotune, "search", "--model", "resnet18", "--trials", "1", "--space", "nope")
    assert unknown.returncode == 2
    assert unknown.stderr == f"Error: no search space 'nope'; give a .yaml path or one of: {shipped}\n"
