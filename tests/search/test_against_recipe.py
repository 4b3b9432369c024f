"""The confirmed winner against the best expert recipe (search/against_recipe.py): the recipe runs in
the rounds even when it is no candidate, stays out of Holm's family; only an equivalent recipe is
recommended for being the simpler of the two (which `export` writes unless --trial asks for the
other), and one still undecided at the cap is recommended only when its estimate is the better."""

from __future__ import annotations

import itertools

import optuna
import pytest
from optuna.trial import FrozenTrial

from autotune.cli import result_display
from autotune.deploy import export
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import one_by_one
from autotune.measure.results import RunResult
from autotune.search import against_recipe, confirm
from autotune.study import catalog, confirmations
from tests.support import verdicts
from tests.support.studies import fake_result
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


def test_a_winner_equivalent_to_the_recipe_recommends_the_simpler_and_export_writes_it() -> None:
    made = study()
    verdict = confirmed(made, {"defaults": 100.0, BUSY: 50.0, SIMPLE: 50.5})
    assert verdict["winner_trial"] == 1 and verdict["significant"] is True
    assert [row["trial"] for row in verdict["candidates"]] == [1]  # the recipe is no candidate: Holm's family is 1
    versus = verdict["against_recipe"]
    assert versus["trial"] == 2 and versus["status"] == "equivalent" and versus["recommended_trial"] == 2
    assert versus["ci"][0] > 1 / 1.03 and versus["ci"][1] < 1.03  # the whole interval within 3% either way
    assert versus["p_value_equivalent"] < verdict["alpha_look"] <= versus["p_value"]
    assert "% CI" in versus["ci_label"] and verdict["decided"] and verdict["stopped_by"] == "decided"
    assert versus["against_baseline"]["speedup"] == pytest.approx(100 / 50.5, rel=0.03)
    assert verdict["recommended_trial"] == 2 and 2 in [t for order in verdict["orders"] for t in order]
    assert "it is equivalent to the expert recipe 'jemalloc (expert recipe)' (trial 2): " in verdict["message"]
    assert "the recipe, the simpler of the two, is recommended" in verdict["message"]
    assert export.pick_trial(made, None).number == 2  # the simpler, unless asked otherwise
    assert export.pick_trial(made, 1).number == 1
    assert "# outcomes: the winner beats the baseline; is equivalent to the expert recipe (trial 2)" in \
        export.render(made, export.pick_trial(made, None))


@pytest.mark.parametrize(("recipe_ms", "recommended", "words", "studies"), [
    (51.5, 1, "trial 1, the better estimate, is recommended", "; vs recipe trial 2: undecided, the winner the better "
                                                              "estimate"),
    (48.5, 2, "the recipe, the better estimate, is recommended", ", recipe trial 2 recommended (the better estimate)")])
def test_a_recipe_undecided_at_the_cap_is_recommended_only_for_the_better_estimate(
        recipe_ms: float, recommended: int, words: str, studies: str) -> None:
    """The recipe's rounds 3% either side of the minimum effect, every one: neither faster by more
    than it, nor shown within it, after all 12 rounds. The recipe is the simpler, and that decides
    nothing: the better estimate is recommended, and the words say it is undecided, after how many
    rounds."""
    made = study()
    spread = itertools.cycle((-3.0, 2.0, -1.0, 3.0, 1.0, -2.0))

    def run(plan: LaunchPlan, timeout_s: float) -> RunResult:
        described = plan.config.describe()
        ms = {"defaults": 100.0, BUSY: 50.0}.get(described) or recipe_ms * (1 + next(spread) / 100)
        return fake_result([ms - 0.2, ms, ms + 0.2])

    verdict = confirm.confirm(made, top=1, rounds=12, min_effect=0.03, timeout_s=60, on_run=lambda e: None,
                              runner=one_by_one(run), seed=3)
    versus = verdict["against_recipe"]
    assert versus["status"] == "undecided" and versus["recommended_trial"] == recommended
    assert versus["ci"][0] < 1.03 < versus["ci"][1] or versus["ci"][0] < 1 / 1.03 < versus["ci"][1]
    assert (verdict["rounds"], verdict["stopped_by"], verdict["decided"]) == (12, "cap", False)
    assert verdict["recommended_trial"] == recommended and export.pick_trial(made, None).number == recommended
    assert "; against the expert recipe 'jemalloc (expert recipe)' (trial 2) it is undecided after 12 rounds: " in \
        verdict["message"]
    assert verdict["message"].endswith(words)
    assert catalog.verdict(verdict)["outcome"] == "beats"
    assert "is undecided against the expert recipe (trial 2) after 12 rounds" in confirmations.outcomes(verdict)
    assert result_display._verdict(catalog.verdict(verdict)) == f"yes: trial 1, {verdict['speedup']:.2f}x{studies}"
    why = "confirmed" if recommended == 1 else "recommended: the best expert recipe, the better estimate (undecided " \
                                               "after 12 rounds)"
    assert export.confirmation_status(verdict, recommended) == why


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
