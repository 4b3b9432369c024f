"""The confirmed winner against the best expert recipe and the best peer the study ran.

Beating PyTorch's defaults is the least a winner must do; a user tuning by hand would have tried
the experts' recipes first, and a user who wants CPU inference fast would also try another runtime
(OpenVINO, ONNX Runtime) by its documented path. So the confirmation runs the best expert recipe
(the completed recipe trial on a PyTorch backend with the largest speedup in the search) and the
best peer (the same among the recipe trials on another runtime, `study/references.py`) in its
rounds, beside the candidates when they are not among them, and judges the winner against each
from the same paired rounds, at the same look of the sequential design as the candidates
(`measure/sequential.py`: the Hodges-Lehmann speedup, the inverted signed-rank interval and the
exact one-sided tests). Both are references, not candidates: they stay out of Holm's family, so
adding them never changes which candidates are significant.

- **beats**: the winner is faster than the reference by more than the minimum effect.
- **slower**: the reference is faster than the winner by more than the minimum effect.
- **equivalent**: the two are within the minimum effect of each other, either way (both tests of
  the equivalence pair reject): the whole interval lies inside.
- **undecided**: none of them, yet: the rounds go on while one is, up to the cap.

`recommended_trial` is what `export` writes unless `--trial N` asks for another. Against the expert
recipe: the winner when it beats the recipe, the recipe when it is faster, the simpler of the two
only when they are equivalent (fewer knobs away from PyTorch's defaults; the winner on equal
counts), and, undecided at the cap, the one with the better estimate: never the slower estimate
for being simpler. Then the peer: it is recommended only when it is faster than that
recommendation (than the winner, and than the recipe as well when the recipe was recommended),
or, undecided at the cap, has the better estimate; an equivalent peer never is, since it needs
another runtime. The winner is chosen as the largest of several significant speedups, which
flatters it a little, and the tests against the references keep a flattered lead from being sold
as a gain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import optuna
from optuna.trial import FrozenTrial

from autotune.config.knobs import Config
from autotune.measure import sequential
from autotune.measure.objectives import Metric
from autotune.measure.sequential import Design, Judged, Look
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
            ratios: Sequence[float], min_effect: float, look: Look, plan: Design,
            kind: Kind = "recipe") -> dict[str, Any]:
    """The verdict's `against_recipe` (or `against_peer`): the winner (a candidate row) against
    `reference` at `look` of `plan`, from the per-round speedups of the winner over it (`ratios`,
    rounds where both ran). A winner that is the reference's configuration is the reference."""
    found: dict[str, Any] = {"trial": reference.number, "recipe": str(reference.user_attrs.get("recipe", "")),
                             "config": reference.user_attrs.get("config"), "winner_trial": winner["trial"],
                             "speedup": None, "ci": None, "ci_label": None, "ci_coverage": None, "p_value": None,
                             "p_value_slower": None, "p_value_equivalent": None, "rounds": len(ratios)}
    if winner["trial"] == reference.number or winner["config"] == reference.user_attrs.get("config"):
        return found | {"status": f"is the {kind}", "recommended_trial": reference.number}
    failed = sum(v is None for v in reference_values)
    if failed or len(ratios) < 2:
        return found | {"status": f"{kind} failed", "recommended_trial": winner["trial"],
                        "reason": f"the {kind} failed {failed} of {len(reference_values)} runs"}
    judged = sequential.judge(ratios, look, plan, min_effect)
    found.update(judged_fields(judged), status=judged.outcome)
    return found | {"recommended_trial": _recommended(kind, judged, reference, winner)}


def judged_fields(judged: Judged) -> dict[str, Any]:
    """A comparison's figures as a verdict stores them: the speedup, its interval and each test's p."""
    interval = judged.interval
    return {"speedup": round(judged.speedup, 4), "ci": [round(interval.low, 4), round(interval.high, 4)],
            "ci_label": interval.label, "ci_coverage": round(interval.coverage, 4), "p_value": judged.p_gain,
            "p_value_slower": judged.p_loss, "p_value_equivalent": judged.p_equivalent}


def _recommended(kind: Kind, judged: Judged, reference: FrozenTrial, winner: Mapping[str, Any]) -> int:
    if judged.outcome == "slower" or (judged.outcome == "undecided" and judged.speedup < 1):
        return reference.number  # faster, or undecided with the better estimate
    if judged.outcome != "equivalent" or kind == "peer":  # a peer is never the simpler: it needs another runtime
        return int(winner["trial"])
    winner_config = str(winner["config"])
    simpler = references.runs_in_peer(winner_config) or \
        knobs_away(str(reference.user_attrs.get("config", ""))) < knobs_away(winner_config)
    return reference.number if simpler else int(winner["trial"])


def weigh_peer(peer: dict[str, Any], recipe: Mapping[str, Any] | None, peer_over_recipe: Sequence[float],
               min_effect: float, look: Look, plan: Design) -> dict[str, Any]:
    """`peer` (compare's `against_peer`) with the trial recommended once the peer is weighed: the
    expert recipe's recommendation, unless the peer is preferred to the winner (faster, or
    undecided with the better estimate) and, when the recipe was recommended, is preferred to the
    recipe too by the same rule (`peer_over_recipe`: its per-round speedups over the recipe); an
    equivalent peer is never preferred."""
    earlier = int(recipe["recommended_trial"]) if recipe else int(peer["winner_trial"])
    preferred = peer["status"] in ("slower", "undecided") and peer["recommended_trial"] == peer["trial"]
    if not preferred or earlier == peer["winner_trial"]:
        return peer | {"recommended_trial": peer["trial"] if preferred else earlier}
    over = sequential.judge(peer_over_recipe, look, plan, min_effect) if len(peer_over_recipe) >= 2 else None
    wins = over is not None and (over.outcome == "beats" or (over.outcome == "undecided" and over.speedup > 1))
    return peer | {"recommended_trial": peer["trial"] if wins else earlier,
                   "over_recipe": None if over is None else {"speedup": round(over.speedup, 4),
                                                             "p_value": over.p_gain, "outcome": over.outcome}}


def settled(found: Mapping[str, Any] | None) -> bool:
    """Whether the winner against a reference (compare's, after `weigh_peer`) is decided: its own
    outcome, and the peer's against the recipe when that chose between them."""
    if not found:
        return True
    over = found.get("over_recipe") or {}
    return found["status"] != "undecided" and over.get("outcome") != "undecided"


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
    measured = _measured(found)
    if status == "beats":
        return f"; it beats {named}: {measured}"
    if status == "slower":
        return f"; but {named} is faster: the winner is {measured}, {_so(found, kind)}"
    if status == "equivalent":
        return f"; it is equivalent to {named}: {measured}; {_alike(found, kind)}"
    return f"; against {named} it is undecided after {found['rounds']} rounds: {measured}; {_unsure(found, kind)}"


def _measured(found: Mapping[str, Any]) -> str:
    """'1.149x it (90.4% CI 0.983-1.312, p=0.0801)': the p of the test behind the outcome."""
    p_value = {"slower": found["p_value_slower"], "equivalent": found["p_value_equivalent"]}.get(
        found["status"], found["p_value"])
    named = "equivalence p" if found["status"] == "equivalent" else "p"
    return (f"{found['speedup']:.3f}x it ({found['ci_label']} {found['ci'][0]:.3f}-{found['ci'][1]:.3f}, "
            f"{named}={p_value:.3g})")


def _so(found: Mapping[str, Any], kind: Kind) -> str:
    if found["recommended_trial"] == found["trial"]:
        return f"so the {kind} is recommended{_over_words(found)}"
    over = found.get("over_recipe")
    shown = f" ({over['speedup']:.3f}x it, p={over['p_value']:.3g})" if over else ""
    return (f"but not shown faster than the expert recipe{shown}, so trial {found['recommended_trial']} stays "
            f"recommended (the peer needs another runtime)")


def _over_words(found: Mapping[str, Any]) -> str:
    """Why a peer chosen over a recommended recipe was chosen on its estimate alone ("" otherwise)."""
    over = found.get("over_recipe") or {}
    if over.get("outcome") != "undecided":
        return ""
    return f" (against the expert recipe undecided: {over['speedup']:.3f}x it, the better estimate)"


def _alike(found: Mapping[str, Any], kind: Kind) -> str:
    if kind == "peer":
        return f"trial {found['recommended_trial']} stays recommended (the peer needs another runtime)"
    if found["recommended_trial"] == found["trial"]:
        return "the recipe, the simpler of the two, is recommended"
    return f"trial {found['winner_trial']} is recommended (it sets no more knobs than the recipe)"


def _unsure(found: Mapping[str, Any], kind: Kind) -> str:
    if found["recommended_trial"] == found["trial"]:
        return f"the {kind}, the better estimate, is recommended{_over_words(found)}"
    if kind == "peer" and found["speedup"] < 1:  # the peer's estimate was better, but not against the recipe
        return _so(found, kind)
    return f"trial {found['recommended_trial']}, the better estimate, is recommended"
