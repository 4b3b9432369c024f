"""A remedy knob (int8_fallback: layers kept in fp32) buys back quality at a cost in speed: a search
proposes its other values for a model only once that model without them fell short on quality (the
guard's wrong answers, or a drop over --max-quality-drop); a space that offers nothing else is taken
at its word. Fake runner, no processes."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config import space
from autotune.config.knobs import KNOBS, Config
from autotune.host.machine import Machine
from autotune.measure.objectives import Limits
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import ReplicatePolicy
from autotune.measure.results import InstanceResult, RunResult
from autotune.search import loop, opening, proposals
from autotune.study import quality_records, records
from tests.support.studies import fake_result, request

KEPT = re.compile(r"int8_fallback=[1-9]")  # a configuration keeping layers in fp32
WRONG = InstanceResult(0, False, "wrong answers: top-1 agreement 0.62 < 0.95", 3, "", wrong_answers=True)


def int8_space(tmp_path: Path, fallback: str = "[0, 1, 2]") -> Path:
    path = tmp_path / "int8.yaml"
    path.write_text("description: int8 and its fallback (test_remedies)\nknobs:\n  backend: [inductor]\n"
                    "  memory_format: [channels_last]\n  precision: [fp32, int8]\n"
                    f"  int8_fallback: {fallback}\n  allocator: [default, jemalloc]\n")
    return path


def runner_with(plain_int8_wrong: bool, ran: list[str]):  # type: ignore[no-untyped-def]
    """int8 at 30 ms, 2 ms slower for each layer kept in fp32; fp32 at 90, the defaults at 120; with
    `plain_int8_wrong`, int8 with every layer quantized gives wrong answers."""
    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        config = plan.config
        ran.append(config.describe())
        kept = int(config.get("int8_fallback") or 0)
        if config.get("precision") == "int8":
            if plain_int8_wrong and kept == 0:
                return RunResult(False, f"instance 0: {WRONG.reason}", (WRONG,), 1.0)
            latency = 30.0 + 2 * kept
        else:
            latency = 90.0 if config.values else 120.0
        return fake_result([latency - 0.5, latency, latency + 0.5])
    return runner


def test_the_remedy_is_a_fact_of_the_knob_row() -> None:
    assert KNOBS["int8_fallback"].remedy and KNOBS["int8_fallback"].default == 0
    assert not any(k.remedy for name, k in KNOBS.items() if name != "int8_fallback")


def test_a_fallback_is_never_proposed_while_int8_meets_the_quality_bar(tmp_path: Path, here: Machine) -> None:
    ran: list[str] = []
    opened = opening.open_search(request(tmp_path, 20, space=int8_space(tmp_path), replicates=ReplicatePolicy(1, 0)),
                                 here)
    stopped = loop.run_search(opened, here, lambda event: None, runner=runner_with(False, ran))
    assert not [c for c in ran if KEPT.search(c)]
    assert sum("precision=int8" in c for c in ran) == 2  # both allocators, every layer int8
    assert "none of int8_fallback's other values: no model fell short on quality without them" in stopped


def test_a_fallback_is_proposed_once_int8_gave_wrong_answers(tmp_path: Path, here: Machine) -> None:
    ran: list[str] = []
    opened = opening.open_search(request(tmp_path, 20, space=int8_space(tmp_path), replicates=ReplicatePolicy(1, 0)),
                                 here)
    stopped = loop.run_search(opened, here, lambda event: None, runner=runner_with(True, ran))
    kept = sorted(c for c in ran if KEPT.search(c))
    assert len(kept) == 4 and {"int8_fallback=1", "int8_fallback=2"} <= {w for c in kept for w in c.split()}
    best = records.best_trials(opened.study)[0]
    assert "int8_fallback=1" in best.user_attrs["config"]  # the least kept that answers right: the fastest
    assert "fell short" not in stopped


def test_a_space_that_offers_only_a_fallback_runs_it(tmp_path: Path, here: Machine) -> None:
    ran: list[str] = []
    opened = opening.open_search(request(tmp_path, 20, space=int8_space(tmp_path, "[2]"),
                                         replicates=ReplicatePolicy(1, 0)), here)
    loop.run_search(opened, here, lambda event: None, runner=runner_with(False, ran))
    assert sum("int8_fallback=2" in c for c in ran) >= 2  # the recipe's int8 sets none; the space's both allocators


def trial_of(config: str, attrs: dict[str, object]) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(state=TrialState.COMPLETE, value=30.0, user_attrs={
        "config": config, "settings_digest": "d", records.HOST_CLASS: "k", "batch_size": 1, **attrs})
    trial.number = 3
    return trial


@pytest.mark.parametrize(("excess", "short"), [(0.4, True), (-0.2, False), (None, False)])
def test_a_drop_over_the_quality_limit_is_falling_short(excess: float | None, short: bool) -> None:
    int8 = "backend=inductor memory_format=channels_last precision=int8"
    attrs = {} if excess is None else {f"constraint_{Limits.constraint('quality_drop')}": excess}
    found = quality_records.short_on_quality([trial_of(int8, attrs)], "d", "k")
    model = quality_records.model_of(Config.from_description(int8), 1)
    assert (model in found) is short
    assert quality_records.short_on_quality([trial_of(int8, attrs)], "other settings", "k") == {}
    fallback = Config.from_description(f"{int8} int8_fallback=4")
    offered = space.load(space.find("default"))
    assert proposals.remedy_unneeded(offered, fallback, 1, found) is not short
    assert not proposals.remedy_unneeded(offered, Config.from_description(int8), 1, found)  # no remedy set
