"""The package's boundaries, checked rather than promised in docstrings.

The packages are layers, and the benchmark child (`autotune/child/`) and the model package below it
(`autotune/model/`, what a user's program imports) must stay small and free of the harness: a
measurement must not pay for optuna, click or rich, and neither may reach back into the parent side;
the model package imports nothing of the child. import-linter holds these (the contracts in
pyproject.toml); the checks here add what it cannot see (torch imported at a module's top level)
and show that its contracts do fail on a planted import.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"
CHILD = PACKAGE / "child"
MODEL = PACKAGE / "model"
HARNESS = ("optuna", "click", "rich", "sqlalchemy")


def imported_modules(path: Path, package: str | None = None) -> list[tuple[str, int, bool]]:
    """(absolute module name, line, at module level) for every import in a file; `from a import b`
    counts as `a.b`, since b may be a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = package or ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found += [(f"{base}.{alias.name}", node.lineno, id(node) in top_level) for alias in node.names]
    return found


def boundary_violations(path: Path, package: str | None = None) -> list[str]:
    """What a child or model module imports that it must not: the harness, the parent side, torch at
    load (that the model package imports nothing of the child is the layers contract's to hold)."""
    problems = []
    for module, line, top in imported_modules(path, package):
        root = module.split(".")[0]
        if root in HARNESS:
            problems.append(f"{path.name}:{line} imports {module}")
        elif root == "autotune" and not module.startswith(("autotune.child", "autotune.model")):
            problems.append(f"{path.name}:{line} imports the parent side ({module})")
        elif root in ("torch", "torchvision") and top:
            problems.append(f"{path.name}:{line} imports {module} at module level")
    return problems


@pytest.mark.parametrize("path", sorted([*CHILD.glob("*.py"), *MODEL.rglob("*.py")]), ids=lambda p: p.name)
def test_child_modules_import_nothing_of_the_harness_or_the_parent(path: Path) -> None:
    assert boundary_violations(path) == []


@pytest.mark.parametrize("line", ["import optuna", "from click import echo", "from autotune import cli",
                                  "from autotune.measure.plan import LaunchPlan", "from .. import storage",
                                  "import torch", "from rich.console import Console",
                                  "from autotune import __version__"])
def test_the_boundary_check_catches_a_planted_import(tmp_path: Path, line: str) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(f"{line}\n")
    assert boundary_violations(planted, package="autotune.child"), f"{line!r} slipped through"


def test_importing_the_child_loads_no_harness_and_no_torch() -> None:
    code = ("import sys, json; import autotune.child.worker, autotune.child.build, autotune.model.apply; "
            "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True, cwd=PACKAGE.parent).stdout)
    roots = {name.split(".")[0] for name in loaded}
    assert not roots & {*HARNESS, "torch", "scipy", "psutil"}
    assert [m for m in loaded if m.startswith("autotune.")
            and not m.startswith(("autotune.child", "autotune.model"))] == ["autotune.api"]


LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter over the package under `root`, with the contracts of the pyproject.toml there."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_layers_and_the_child_boundary_hold() -> None:
    result = lint_imports(PACKAGE.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.findall(r"^(.+) KEPT$", result.stdout, re.M) == [LAYERS, CHILD_BOUNDARY]


LAYERS = "Each package imports only the packages below it"
CHILD_BOUNDARY = "The measuring child and the model it builds import nothing of the harness"


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("base/errors.py", "from autotune.cli import main", [LAYERS]),
    ("host/topology.py", "from autotune.config import knobs", [LAYERS]),
    ("study/storage.py", "import autotune.search.loop", [LAYERS]),
    ("search/budget.py", "from autotune.deploy import export", [LAYERS]),  # side by side, neither above
    ("model/cpu.py", "import optuna", [CHILD_BOUNDARY]),
    ("model/envfile.py", "from autotune.measure import stats", [LAYERS, CHILD_BOUNDARY]),
    ("model/cpu.py", "from autotune.child import worker", [LAYERS]),  # the model package is below the child
])
def test_a_planted_upward_import_breaks_a_contract(tmp_path: Path, module: str, line: str, broken: list[str]) -> None:
    shutil.copytree(PACKAGE, tmp_path / "autotune", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PACKAGE.parent / "pyproject.toml", tmp_path)
    planted = tmp_path / "autotune" / module
    planted.write_text(planted.read_text() + f"\n{line}  # planted\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.findall(r"^(.+) BROKEN$", result.stdout, re.M) == broken
