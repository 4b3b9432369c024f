"""The confirmed winner against the best peer (search/against_recipe.py): the best recipe trial on
another runtime (OpenVINO, ONNX Runtime) runs in the rounds beside the best expert recipe, neither
in Holm's family; a peer faster than the winner is recommended and exported, an equivalent one keeps
the earlier recommendation, and a study where no peer ran says nothing of peers. Each display carries
the verdict's `against_peer` as it carries `against_recipe`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.cli import result_display, summaries, verdicts
from autotune.deploy import export
from autotune.report import contents
from autotune.search import budget, loop
from autotune.study import catalog, references
from tests.support import verdicts as fakes
from tests.support.verdicts import FAILS, confirmed

SIMPLE = "allocator=jemalloc"  # the expert recipe
BUSY = "mkldnn=on omp_runtime=intel allocator=jemalloc"  # the sampled winner
OV = "backend=openvino"
OV_INT8 = "backend=openvino precision=int8"
ORT = "backend=onnxruntime"
CONFIGS = ("defaults", SIMPLE, BUSY, OV, OV_INT8, ORT)
INT8_NAME = "OpenVINO int8 (NNCF)"


def trial(config: str, search_ms: float, **attrs: object) -> FrozenTrial:
    return fakes.trial(config, search_ms, CONFIGS, **attrs)


def study(peers: bool = True, int8_search_ms: float = 55.0) -> optuna.Study:
    """Trial 0 the baseline, 1 the sampled winner, 2 the expert recipe, 3-5 the peer recipes; the
    OpenVINO int8 recipe (4) measured faster in the search than the expert recipe: only its backend
    keeps it from being taken for the best expert recipe."""
    made = optuna.create_study(direction="minimize")
    made.add_trial(trial("defaults", 100.0, baseline=True))
    made.add_trial(trial(BUSY, 50.0))
    made.add_trial(trial(SIMPLE, 60.0, recipe="jemalloc (expert recipe)"))
    if peers:
        made.add_trial(trial(OV, 150.0, recipe="OpenVINO defaults (LATENCY hint)"))
        made.add_trial(trial(OV_INT8, int8_search_ms, recipe=INT8_NAME))
        made.add_trial(trial(ORT, 160.0, recipe="ONNX Runtime defaults"))
    return made


def latencies(**changed: float) -> dict[str, float]:
    """What each configuration takes in the confirmation: the winner 50 ms, the recipe 80 ms."""
    base = {"defaults": 100.0, BUSY: 50.0, SIMPLE: 80.0, OV: 150.0, OV_INT8: 50.5, ORT: 160.0}
    return base | {{"recipe": SIMPLE, "int8": OV_INT8, "winner": BUSY}[k]: v for k, v in changed.items()}


def ran(verdict: dict[str, Any]) -> set[int]:
    return {t for order in verdict["orders"] for t in order}


def test_a_peer_recipe_is_a_peer_by_its_backend_and_never_the_best_expert_recipe() -> None:
    made = study()
    by_number = {t.number: t for t in made.get_trials()}
    assert [references.is_peer(by_number[n]) for n in range(6)] == [False, False, False, True, True, True]
    assert references.best_recipe(made, "speedup_latency").number == 2  # type: ignore[union-attr]
    assert references.best_peer(made, "speedup_latency").number == 4  # type: ignore[union-attr]
    assert references.runs_in_peer("backend=onnxruntime ort_execution=parallel ort_inter_threads=2")
    assert not references.runs_in_peer("backend=inductor precision=int8") and not references.runs_in_peer("defaults")


def test_a_winner_equivalent_to_the_peer_stays_recommended() -> None:
    made = study()
    labels: set[str] = set()
    verdict = confirmed(made, latencies(), on_run=lambda event: labels.add(event.contender.label))
    assert labels == {"trial 0 (baseline)", "trial 1", "trial 2 (recipe)", "trial 4 (peer)"}
    assert verdict["winner_trial"] == 1 and [row["trial"] for row in verdict["candidates"]] == [1]  # Holm's family: 1
    assert ran(verdict) == {0, 1, 2, 4}  # the best expert recipe and the best peer run beside; other peers do not
    assert verdict["against_recipe"]["trial"] == 2 and verdict["against_recipe"]["status"] == "beats"
    peer = verdict["against_peer"]
    assert (peer["trial"], peer["recipe"], peer["status"]) == (4, INT8_NAME, "equivalent")
    assert peer["ci"][0] > 1 / 1.03 and peer["ci"][1] < 1.03 and peer["p_value_equivalent"] < verdict["alpha_look"]
    assert peer["speedup"] == pytest.approx(50.5 / 50, rel=0.02)
    assert peer["against_baseline"]["speedup"] == pytest.approx(100 / 50.5, rel=0.03)
    assert peer["against_baseline"]["trial"] == 4 and peer["against_baseline"]["p_value"] < 0.05  # no candidate
    assert verdict["recommended_trial"] == peer["recommended_trial"] == 1
    assert f"; it is equivalent to the best peer '{INT8_NAME}' (trial 4): 1.0" in verdict["message"]
    assert verdict["message"].endswith("; trial 1 stays recommended (the peer needs another runtime)")
    assert export.pick_trial(made, None).number == 1


def test_a_peer_faster_than_the_winner_is_recommended_and_exported() -> None:
    made = study()
    verdict = confirmed(made, latencies(int8=40.0))
    peer = verdict["against_peer"]
    assert peer["status"] == "slower" and peer["p_value_slower"] < 0.05 and peer["ci"][1] < 1
    assert verdict["against_recipe"]["status"] == "beats" and verdict["against_recipe"]["recommended_trial"] == 1
    assert verdict["winner_trial"] == 1 and verdict["recommended_trial"] == 4
    assert f"; but the best peer '{INT8_NAME}' (trial 4) is faster: the winner is 0.8" in verdict["message"]
    assert verdict["message"].endswith(", so the peer is recommended")
    assert export.pick_trial(made, None).number == 4
    text = export.render(made, export.pick_trial(made, None))
    assert f"# confirmed: {verdict['message']}" in text.replace("\\n", "\n")
    assert export.confirmation_status(verdict, 4) == "recommended: the best peer, faster than the winner"
    assert export.confirmation_status(verdict, 1) == "not chosen: confirmation chose trial 4"


@pytest.mark.parametrize(("recipe_ms", "int8_ms", "recommended"), [(40.0, 40.3, 2), (45.0, 35.0, 4)])
def test_a_peer_faster_than_the_winner_must_beat_a_recommended_recipe_too(
        recipe_ms: float, int8_ms: float, recommended: int) -> None:
    verdict = confirmed(study(), latencies(recipe=recipe_ms, int8=int8_ms))
    assert verdict["against_recipe"]["status"] == "slower" and verdict["against_recipe"]["recommended_trial"] == 2
    peer = verdict["against_peer"]
    assert peer["status"] == "slower" and verdict["recommended_trial"] == peer["recommended_trial"] == recommended
    assert (peer["over_recipe"]["p_value"] < 0.05) == (recommended == 4)
    words = ("but not shown faster than the expert recipe (0.993x it, p=1), so trial 2 stays recommended (the "
             "peer needs another runtime)" if recommended == 2 else "so the peer is recommended")
    assert verdict["message"].endswith(words)


def test_a_winner_that_is_the_peer_is_compared_with_the_best_expert_recipe() -> None:
    made = study(int8_search_ms=49.0)  # the best two measured: the peer (49 ms) and the sampled trial (50 ms)
    verdict = confirmed(made, latencies(int8=40.0, winner=60.0), top=2)
    assert {row["trial"] for row in verdict["candidates"]} == {1, 4} and ran(verdict) == {0, 1, 2, 4}
    assert verdict["winner_trial"] == 4 and verdict["against_peer"]["status"] == "is the peer"
    assert "against_baseline" not in verdict["against_peer"]  # a candidate: its row is among theirs
    versus = verdict["against_recipe"]
    assert versus["trial"] == 2 and versus["winner_trial"] == 4 and versus["status"] == "beats"
    assert verdict["recommended_trial"] == 4
    assert verdict["message"].endswith(f"; it is the best peer '{INT8_NAME}' (trial 4)")
    assert "; it beats the expert recipe 'jemalloc (expert recipe)' (trial 2): 2.0" in verdict["message"]


def test_a_peer_winner_equivalent_to_the_expert_recipe_is_never_the_simpler() -> None:
    made = study(int8_search_ms=49.0)
    made.add_trial(trial(OV, 48.0, recipe="OpenVINO defaults (LATENCY hint)"))  # one knob, as the recipe
    verdict = confirmed(made, latencies(recipe=45.3, winner=60.0) | {OV: 45.0}, top=1)
    assert verdict["winner_trial"] == 6 and verdict["against_peer"]["status"] == "is the peer"
    assert verdict["against_recipe"]["status"] == "equivalent" and verdict["recommended_trial"] == 2
    assert "; it is equivalent to the expert recipe 'jemalloc (expert recipe)' (trial 2): " in verdict["message"]
    assert "the recipe, the simpler of the two, is recommended" in verdict["message"]


def test_without_a_peer_nothing_is_said_of_peers() -> None:
    made = study(peers=False)
    verdict = confirmed(made, latencies())
    assert verdict["against_peer"] is None and "peer" not in verdict["message"]
    assert ran(verdict) == {0, 1, 2} and verdict["recommended_trial"] == 1
    failed = study(peers=False)  # a peer recipe that failed in the search is no reference
    failed.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"recipe": INT8_NAME,
                                                                                   "config": OV_INT8}))
    assert confirmed(failed, latencies())["against_peer"] is None


def test_a_peer_that_fails_in_the_rounds_cannot_be_compared() -> None:
    verdict = confirmed(study(), latencies(int8=FAILS))
    peer = verdict["against_peer"]
    assert peer["status"] == "peer failed" and peer["reason"] == "the peer failed 7 of 7 runs"
    assert verdict["recommended_trial"] == 1 and [row["trial"] for row in verdict["candidates"]] == [1]
    assert verdict["rounds"] == 7 and verdict["decided"]  # a peer that fails decides nothing more: the first look
    assert verdict["message"].endswith(f"; the best peer '{INT8_NAME}' (trial 4) could not be compared: the peer "
                                       "failed 7 of 7 runs")


def test_the_budget_reserves_the_peers_processes_as_the_recipes() -> None:
    made = study()
    search = SimpleNamespace(study=made, request=SimpleNamespace(confirm_top=1, confirm_rounds=12))
    assert loop._candidates(search) == [1, 2, 4]  # type: ignore[arg-type]
    limit = budget.TimeBudget(6000, rounds=12, top=1, replicates=3, window_s=2.0, warm=True)  # the cap fits
    trials = [budget.Spent(12.0, baseline=True), budget.Spent(6.0, number=1)]
    assert limit.reserve(trials, finished=6, trial_s=10.0, candidates=[1, 2, 4])[0] == 12 * 4
    assert limit.reserve(trials, finished=6, trial_s=10.0, candidates=[1, 2])[0] == 12 * 3


def test_every_display_carries_the_peer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    made = study()
    verdict = confirmed(made, latencies(int8=40.0))
    verdicts.confirmation(verdict)
    table = capsys.readouterr().out
    assert "4 (peer)" in table and "peer reference" in table and "2 (recipe)" in table
    body = summaries.search(made, "sqlite:///x.db", [made.trials[1]], "", True)
    assert body["confirmation"]["against_peer"] == verdict["against_peer"]
    row = catalog.row(made, "sqlite:///x.db")
    assert row["confirmation"]["against_peer"] == {"trial": 4, "recipe": INT8_NAME, "status": "slower",
                                                   "speedup": verdict["against_peer"]["speedup"]}
    assert result_display._verdict(row["confirmation"]) == (
        f"yes: trial 1, {verdict['speedup']:.2f}x, peer trial 4 recommended; vs peer trial 4: "
        f"{verdict['against_peer']['speedup']:.2f}x, slower")
    forest = contents.forest(made.user_attrs["confirmation"])
    assert forest is not None and forest.against_peer == verdict["against_peer"]
    peer_row = next(r for r in forest.rows if r.trial == 4)
    assert peer_row.reference == "peer" and peer_row.reason.startswith("the best peer (another runtime)")
    assert [r.reference for r in forest.rows] == ["", "recipe", "peer"]
    report = SimpleNamespace(name="s", metrics=("latency_p50_ms",), counts={}, best=None, forest=forest,
                             importances=(), failures=(), traces=(), efficiency=None)
    summary = contents.summary(report, tmp_path / "r.html")  # type: ignore[arg-type]
    assert summary["confirmation"]["against_peer"] == verdict["against_peer"]
    assert summary["confirmation"]["recommended_trial"] == 4 and "the best peer" in summary["confirmation"]["message"]
