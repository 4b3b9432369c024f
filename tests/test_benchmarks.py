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


def test_search_cost_again_breaks_down_an_older_autotunes_study_and_refuses_a_folder_without_a_run(
        tmp_path: Path) -> None:
    """issue 68's "before" runs: a study recorded before trials kept their set-up seconds is broken
    down by this checkout's rule, from its trials' instances; the earlier table's command line,
    exit code and outside wall are kept."""
    import optuna
    from optuna.trial import TrialState

    studies = tmp_path / "search" / "studies"
    studies.mkdir(parents=True)
    study = optuna.create_study(study_name="m-bs1-latency", storage=f"sqlite:///{studies / 'm-bs1-latency.db'}")
    setup = {"build_s": 3.0, "compile_s": 17.0, "warmup_s": 1.5}
    for value in (10.0, 8.0):
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[value], user_attrs={
            "config": f"c{value}", "measure_wall_s": 30.0, "timed_s": 4.0,
            "instances": [{"index": 0, "setup": setup}]}))
    study.set_user_attr("accounting", {"wall_s": 120.0, "trials": 2})
    (tmp_path / "search_cost.md").write_text("m, latency, batch 1: `autotune search` in an empty folder (exit 0)\n\n"
                                             "Command: `x` · commit 450c742 · host: h · 2026-12-07\n\n"
                                             "| wall, search + confirmation | 2.5 min |\n")
    again = [sys.executable, str(BENCHMARKS / "search_cost.py"), "--model", "m", "--again", str(tmp_path)]
    done = subprocess.run(again, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "Command: `x` · commit 450c742" in done.stdout and "| wall, search + confirmation | 2.5 min |" in done.stdout
    assert "| trial wall: build and compile, warm-up, timed, undecided, the rest | 40 s, 3 s, 8 s, 0 s, 69 s |" \
        in done.stdout, done.stdout
    empty = subprocess.run([sys.executable, str(BENCHMARKS / "search_cost.py"), "--again", str(tmp_path / "search")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert empty.returncode == 2 and empty.stderr.count("\n") == 1 and "--again takes the OUT" in empty.stderr
