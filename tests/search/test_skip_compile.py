"""Skipping a compile: in a latency search, a sampled inductor configuration whose (precision,
layout, threads) no trial of this host class measured is predicted from the keys that were, through
measured steps only, and pruned without running when the prediction is more than
thresholds.SKIP_COMPILE times the best trial's value, unless it runs at the best trial's threads. A
skipped trial is no measurement: its configuration is held until the evidence changes. Fake runner,
no processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune.base import thresholds
from autotune.cli import display
from autotune.config import space, space_fit
from autotune.config.knobs import Config
from autotune.host.libs import Libraries
from autotune.host.machine import Machine
from autotune.measure.plan import LaunchPlan
from autotune.measure.results import RunResult
from autotune.search import compile_skip, loop, opening
from autotune.study import records
from tests.conftest import FIXTURES, lscpu
from tests.support.samplers import Scripted
from tests.support.studies import fake_result, request

DEFAULT = space_fit.adapt(space.load(space.find("default")), 2, {"bf16": True, "int8": True})
COMPILED = FIXTURES / "spaces" / "compiled.yaml"
HERE = "c1a55"  # this host's class id; the trials of `told` record none (as before host classes)


def compiled(precision: str, layout: str, threads: int, **more: Any) -> Config:
    return Config.from_mapping({"backend": "inductor", "memory_format": layout, "precision": precision,
                                "omp_threads": threads, **more})


def told(study: optuna.Study, config: Config, value: float, pruned: bool = False) -> None:
    study.enqueue_trial(DEFAULT.params(config))
    trial = study.ask()
    DEFAULT.sample(trial, only=config)
    if pruned:  # given up: its median so far is its last intermediate value
        trial.report(value, 0)
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, value)


def searched() -> optuna.Study:
    """The first ten trials of the search at e962306: the compiled recipes, then int8 on one
    thread in both layouts."""
    study = optuna.create_study()
    told(study, Config(), 147.8)
    told(study, Config.from_mapping({"backend": "inductor", "memory_format": "channels_last"}), 101.0)
    told(study, Config.from_mapping({"backend": "inductor", "memory_format": "channels_last",
                                     "precision": "bf16"}), 49.0)
    told(study, Config.from_mapping({"backend": "inductor", "memory_format": "channels_last",
                                     "precision": "int8"}), 33.5)
    told(study, compiled("int8", "channels_last", 1, instances=2), 59.0, pruned=True)
    told(study, compiled("int8", "contiguous", 1, instances=2), 60.0, pruned=True)
    return study


def test_the_key_of_a_recipe_is_what_it_runs_and_eager_has_none() -> None:
    recipe = Config.from_mapping({"backend": "inductor", "memory_format": "channels_last", "precision": "int8"})
    assert compile_skip.compile_key(DEFAULT, recipe) == ("int8", "channels_last", 2, "buckets")  # all the cores
    assert compile_skip.compile_key(DEFAULT, compiled("bf16", "contiguous", 1, instances=2)) == (
        "bf16", "contiguous", 1, "buckets")
    assert compile_skip.compile_key(DEFAULT, Config()) is None
    assert compile_skip.compile_key(DEFAULT, Config.from_mapping({"backend": "torchscript"})) is None


def test_a_key_is_predicted_from_a_measured_key_times_the_measured_steps() -> None:
    trials = searched().get_trials()
    # bf16 at 1 thread: bf16 at 2 (49.0, trial 2) times int8's 1 thread over 2 (59.0 / 33.5)
    bf16 = compile_skip.predict_compile(DEFAULT, trials, ("bf16", "channels_last", 1, "buckets"), HERE)
    assert bf16 == compile_skip.Prediction(pytest.approx(49.0 * 59.0 / 33.5), 2, (("omp_threads", (4, 3)),))
    # the most hopeful route: fp32 contiguous from fp32 channels_last and int8's layout step
    fp32 = compile_skip.predict_compile(DEFAULT, trials, ("fp32", "contiguous", 2, "buckets"), HERE)
    assert fp32 == compile_skip.Prediction(pytest.approx(101.0 * 60.0 / 59.0), 1, (("memory_format", (5, 4)),))
    # two steps away: fp32 contiguous at 1 thread, fp32 channels_last times both of int8's steps
    far = compile_skip.predict_compile(DEFAULT, trials, ("fp32", "contiguous", 1, "buckets"), HERE)
    assert far is not None and far.value == pytest.approx(101.0 * 59.0 / 33.5 * 60.0 / 59.0)
    int8 = ("int8", "channels_last", 1, "buckets")
    assert compile_skip.predict_compile(DEFAULT, trials, int8, HERE) is None  # measured
    assert compile_skip.predict_compile(DEFAULT, [], int8, HERE) is None  # none measured
    # one dynamic model for every sequence length: no pair measured the step from a model per length
    assert compile_skip.predict_compile(DEFAULT, trials, ("int8", "channels_last", 1, "dynamic"), HERE) is None


def test_a_step_no_pair_measured_is_unknown_and_gives_no_prediction() -> None:
    recipes = searched().get_trials()[:4]
    # the recipes' int8 at 1 thread: no thread step measured, so no prediction (it used to be int8
    # at 2 threads' own value, "no change")
    assert compile_skip.predict_compile(DEFAULT, recipes, ("int8", "channels_last", 1, "buckets"), HERE) is None
    # bf16 contiguous at 1 thread: neither step measured; once int8's are (trials 4 and 5), bf16 at
    # 2 threads' 49.0 times both
    assert compile_skip.predict_compile(DEFAULT, recipes, ("bf16", "contiguous", 1, "buckets"), HERE) is None
    measured = compile_skip.predict_compile(DEFAULT, searched().get_trials(), ("bf16", "contiguous", 1, "buckets"),
                                            HERE)
    assert measured is not None and measured.value == pytest.approx(49.0 * 59.0 / 33.5 * 60.0 / 59.0)
    # one measured step is not enough for a route that needs two: fp32 contiguous at 1 thread from
    # the recipes and int8 at 1 thread in channels_last alone (a thread step, no layout step)
    thread_only = searched().get_trials()[:5]
    assert compile_skip.predict_compile(DEFAULT, thread_only, ("fp32", "contiguous", 1, "buckets"), HERE) is None
    assert compile_skip.predict_compile(DEFAULT, thread_only, ("fp32", "channels_last", 1, "buckets"), HERE) is not None


def test_a_prediction_reads_only_trials_of_this_host_class() -> None:
    trials = searched().get_trials()
    for trial in trials[4:]:  # int8's thread and layout steps, measured on another class
        trial.user_attrs = {records.HOST_CLASS: "elsewhere"}
    study = optuna.create_study()
    study.add_trials(trials)
    trials = study.get_trials()
    assert compile_skip.predict_compile(DEFAULT, trials, ("bf16", "channels_last", 1, "buckets"), HERE) is None
    assert compile_skip.skip_compile(study, DEFAULT, "latency", compiled("bf16", "channels_last", 1), HERE) is None
    # that class reads its own trials and those recorded before host classes (the recipes here)
    there = compile_skip.predict_compile(DEFAULT, trials, ("bf16", "channels_last", 1, "buckets"), "elsewhere")
    assert there == compile_skip.Prediction(pytest.approx(49.0 * 59.0 / 33.5), 2, (("omp_threads", (4, 3)),))
    assert [t.number for t in compile_skip.measured_here(trials, HERE)] == [0, 1, 2, 3]


def test_a_prediction_says_where_it_comes_from() -> None:
    assert compile_skip.Prediction(86.3, 2, (("omp_threads", (4, 3)),)).why() == "trial 2 times trial 4 over trial 3"
    assert compile_skip.Prediction(9.0, 1, (("precision", (2, 3)), ("memory_format", (5, 4)))).why() == \
        "trial 1 times trial 2 over trial 3 times trial 5 over trial 4"
    assert compile_skip.Prediction(9.0, 1).why() == "trial 1"


def test_a_latency_search_skips_a_compile_predicted_to_lose_by_more_than_the_margin() -> None:
    study = searched()
    skip = compile_skip.skip_compile(study, DEFAULT, "latency", compiled("bf16", "channels_last", 1), HERE)
    assert skip is not None and skip.reason == (
        "not compiled: bf16 channels_last at 1 thread(s) predicted at 86.30 ms (trial 2 times trial 4 over "
        "trial 3), more than 1.5x trial 3's 33.50 ms")
    assert skip.evidence == "best trial 3; fastest of each key: trials [1, 2, 3, 4, 5]"
    assert thresholds.SKIP_COMPILE == thresholds.GIVE_UP[-1] == 1.5
    # after the recipes alone: fp32 contiguous has no prediction (no layout step measured), compiled
    recipes = optuna.create_study()
    recipes.add_trials(study.get_trials()[:4])
    assert compile_skip.skip_compile(recipes, DEFAULT, "latency", compiled("fp32", "contiguous", 2), HERE) is None
    # int8 contiguous at 2 threads, the winner of that search: predicted at 34.07 ms, compiled
    assert compile_skip.skip_compile(study, DEFAULT, "latency", compiled("int8", "contiguous", 2), HERE) is None
    # already compiled (another allocator): it runs, as does eager
    assert compile_skip.skip_compile(study, DEFAULT, "latency", compiled("int8", "channels_last", 1,
                                                                    allocator="jemalloc", instances=2), HERE) is None
    assert compile_skip.skip_compile(study, DEFAULT, "latency", Config.from_mapping({"omp_threads": 1}), HERE) is None
    # throughput is not predicted from latencies
    assert compile_skip.skip_compile(study, DEFAULT, "throughput", compiled("bf16", "channels_last", 1), HERE) is None


def test_every_precision_and_layout_compiles_at_the_threads_of_the_best_trial() -> None:
    study = searched()
    # fp32 contiguous at 2 threads is predicted at 102.71 ms, over 1.5x the best's 33.50, but the
    # best (trial 3) runs 2 threads: it compiles, as fp32 contiguous at 1 thread does not
    predicted = compile_skip.predict_compile(DEFAULT, study.get_trials(), ("fp32", "contiguous", 2, "buckets"), HERE)
    assert predicted is not None and predicted.value > thresholds.SKIP_COMPILE * 33.5
    assert compile_skip.skip_compile(study, DEFAULT, "latency", compiled("fp32", "contiguous", 2), HERE) is None
    assert compile_skip.skip_compile(study, DEFAULT, "latency", compiled("fp32", "contiguous", 1), HERE) is not None


def test_a_skipped_configuration_is_held_until_the_evidence_changes() -> None:
    study = searched()
    config = compiled("bf16", "channels_last", 1)
    skip = compile_skip.skip_compile(study, DEFAULT, "latency", config, HERE)
    assert skip is not None
    study.enqueue_trial(DEFAULT.params(config))
    trial = study.ask()
    DEFAULT.sample(trial, only=config)
    for key, value in (("config", config.describe()), ("batch_size", 1), ("settings_digest", "d"),
                       (records.HOST_CLASS, HERE)):
        trial.set_user_attr(key, value)
    records.record_skipped(trial, skip.reason, skip.evidence)
    study.tell(trial, state=TrialState.PRUNED)
    trials = study.get_trials()
    # not a measurement: never reused, not among the measured configurations
    assert records.measured_configs(trials, "d") == set()
    assert records.same_config(study, 99, config.identity(), 1, "d") is None
    assert records.not_compiled_configs(trials, "d") == 1
    # but held while the evidence is what it was skipped on ...
    assert compile_skip.held(DEFAULT, trials, HERE, "d") == {(config.identity(), 1)}
    assert compile_skip.held(DEFAULT, trials, "elsewhere", "d") == set()  # another class decides for itself
    # ... and proposable again once a measurement changes it (a new key: fp32 contiguous at 2)
    told(study, compiled("fp32", "contiguous", 2), 104.0)
    assert compile_skip.held(DEFAULT, study.get_trials(), HERE, "d") == set()


def test_the_search_records_a_skipped_trial_as_pruned_and_never_runs_it(
        tmp_path: Path, fake_libs: Libraries, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[str] = []

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        config = plan.config
        ran.append(config.describe())
        latency = {"fp32": 100.0, "bf16": 50.0}[str(config.get("precision") or "fp32")]
        latency *= 1.8 if config.get("omp_threads") == 1 else 1.0
        return fake_result([latency - 0.5, latency, latency + 0.5] if config.values else [150.0] * 3)

    script = {3: {"precision": "bf16", "omp_threads": 1}, 4: {"precision": "fp32", "omp_threads": 1},
              5: {"precision": "bf16", "omp_threads": 2}, 6: {"precision": "fp32", "omp_threads": 2,
                                                              "allocator": "jemalloc"}}
    monkeypatch.setattr(opening, "sampler", lambda seed, constant_liar=False: Scripted(script))
    here = Machine(lscpu("amd_1s_smt"), fake_libs)
    opened = opening.open_search(request(tmp_path, 6, space=COMPILED), here)
    loop.run_search(opened, here, lambda event: None, runner=runner)
    trials = opened.study.get_trials()
    assert [t.user_attrs.get("recipe") for t in trials[:3]] == [None, "compile+channels_last",
                                                                 "compile+bf16+channels_last"]
    skipped = trials[4]
    assert skipped.state == TrialState.PRUNED and skipped.user_attrs[records.SKIPPED] is True
    assert skipped.user_attrs["config"] == ("backend=inductor memory_format=channels_last precision=fp32 omp_threads=1 "
                                            "allocator=default")
    assert skipped.user_attrs["prune_reason"].startswith("not compiled: fp32 channels_last at 1 thread(s) predicted "
                                                         "at 180.00 ms")
    assert "plan" not in skipped.user_attrs and not skipped.intermediate_values
    assert skipped.user_attrs["config"] not in ran
    # the skipped trial measured nothing, so it took no trial of --trials 6: a seventh ran
    assert len(set(ran)) == 6  # the baseline, the 2 recipes, the 3 other sampled
    assert [records.SKIPPED in t.user_attrs for t in trials] == [False] * 4 + [True, False, False]
    assert records.finished(opened.study) == 6
    accounting = opened.study.user_attrs["accounting"]
    assert accounting["not_compiled"] == 1 and accounting["trials"] == 6
    assert accounting["distinct_configurations"] == 6
    display.accounting(accounting)
    assert "6 trials, 6 distinct configurations (and 1 more pruned before compiling)" in capsys.readouterr().out

    # a configuration enqueued through Optuna runs, whatever its key is predicted at
    by_hand = Config.from_mapping({"backend": "inductor", "memory_format": "channels_last", "precision": "fp32",
                                   "omp_threads": 1, "allocator": "jemalloc"})
    opened.study.enqueue_trial(opened.space.params(by_hand))
    again = opening.open_search(request(tmp_path, 7, space=COMPILED), here)
    loop.run_search(again, here, lambda event: None, runner=runner)
    enqueued = again.study.get_trials()[7]
    assert enqueued.user_attrs["proposed_by"] == "enqueued" and records.SKIPPED not in enqueued.user_attrs
    assert by_hand.describe() in ran

    # its key measured now, the skipped configuration is proposable again, and measured, not reused
    rest = opening.open_search(request(tmp_path, 20, space=COMPILED), here)
    stopped = loop.run_search(rest, here, lambda event: None, runner=runner)
    assert skipped.user_attrs["config"] in ran
    again_ran = [t for t in rest.study.get_trials() if t.user_attrs.get("config") == skipped.user_attrs["config"]
                 and records.SKIPPED not in t.user_attrs]
    assert len(again_ran) == 1 and not records.is_duplicate(again_ran[0]) and "plan" in again_ran[0].user_attrs
    assert stopped == ("every configuration of the space has run (11 distinct, baseline included); widen the space "
                       "(--space) to search further")
    assert records.not_compiled(rest.study.get_trials()) == 1


def test_a_search_ends_when_what_has_not_run_is_held_on_unchanged_evidence(
        tmp_path: Path, fake_libs: Libraries, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 at 1 thread (both allocators) is predicted at 180 ms from bf16's thread step, and
    nothing measured later changes that: each is skipped once, and the search stops."""

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        config = plan.config
        latency = {"fp32": 100.0, "bf16": 50.0}[str(config.get("precision") or "fp32")]
        latency *= 1.8 if config.get("omp_threads") == 1 else 1.0
        return fake_result([latency - 0.5, latency, latency + 0.5] if config.values else [150.0] * 3)

    monkeypatch.setattr(opening, "sampler", lambda seed, constant_liar=False: Scripted(
        {3: {"precision": "bf16", "omp_threads": 1}}))
    here = Machine(lscpu("amd_1s_smt"), fake_libs)
    opened = opening.open_search(request(tmp_path, 30, space=COMPILED), here)
    stopped = loop.run_search(opened, here, lambda event: None, runner=runner)
    assert stopped.endswith(" distinct, baseline included, and 2 more were not compiled, predicted to lose); widen the "
                            "space (--space) to search further")
    skipped = [t.user_attrs["config"] for t in opened.study.get_trials() if records.SKIPPED in t.user_attrs]
    assert sorted(skipped) == [f"backend=inductor memory_format=channels_last precision=fp32 omp_threads=1 "
                               f"allocator={allocator}" for allocator in ("default", "jemalloc")]


def test_coverage_offers_both_shapes_where_the_space_has_buckets() -> None:
    """With sequence-length buckets (`shapes` in the space) each precision x layout is covered at the
    best's threads with a model per bucket and with one dynamic model; without buckets, as before."""
    study = searched()
    offered = compile_skip.uncovered(DEFAULT, study.get_trials(), HERE)
    keys = [compile_skip.compile_key(DEFAULT, Config.from_mapping(dict(wanted))) for wanted, _ in offered]
    assert ("int8", "channels_last", 2, "dynamic") in keys and ("int8", "channels_last", 2, "buckets") not in keys
    assert keys[:2] == [("fp32", "contiguous", 2, "buckets"), ("fp32", "contiguous", 2, "dynamic")]
    unbucketed = space_fit.for_buckets(DEFAULT, bucketed=False)
    offered = compile_skip.uncovered(unbucketed, study.get_trials(), HERE)
    assert {key[3] for key in (compile_skip.compile_key(unbucketed, Config.from_mapping(dict(wanted)))
                               for wanted, _ in offered)} == {"buckets"}
