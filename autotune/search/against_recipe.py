"""The confirmed winner against the best expert recipe and the best peer the study ran.

Beating PyTorch's defaults is the least a winner must do; a user tuning by hand would have tried
the experts' recipes first, and a user who wants CPU inference fast would also try another runtime
(OpenVINO, ONNX Runtime) by its documented path. So the confirmation runs the best expert recipe
(the completed recipe trial on a PyTorch backend with the largest speedup in the search) and the
best peer (the same among the recipe trials on another runtime, `study/references.py`) in its
rounds, beside the candidates when they are not among them, and reports the winner against each
from the same paired rounds: the Hodges-Lehmann speedup, the inverted signed-rank interval and the
one-sided p-value of a gain above the minimum effect (`stats.paired_speedup`, as for each candidate
against the defaults). Both are references, not candidates: they stay out of Holm's family, so
adding them never changes which candidates are significant.

- **beats**: the winner is faster than the reference by more than the minimum effect (p < ALPHA).
- **slower**: the reference is faster than the winner by more than the minimum effect (the same
  test the other way round).
- **ties**: neither.

`recommended_trial` is what `export` writes unless `--trial N` asks for another. Against the expert
recipe: the winner when it beats the recipe, the recipe when it is faster, and on a tie the simpler
of the two (fewer knobs away from PyTorch's defaults; the winner on equal counts). Then the peer:
it is recommended only when it is faster than that recommendation (than the winner, and than the
recipe as well when the recipe was recommended), since a peer is never the simpler one: it needs
another runtime. The winner is chosen as the largest of several significant speedups, which
flatters it a little, and the tests against the references keep a flattering tie from being sold
as a gain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import optuna
from optuna.trial import FrozenTrial

from autotune.base.thresholds import ALPHA
from autotune.config.knobs import Config
from autotune.measure import stats
from autotune.measure.objectives import Metric
from autotune.study import records, references

Kind = Literal["recipe", "peer"]
# How a verdict names each reference: the key of the verdict, and the words of its sentence.
KEYS: dict[Kind, str] = {"recipe": "against_recipe", "peer": "against_peer"}
NAMED: dict[Kind, str] = {"recipe": "the expert recipe", "peer": "the best peer"}


def best_recipe(study: optuna.Study, metric: Metric) -> FrozenTrial | None:
    """The expert recipe the confirmation runs: the completed one with the largest speedup in `metric`."""
    return _runnable(references.best_recipe(study, records.speedup_key(metric)))


def best_peer(study: optuna.Study, metric: Metric) -> FrozenTrial | None:
    """The peer recipe the confirmation runs: the completed one with the largest speedup in `metric`."""
    return _runnable(references.best_peer(study, records.speedup_key(metric)))


def _runnable(trial: FrozenTrial | None) -> FrozenTrial | None:
    return trial if trial is not None and "plan" in trial.user_attrs else None


def knobs_away(config: str) -> int:
    """How many knobs a recorded configuration sets away from PyTorch's defaults."""
    return 0 if config in ("", "defaults") else len(Config.from_assignments(config.split()).values)


def compare(reference: FrozenTrial, reference_values: Sequence[float | None], winner: Mapping[str, Any],
            ratios: Sequence[float], min_effect: float, kind: Kind = "recipe") -> dict[str, Any]:
    """The verdict's `against_recipe` (or `against_peer`): the winner (a candidate row) against
    `reference`, from the per-round speedups of the winner over it (`ratios`, rounds where both
    ran). A winner that is the reference's configuration is the reference."""
    found: dict[str, Any] = {"trial": reference.number, "recipe": str(reference.user_attrs.get("recipe", "")),
                             "config": reference.user_attrs.get("config"), "winner_trial": winner["trial"],
                             "speedup": None, "ci": None, "ci_label": None, "ci_coverage": None, "p_value": None,
                             "p_value_slower": None}
    if winner["trial"] == reference.number or winner["config"] == reference.user_attrs.get("config"):
        return found | {"status": f"is the {kind}", "recommended_trial": reference.number}
    failed = sum(v is None for v in reference_values)
    if failed or len(ratios) < 2:
        return found | {"status": f"{kind} failed", "recommended_trial": winner["trial"],
                        "reason": f"the {kind} failed {failed} of {len(reference_values)} runs"}
    gain = stats.paired_speedup(list(ratios), min_effect)
    loss = stats.paired_speedup([1 / r for r in ratios], min_effect)
    status = "beats" if gain.p_value < ALPHA else "slower" if loss.p_value < ALPHA else "ties"
    interval = gain.interval
    found.update(speedup=round(gain.speedup, 4), ci=[round(interval.low, 4), round(interval.high, 4)],
                 ci_label=interval.label, ci_coverage=round(interval.coverage, 4), p_value=gain.p_value,
                 p_value_slower=loss.p_value, status=status)
    return found | {"recommended_trial": _recommended(kind, status, reference, winner)}


def _recommended(kind: Kind, status: str, reference: FrozenTrial, winner: Mapping[str, Any]) -> int:
    if status == "slower":
        return reference.number
    if status == "beats" or kind == "peer":  # a peer is never the simpler: it needs another runtime
        return int(winner["trial"])
    winner_config = str(winner["config"])
    simpler = references.runs_in_peer(winner_config) or \
        knobs_away(str(reference.user_attrs.get("config", ""))) < knobs_away(winner_config)
    return reference.number if simpler else int(winner["trial"])


def weigh_peer(peer: dict[str, Any], recipe: Mapping[str, Any] | None, peer_over_recipe: Sequence[float],
               min_effect: float) -> dict[str, Any]:
    """`peer` (compare's `against_peer`) with the trial recommended once the peer is weighed: the
    expert recipe's recommendation, unless the peer is faster than the winner and, when the
    recipe was recommended, faster than the recipe too (`peer_over_recipe`: its per-round
    speedups over the recipe)."""
    earlier = int(recipe["recommended_trial"]) if recipe else int(peer["winner_trial"])
    if peer["status"] != "slower" or earlier == peer["winner_trial"]:
        return peer | {"recommended_trial": peer["recommended_trial"] if peer["status"] == "slower" else earlier}
    over = stats.paired_speedup(list(peer_over_recipe), min_effect) if len(peer_over_recipe) >= 2 else None
    beats_recipe = over is not None and over.p_value < ALPHA
    return peer | {"recommended_trial": peer["trial"] if beats_recipe else earlier,
                   "over_recipe": None if over is None else {"speedup": round(over.speedup, 4),
                                                             "p_value": over.p_value}}


def recommended(winner: int, recipe: Mapping[str, Any] | None, peer: Mapping[str, Any] | None) -> int:
    """The trial a verdict with a winner recommends: the last word of the references compared."""
    return int((peer or recipe or {"recommended_trial": winner})["recommended_trial"])


def sentence(found: Mapping[str, Any] | None, kind: Kind = "recipe") -> str:
    """The verdict's words about a reference ("" when nothing was compared)."""
    if not found:
        return ""
    named = f"{NAMED[kind]} {found['recipe']!r} (trial {found['trial']})"
    status = found["status"]
    if status == f"is the {kind}":
        return f"; it is {named}"
    if status == f"{kind} failed":
        return f"; {named} could not be compared: {found['reason']}"
    measured = (f"{found['speedup']:.3f}x it ({found['ci_label']} {found['ci'][0]:.3f}-{found['ci'][1]:.3f}, "
                f"p={found['p_value']:.3g})")
    if status == "beats":
        return f"; it beats {named}: {measured}"
    if status == "slower":
        return f"; but {named} is faster: the winner is {measured}, {_so(found, kind)}"
    return f"; it ties with {named}: {measured}; {_tie(found, kind)}"


def _so(found: Mapping[str, Any], kind: Kind) -> str:
    if found["recommended_trial"] == found["trial"]:
        return f"so the {kind} is recommended"
    over = found.get("over_recipe")
    shown = f" ({over['speedup']:.3f}x it, p={over['p_value']:.3g})" if over else ""
    return (f"but not shown faster than the expert recipe{shown}, so trial {found['recommended_trial']} stays "
            f"recommended (the peer needs another runtime)")


def _tie(found: Mapping[str, Any], kind: Kind) -> str:
    if kind == "peer":
        return f"trial {found['recommended_trial']} stays recommended (the peer needs another runtime)"
    if found["recommended_trial"] == found["trial"]:
        return "the recipe, the simpler of the two, is recommended"
    return f"trial {found['winner_trial']} is recommended (it sets no more knobs than the recipe)"
