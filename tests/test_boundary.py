"""The package's boundaries, checked rather than promised in docstrings.

The benchmark child (`autotune/child/`) must stay small and free of the harness: a measurement
must not pay for optuna, click or rich, and the child must not reach back into the parent side.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"
CHILD = PACKAGE / "child"
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
    """What a child module imports that it must not: the harness, the parent side, torch at load."""
    problems = []
    for module, line, top in imported_modules(path, package):
        root = module.split(".")[0]
        if root in HARNESS:
            problems.append(f"{path.name}:{line} imports {module}")
        elif root == "autotune" and not module.startswith("autotune.child"):
            problems.append(f"{path.name}:{line} imports the parent side ({module})")
        elif root in ("torch", "torchvision") and top:
            problems.append(f"{path.name}:{line} imports {module} at module level")
    return problems


@pytest.mark.parametrize("path", sorted(CHILD.glob("*.py")), ids=lambda p: p.name)
def test_child_modules_import_nothing_of_the_harness_or_the_parent(path: Path) -> None:
    assert boundary_violations(path) == []


@pytest.mark.parametrize("line", ["import optuna", "from click import echo", "from autotune import cli",
                                  "from autotune.launch import LaunchPlan", "from .. import storage",
                                  "import torch", "from rich.console import Console",
                                  "from autotune import __version__"])
def test_the_boundary_check_catches_a_planted_import(tmp_path: Path, line: str) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(f"{line}\n")
    assert boundary_violations(planted, package="autotune.child"), f"{line!r} slipped through"


def test_importing_the_child_loads_no_harness_and_no_torch() -> None:
    code = ("import sys, json; import autotune.child.worker, autotune.child.build, autotune.child.deploy; "
            "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True, cwd=PACKAGE.parent).stdout)
    roots = {name.split(".")[0] for name in loaded}
    assert not roots & {*HARNESS, "torch", "scipy", "psutil"}
    assert [m for m in loaded if m.startswith("autotune.") and not m.startswith("autotune.child")] == []


CLI_MODULES = {f"autotune.{path.stem}" for path in PACKAGE.glob("cli*.py")}  # cli.py and its cli_*.py


def cli_importers(paths: list[Path]) -> list[str]:
    """Where a module other than the CLI's own (and `python -m autotune`) imports one of the CLI modules."""
    return [f"{path.name}:{line}" for path in paths
            if path.name != "__main__.py" and not path.name.startswith("cli")
            for module, line, _ in imported_modules(path, package="autotune")
            if module in CLI_MODULES or module.rpartition(".")[0] in CLI_MODULES]


def test_nothing_imports_the_cli_modules_but_the_cli() -> None:
    assert {"autotune.cli", "autotune.cli_common"} <= CLI_MODULES
    assert cli_importers(sorted(PACKAGE.rglob("*.py"))) == []


@pytest.mark.parametrize("line", ["from autotune import cli", "from autotune.cli import main", "import autotune.cli",
                                  "from autotune.cli_common import emit", "from . import cli_search"])
def test_the_cli_check_catches_a_planted_import(tmp_path: Path, line: str) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(f"{line}\n")
    assert cli_importers([planted]), f"{line!r} slipped through"


def test_imports_only_point_down_the_readme_layout_table() -> None:
    """The README's layout table is the reading order: a module imports only modules listed below it."""
    readme = (PACKAGE.parent / "README.md").read_text()
    listed = [name for row in re.findall(r"^\| `([\w/]+)\.py`(?:, `([\w/]+)\.py`)? \|", readme, re.M)
              for name in row if name]
    position = {"autotune." + name.replace("/", "."): index for index, name in enumerate(listed)}
    files = {p for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert {"autotune." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in files} == set(position)
    upward = [f"{module} imports {name}" for module, index in position.items()
              for target, _, _ in imported_modules(PACKAGE.parent / (module.replace(".", "/") + ".py"))
              for name in (target, target.rpartition(".")[0])  # `from a.b import c`: a.b, or a.b.c
              if position.get(name, len(listed)) < index]
    assert upward == []
