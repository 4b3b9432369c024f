"""The confirmed winner against the best expert recipe (search/against_recipe.py): the recipe runs in
the rounds even when it is no candidate, stays out of Holm's family, and a tie recommends the simpler
of the two, which `export` writes unless --trial asks for the other."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import FrozenTrial

from autotune.deploy import export
from autotune.search import against_recipe
from tests.support import verdicts
from tests.support.verdicts import confirmed

SIMPLE = "allocator=jemalloc"  # the recipe: one knob away from the defaults
BUSY = "mkldnn=on omp_runtime=intel allocator=jemalloc"  # the sampled winner: three


def trial(config: str, search_ms: float, **attrs: object) -> FrozenTrial:
    return verdicts.trial(config, search_ms, ("defaults", SIMPLE, BUSY), **attrs)


def study(recipe_search_ms: float = 52.0) -> optuna.Study:
    made = optuna.create_study(direction="minimize")
    made.add_trial(trial("defaults", 100.0, baseline=True))
    made.add_trial(trial(BUSY, 50.0))
    made.add_trial(trial(SIMPLE, recipe_search_ms, recipe="jemalloc (expert recipe)"))
    return made


def test_a_winner_that_ties_with_the_recipe_recommends_the_simpler_and_export_writes_it() -> None:
    made = study()
    verdict = confirmed(made, {"defaults": 100.0, BUSY: 50.0, SIMPLE: 50.5})
    assert verdict["winner_trial"] == 1 and verdict["significant"] is True
    assert [row["trial"] for row in verdict["candidates"]] == [1]  # the recipe is no candidate: Holm's family is 1
    versus = verdict["against_recipe"]
    assert versus["trial"] == 2 and versus["status"] == "ties" and versus["recommended_trial"] == 2
    assert versus["ci"][0] < 1.03 and versus["p_value"] >= 0.05 and versus["ci_label"].endswith("% CI")
    assert versus["against_baseline"]["speedup"] == pytest.approx(100 / 50.5, rel=0.03)
    assert verdict["recommended_trial"] == 2 and 2 in [t for order in verdict["orders"] for t in order]
    assert "it ties with the expert recipe 'jemalloc (expert recipe)' (trial 2): " in verdict["message"]
    assert "the recipe, the simpler of the two, is recommended" in verdict["message"]
    assert export.pick_trial(made, None).number == 2  # the simpler, unless asked otherwise
    assert export.pick_trial(made, 1).number == 1


def test_a_winner_that_beats_the_recipe_is_recommended() -> None:
    verdict = confirmed(study(), {"defaults": 100.0, BUSY: 50.0, SIMPLE: 80.0})
    versus = verdict["against_recipe"]
    assert versus["status"] == "beats" and versus["p_value"] < 0.05 and versus["ci"][0] > 1.03
    assert versus["speedup"] == pytest.approx(80 / 50, rel=0.03)
    assert verdict["recommended_trial"] == verdict["winner_trial"] == 1
    assert "it beats the expert recipe 'jemalloc (expert recipe)' (trial 2): 1.6" in verdict["message"]


def test_a_recipe_faster_than_the_winner_is_recommended() -> None:
    verdict = confirmed(study(), {"defaults": 100.0, BUSY: 50.0, SIMPLE: 40.0})
    versus = verdict["against_recipe"]
    assert versus["status"] == "slower" and versus["p_value_slower"] < 0.05 and versus["ci"][1] < 1
    assert verdict["winner_trial"] == 1 and verdict["recommended_trial"] == 2


def test_a_recipe_among_the_candidates_that_wins_is_the_recipe() -> None:
    verdict = confirmed(study(recipe_search_ms=51.0), {"defaults": 100.0, BUSY: 60.0, SIMPLE: 45.0}, top=2)
    assert {row["trial"] for row in verdict["candidates"]} == {1, 2}  # nothing runs twice
    assert verdict["winner_trial"] == 2 and verdict["against_recipe"]["status"] == "is the recipe"
    assert verdict["message"].endswith("; it is the expert recipe 'jemalloc (expert recipe)' (trial 2)")


def test_without_a_winner_nothing_is_compared_with_the_recipe() -> None:
    verdict = confirmed(study(), {"defaults": 100.0, BUSY: 100.0, SIMPLE: 100.0})
    assert verdict["significant"] is False and verdict["against_recipe"] is None
    assert verdict["recommended_trial"] == 0


def test_knobs_away_from_the_defaults() -> None:
    assert against_recipe.knobs_away("defaults") == 0
    assert against_recipe.knobs_away(SIMPLE) == 1 and against_recipe.knobs_away(BUSY) == 3
