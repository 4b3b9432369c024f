"""benchmarks/ is a suite a maintainer reruns, not a notebook: every script in it starts (a refactor
that breaks its imports fails here, as one that breaks its types fails mypy), offers `--out` and
`--quick`, and benchmarks/README.md lists it. The scripts are found in the folder, so a new one is
covered; its modules live in benchmarks/lib/ and are not scripts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
MOST_SCRIPTS = 13  # the "about a dozen": an investigation leaves with its answer in RESULTS.md


def listed() -> set[str]:
    """The scripts benchmarks/README.md's table names, each row's first cell."""
    rows = (BENCHMARKS / "README.md").read_text().splitlines()
    return {found[1] for row in rows if (found := re.match(r"\| `([a-z0-9_]+\.py)`", row))}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_benchmark_answers_help_with_its_out_and_quick_options(script: Path) -> None:
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "--out" in done.stdout and "--quick" in done.stdout, done.stdout


def test_the_readme_lists_every_benchmark_and_no_other() -> None:
    assert listed() == {script.name for script in SCRIPTS}


def test_the_suite_stays_a_suite() -> None:
    assert 0 < len(SCRIPTS) <= MOST_SCRIPTS, (
        f"{len(SCRIPTS)} scripts in benchmarks/: retire an investigation's script, its question, answer, command "
        "and commit kept in RESULTS.md's decision log")
