"""Pruning and confirmation with a fake benchmark: deterministic, no processes."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune import confirm, export, search_loop
from autotune.launch import LaunchPlan
from autotune.libs import Libraries
from autotune.machine import Machine
from autotune.replicates import ReplicatePolicy
from autotune.results import RunResult
from tests.conftest import lscpu
from tests.test_study import SPACE, fake_result, fake_runner

SEED = 7
JITTER = (-1.0, -0.6, -0.3, 0.0, 0.2, 0.5, 0.8, 1.0, 1.3, 1.6)


def slow_intel(plan: LaunchPlan, timeout_s: float) -> RunResult:
    """jemalloc 2x faster than the defaults, Intel OpenMP 3x slower."""
    config = plan.config
    latency = 100.0 / (2 if config.get("allocator") == "jemalloc" else 1) * (3 if config.get("omp_runtime") == "intel"
                                                                          else 1)
    if config.get("mkldnn"):
        return fake_runner(plan, timeout_s)
    fake_runner.calls.append(plan.config.describe())  # type: ignore[attr-defined]
    return fake_result([latency + j for j in JITTER])


@pytest.fixture
def here(fake_libs: Libraries) -> Machine:
    return Machine(lscpu("amd_1s_smt"), fake_libs)


ENQUEUED = [{"mkldnn": "off", "omp_runtime": "gnu", "allocator": "jemalloc"},
            {"mkldnn": "off", "omp_runtime": "intel", "allocator": "default"},
            {"mkldnn": "off", "omp_runtime": "intel", "allocator": "jemalloc"}]


def searched(tmp_path: Path, here: Machine, runner: object, trials: int = 8) -> optuna.Study:
    """The baseline, then the enqueued configurations (so the test does not hang on sampling luck)."""
    for total in (1, trials):
        opened = search_loop.open_search(search_loop.SearchRequest(
            model="resnet18", trials=total, space=SPACE, studies_dir=tmp_path / "studies",
            replicates=ReplicatePolicy(replicates=3), seed=0), here)
        if total == 1:
            search_loop.run_search(opened, here, lambda e: None, runner=runner)  # type: ignore[arg-type]
            for params in ENQUEUED:
                opened.study.enqueue_trial(params)
    search_loop.run_search(opened, here, lambda e: None, runner=runner)  # type: ignore[arg-type]
    return opened.study


def test_clearly_worse_configurations_are_pruned_after_two_replicates(tmp_path: Path, here: Machine) -> None:
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    pruned = [t for t in result.get_trials() if t.state == TrialState.PRUNED]
    assert {t.number for t in pruned} >= {2, 3}, "3x slower than trial 1 (jemalloc): pruned"
    for trial in pruned:
        assert trial.user_attrs["replicates"] == 2  # one disturbed process alone never prunes
        assert trial.user_attrs["status"] == "pruned"
        assert trial.user_attrs["prune_reason"].startswith("more than 5% worse than trial ")
        assert "after 2 replicate(s): Wilcoxon p=" in trial.user_attrs["prune_reason"]
    complete = [t for t in result.get_trials() if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert all(t.user_attrs["replicates"] == 3 for t in complete)
    assert result.get_trials()[1].state == TrialState.COMPLETE


def test_confirmation_picks_a_clearly_faster_candidate(tmp_path: Path, here: Machine) -> None:
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    rounds = []
    verdict = confirm.confirm(result, top=2, rounds=6, min_effect=0.03, timeout_s=60, on_run=rounds.append,
                              runner=slow_intel)
    assert verdict["significant"] is True
    winner = result.get_trials()[verdict["winner_trial"]]
    assert "allocator=jemalloc" in winner.user_attrs["config"]
    assert verdict["speedup"] == pytest.approx(2.0, rel=0.05)
    assert verdict["ci95"][0] > 1.5
    assert len(rounds) == 6 * (len(verdict["candidates"]) + 1)
    first_round = [e.contender.label for e in rounds if e.round == 0]
    second_round = [e.contender.label for e in rounds if e.round == 1]
    assert first_round[1:] + first_round[:1] == second_round  # the order rotates
    assert result.user_attrs["confirmation"]["winner_trial"] == winner.number
    text = export.render(result, export.pick_trial(result, None))
    assert f"trial {winner.number}" in text.splitlines()[0]
    assert "# confirmed: trial" in text


def test_no_significant_gain_exports_the_baseline_and_says_why(tmp_path: Path, here: Machine) -> None:
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)

    def all_equal(plan: LaunchPlan, timeout_s: float) -> RunResult:
        return fake_result([100.0 + j for j in JITTER])

    verdict = confirm.confirm(result, top=2, rounds=6, min_effect=0.03, timeout_s=60, on_run=lambda e: None,
                              runner=all_equal)
    assert verdict["significant"] is False
    assert verdict["winner_trial"] == 0
    assert verdict["message"].startswith("no candidate beat the baseline by more than 3% (Holm-adjusted p < 0.05)")
    chosen = export.pick_trial(result, None)
    assert chosen.number == 0
    assert "# baseline exported: no candidate beat the baseline" in export.render(result, chosen)


def test_too_few_rounds_and_no_baseline_are_errors(tmp_path: Path) -> None:
    empty = optuna.create_study(study_name="empty")
    with pytest.raises(confirm.ConfirmError, match="has no completed baseline trial"):
        confirm.confirm(empty, top=3, rounds=10, min_effect=0.03, timeout_s=1, on_run=lambda e: None)
    with pytest.raises(confirm.ConfirmError, match="--rounds 3 can never reach p < 0.05"):
        confirm.confirm(empty, top=3, rounds=3, min_effect=0.03, timeout_s=1, on_run=lambda e: None)


def test_holm_keeps_a_borderline_second_candidate_from_winning() -> None:
    rows = [{"p_value": 0.02, "significant": True}, {"p_value": 0.03, "significant": True},
            {"p_value": None, "significant": False}]
    confirm._holm(rows)
    assert [r["significant"] for r in rows] == [True, True, False]  # 0.02 < 0.05/2, 0.03 < 0.05/1
    rows = [{"p_value": 0.03, "significant": True}, {"p_value": 0.04, "significant": True}]
    confirm._holm(rows)
    assert [r["significant"] for r in rows] == [False, False]  # 0.03 > 0.05/2: neither, though both < 0.05
