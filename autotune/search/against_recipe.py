"""The confirmed winner against the best expert recipe the study ran.

Beating PyTorch's defaults is the least a winner must do; a user tuning by hand would have tried
the experts' recipes first. So the confirmation always runs the best recipe of the study (the
completed recipe trial with the largest speedup in the search) in its rounds, beside the
candidates when it is not one of them, and reports the winner against it from the same paired
rounds: the Hodges-Lehmann speedup, the inverted signed-rank interval and the one-sided p-value of
a gain above the minimum effect (`stats.paired_speedup`, as for each candidate against the
defaults). The recipe is a reference, not a candidate: it stays out of Holm's family, so adding it
never changes which candidates are significant.

- **beats**: the winner is faster than the recipe by more than the minimum effect (p < ALPHA);
  it is recommended.
- **slower**: the recipe is faster than the winner by more than the minimum effect (the same test
  the other way round); the recipe is recommended.
- **ties**: neither; the simpler of the two (fewer knobs away from PyTorch's defaults; the
  winner on a tie) is recommended, since nothing measured says the other is faster.

`recommended_trial` is what `export` writes unless `--trial N` asks for another; the winner is
chosen as the largest of several significant speedups, which flatters it a little, and the test
against the recipe is what keeps a flattering tie from being sold as a gain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.base.thresholds import ALPHA
from autotune.config.knobs import Config
from autotune.measure import stats
from autotune.measure.objectives import Metric
from autotune.study import records, references


def best_recipe(study: optuna.Study, metric: Metric) -> FrozenTrial | None:
    """The recipe trial the confirmation runs: the completed one with the largest speedup in `metric`."""
    trial = references.best_recipe(study, records.speedup_key(metric))
    return trial if trial is not None and "plan" in trial.user_attrs else None


def knobs_away(config: str) -> int:
    """How many knobs a recorded configuration sets away from PyTorch's defaults."""
    return 0 if config in ("", "defaults") else len(Config.from_assignments(config.split()).values)


def compare(recipe: FrozenTrial, recipe_values: Sequence[float | None], winner: Mapping[str, Any],
            ratios: Sequence[float], min_effect: float) -> dict[str, Any]:
    """The verdict's `against_recipe`: the winner (a candidate row) against `recipe`, from the
    per-round speedups of the winner over the recipe (`ratios`, rounds where both ran). A winner
    that is the recipe's configuration is the recipe."""
    found: dict[str, Any] = {"trial": recipe.number, "recipe": str(recipe.user_attrs.get("recipe", "")),
                             "config": recipe.user_attrs.get("config"), "winner_trial": winner["trial"],
                             "speedup": None, "ci": None, "ci_label": None, "ci_coverage": None, "p_value": None,
                             "p_value_slower": None}
    if winner["trial"] == recipe.number or winner["config"] == recipe.user_attrs.get("config"):
        return found | {"status": "is the recipe", "recommended_trial": recipe.number}
    failed = sum(v is None for v in recipe_values)
    if failed or len(ratios) < 2:
        return found | {"status": "recipe failed", "recommended_trial": winner["trial"],
                        "reason": f"the recipe failed {failed} of {len(recipe_values)} runs"}
    gain = stats.paired_speedup(list(ratios), min_effect)
    loss = stats.paired_speedup([1 / r for r in ratios], min_effect)
    status = "beats" if gain.p_value < ALPHA else "slower" if loss.p_value < ALPHA else "ties"
    interval = gain.interval
    found.update(speedup=round(gain.speedup, 4), ci=[round(interval.low, 4), round(interval.high, 4)],
                 ci_label=interval.label, ci_coverage=round(interval.coverage, 4), p_value=gain.p_value,
                 p_value_slower=loss.p_value, status=status)
    return found | {"recommended_trial": _recommended(status, recipe, winner)}


def _recommended(status: str, recipe: FrozenTrial, winner: Mapping[str, Any]) -> int:
    if status == "beats":
        return int(winner["trial"])
    if status == "slower":
        return recipe.number
    simpler = knobs_away(str(recipe.user_attrs.get("config", ""))) < knobs_away(str(winner["config"]))
    return recipe.number if simpler else int(winner["trial"])


def sentence(found: Mapping[str, Any] | None) -> str:
    """The verdict's words about the recipe ("" when nothing was compared)."""
    if not found:
        return ""
    named = f"the expert recipe {found['recipe']!r} (trial {found['trial']})"
    status = found["status"]
    if status == "is the recipe":
        return f"; it is {named}"
    if status == "recipe failed":
        return f"; {named} could not be compared: {found['reason']}"
    measured = (f"{found['speedup']:.3f}x it ({found['ci_label']} {found['ci'][0]:.3f}-{found['ci'][1]:.3f}, "
                f"p={found['p_value']:.3g})")
    if status == "beats":
        return f"; it beats {named}: {measured}"
    if status == "slower":
        return f"; but {named} is faster: the winner is {measured}, so the recipe is recommended"
    chosen = ("the recipe, the simpler of the two, is recommended" if found["recommended_trial"] == found["trial"]
              else f"trial {found['winner_trial']} is recommended (it sets no more knobs than the recipe)")
    return f"; it ties with {named}: {measured}; {chosen}"
