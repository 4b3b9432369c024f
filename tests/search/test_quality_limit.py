"""A search judged on the user's data, without processes: each trial's quality (here made up by the
model knobs and the part of the data) is recorded with its limit, shared by the trials of one model
configuration, never lets a trial over the limit win, and the confirmation's re-check on its own
part can refuse a winner, which `export` then says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from autotune.deploy import export
from autotune.host.machine import Machine
from autotune.measure import quality
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import one_by_one
from autotune.measure.results import RunResult
from autotune.search import confirm, loop, opening
from autotune.study import records
from tests.support.studies import fake_result, request


def mkldnn_fastest(plan: LaunchPlan, timeout_s: float) -> RunResult:
    """mkldnn=on (a model knob) 30 ms faster, jemalloc 20, Intel OpenMP 10, from 100 ms."""
    config = plan.config
    latency = 100.0 - 30 * bool(config.get("mkldnn")) - 20 * (config.get("allocator") == "jemalloc") \
        - 10 * (config.get("omp_runtime") == "intel")
    return fake_result([latency + jitter for jitter in (-1.0, -0.5, 0.0, 0.5, 1.0)])


def judged(drops: dict[str, float], calls: list[tuple[str, str]]) -> Any:
    """A made-up `quality.measure`: the drop by mkldnn (what the model computes) and part of the data."""

    def measure(plan: LaunchPlan, split: str, timeout_s: float) -> dict[str, Any]:
        mkldnn = "on" if plan.config.get("mkldnn") else "off"
        calls.append((plan.config.describe(), split))
        drop = drops.get(f"{mkldnn}/{split}", drops.get(mkldnn, 0.0))
        return quality.figures({"kind": "accuracy", "items": 100, "both_right": 80,
                                "reference_only_right": max(int(drop), 0), "candidate_only_right": 0,
                                "both_wrong": 20 - max(int(drop), 0), "top1_agreement_items": 95}, split)

    return measure


def searched(tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch, drops: dict[str, float],
             limit: float) -> tuple[opening.Search, list[tuple[str, str]]]:
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(quality, "measure", judged(drops, calls))
    data = tmp_path / "held_out.pt"
    data.write_bytes(b"made up: the judging is")
    opened = opening.open_search(request(tmp_path, 6, eval_data=str(data), max_quality_drop=limit, seed=0), here)
    loop.run_search(opened, here, lambda event: None, runner=mkldnn_fastest)
    return opened, calls


def test_every_trial_records_its_quality_and_one_over_the_limit_never_wins(
        tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    opened, calls = searched(tmp_path, here, monkeypatch, {"on": 5.0}, 1.0)  # mkldnn: fastest, 5 points
    assert opened.name.endswith("-qdropmax1")
    completed = [t for t in opened.study.trials if t.state == TrialState.COMPLETE]
    assert {"mkldnn=on" in t.user_attrs["config"] for t in completed} == {True, False}
    for t in completed:
        over_limit = "mkldnn=on" in t.user_attrs["config"]
        assert t.user_attrs["quality"]["drop"] == pytest.approx(5.0 if over_limit else 0.0)
        assert t.user_attrs["feasible"] is not over_limit
        assert t.user_attrs["constraint_quality_drop_over_limit"] == pytest.approx(4.0 if over_limit else -1.0)
    attrs = opened.study.user_attrs  # the study records its limit for the confirmation and the export
    assert attrs["max_quality_drop"] == 1.0 and attrs["eval_data"].startswith("held_out.pt:")
    assert all("mkldnn=on" not in t.user_attrs["config"] for t in records.best_trials(opened.study))
    assert {split for _, split in calls} == {"search"}
    assert len(calls) == 2  # once per model configuration (mkldnn on, off), whatever the process knobs


def test_the_confirmation_rechecks_on_its_own_part_and_a_winner_over_the_limit_there_is_not_exported(
        tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    opened, calls = searched(tmp_path, here, monkeypatch, {"off/confirm": 3.0, "on": 5.0}, 2.0)
    verdict = confirm.confirm(opened.study, 1, 8, 0.0, 60, lambda event: None, runner=one_by_one(mkldnn_fastest),
                              seed=1)
    assert calls[-1][1] == "confirm"
    rechecked = verdict["quality"]
    assert rechecked["split"] == "confirm" and rechecked["within_limit"] is False
    assert verdict["recommended_trial"] == verdict["baseline_trial"]
    assert verdict["quality_breach"].endswith("on the confirmation's held-out part of --eval-data, so the defaults "
                                              "stay recommended")
    chosen = export.pick_trial(opened.study, None)
    text = export.render(opened.study, chosen)
    assert chosen.number == verdict["baseline_trial"]
    assert f"# baseline exported: {verdict['quality_breach']}" in text
