"""Warm start (search/warm.py): a new study on a host class where other studies ran starts with
what won there, as Optuna-enqueued trials recorded as such, right after the baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.host.machine import Machine
from autotune.measure.replicates import PlanRunner
from autotune.search import loop, opening, warm
from tests.conftest import lscpu
from tests.support.studies import DEFAULT, fake_runner, ok_runner, request


def run(tmp_path: Path, here: Machine, trials: int, runner: PlanRunner = fake_runner, **kw: object) -> opening.Search:
    opened = opening.open_search(request(tmp_path, trials, **kw), here)
    loop.run_search(opened, here, lambda event: None, runner=runner)
    return opened


def test_a_second_study_on_this_host_class_starts_with_what_won_in_the_first(tmp_path: Path, here: Machine) -> None:
    first = run(tmp_path, here, 20, study="first")  # every configuration of the space: its best among them
    won = first.study.best_trial.user_attrs["config"]
    assert "jemalloc" in won and "intel" in won  # the landscape's best: 70 ms
    second = run(tmp_path, here, 3, study="second", batch_size=2)
    assert any(note.startswith("warm start: the first 1 trials after the baseline measure what won") and
               f"{won} from study first's trial {first.study.best_trial.number} (best, unconfirmed, 1.43x"
               in note for note in second.notes)
    trials = second.study.get_trials()
    assert trials[0].user_attrs["baseline"]
    assert trials[1].user_attrs["proposed_by"] == "warm start" and trials[1].user_attrs["config"] == won
    assert trials[1].user_attrs[warm.ATTR] == {"study": "first", "trial": first.study.best_trial.number,
                                               "config": won, "speedup": pytest.approx(1.4286, abs=1e-3),
                                               "confirmed": False}
    found = warm.summary(trials, second.study.best_trial)
    assert found is not None and found["best_from_warm_start"] and found["best_first_measured_at"] == 1


def test_no_warm_start_starts_cold_and_a_resumed_study_is_not_enqueued_again(tmp_path: Path, here: Machine) -> None:
    run(tmp_path, here, 6, study="first")
    cold = run(tmp_path, here, 3, study="cold", warm_start=False)
    assert not any("warm start" in note for note in cold.notes)
    assert warm.summary(cold.study.get_trials(), cold.study.best_trial) is None
    again = run(tmp_path, here, 4, study="cold")  # resumed: it holds trials, so nothing is enqueued now
    assert not any("warm start" in note for note in again.notes)


def test_studies_of_another_host_class_or_objective_and_files_that_are_no_study_give_nothing(
        tmp_path: Path, here: Machine) -> None:
    other = Machine(lscpu("xeon_2s_ht"), here.libs)
    run(tmp_path, other, 6, study="elsewhere")
    run(tmp_path, here, 4, study="throughput", objective="throughput")
    (tmp_path / "studies" / "notes.db").write_text("not a database")
    (tmp_path / "studies" / "empty.db").write_bytes(b"")
    fresh = run(tmp_path, here, 2, study="fresh")
    assert not any("warm start" in note for note in fresh.notes)
    assert (tmp_path / "studies" / "notes.db").read_text() == "not a database"  # read, never written
    assert (tmp_path / "studies" / "empty.db").read_bytes() == b""


def test_search_json_says_what_the_warm_start_gave(tmp_path: Path, here: Machine) -> None:
    from autotune.cli import summaries

    run(tmp_path, here, 20, study="first")  # every configuration: 6 unseeded trials may miss the best, and then
    second = run(tmp_path, here, 3, study="second", batch_size=2)  # the second's own sample may beat its warm start
    body = summaries.search(second.study, second.storage, [second.study.best_trial], "", False)
    found = json.loads(json.dumps(body))["warm_start"]
    assert [e["study"] for e in found["enqueued"]] == ["first"] and found["best_from_warm_start"] is True


def test_a_reference_the_confirmation_could_not_tell_apart_starts_too_and_a_recipe_as_itself(
        tmp_path: Path, here: Machine) -> None:
    """On another model the recipe the first study's winner tied with may be the faster: both start
    the second study, the recipe with its knobs alone and under its name (the comparison with the
    best recipe finds it), and not measured again among the recipes."""
    first = run(tmp_path, here, 5, ok_runner, study="first", space=DEFAULT)
    trials = first.study.get_trials()
    recipe = next(t for t in trials if t.user_attrs.get("recipe") and t.number != first.study.best_trial.number)
    best = first.study.best_trial
    assert recipe.number != best.number
    first.study.set_user_attr("confirmation", {
        "recommended_trial": best.number,
        "against_recipe": {"trial": recipe.number, "recipe": recipe.user_attrs["recipe"], "status": "undecided"},
        "against_peer": {"trial": best.number, "status": "beats"}})
    second = run(tmp_path, here, 5, ok_runner, study="second", space=DEFAULT)
    started = [t for t in second.study.get_trials() if warm.ATTR in t.user_attrs]
    assert [t.user_attrs[warm.ATTR]["trial"] for t in started] == [best.number, recipe.number]  # fastest first
    assert [(t.user_attrs[warm.ATTR]["confirmed"], t.user_attrs[warm.ATTR].get("tied")) for t in started] == \
        [(True, None), (False, "undecided")]
    assert any(f"from study first's trial {recipe.number} (undecided against its confirmed winner" in note
               for note in second.notes)
    again = started[1]
    assert again.user_attrs["recipe"] == recipe.user_attrs["recipe"] and again.user_attrs["proposed_by"] == "warm start"
    assert again.user_attrs["config"] == recipe.user_attrs["config"]  # its knobs alone
    ran = [t.user_attrs.get("config") for t in second.study.get_trials()]
    assert ran.count(recipe.user_attrs["config"]) == 1
    # a reference the confirmation told apart (it "beats" or "is slower") does not start anything
    first.study.set_user_attr("confirmation", {"recommended_trial": best.number,
                                               "against_recipe": {"trial": recipe.number, "status": "beats"}})
    third = run(tmp_path, here, 3, ok_runner, study="third", space=DEFAULT)
    assert [t.user_attrs[warm.ATTR]["trial"] for t in third.study.get_trials() if warm.ATTR in t.user_attrs] == \
        [best.number]
