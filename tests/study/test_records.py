"""What a trial records of its measurement."""

from __future__ import annotations

import dataclasses
import json
import time

import optuna
from optuna.trial import TrialState

from autotune.measure import replicates
from autotune.measure.objectives import Limits
from autotune.study import accounting, quality_records, records
from tests.support.studies import run_with


def test_a_trial_stores_a_bounded_summary_of_200k_samples() -> None:
    samples = [10.0 + (i % 997) / 100 for i in range(200_000)]
    measurement = replicates.Measurement((run_with(samples, 0.1),))
    study = optuna.create_study()
    trial = study.ask()
    start = time.monotonic()
    records.record_metrics(trial, measurement, None)
    assert time.monotonic() - start < 5
    attrs = study.get_trials()[0].user_attrs
    assert len(json.dumps(attrs)) < 4000
    assert attrs["samples"] == 200_000 and "samples_ms" not in attrs
    percentiles = attrs["latency_percentiles_ms"]
    assert len(percentiles) == 101 and percentiles[0] == 10.0 and percentiles[100] == 19.96
    assert percentiles[50] == attrs["latency_p50_ms"]


def test_a_configuration_that_launches_the_baselines_command_is_the_baseline() -> None:
    """`allocator=default` alone launches exactly what the baseline does: it reuses trial 0's result
    instead of counting as a configuration of its own (it once read 1.55x 'faster' than itself)."""
    import optuna
    from optuna.distributions import FloatDistribution

    from autotune.config.knobs import Config
    from autotune.study import records

    study = optuna.create_study()
    attrs = {"config": "defaults", "batch_size": 1, "settings_digest": "d", "baseline": True}
    study.add_trial(optuna.trial.create_trial(value=10.0, user_attrs=attrs, params={"x": 0.0},
                                              distributions={"x": FloatDistribution(0, 1)}))
    assert Config.from_assignments(["allocator=default"]).identity() == Config().identity() == "defaults"
    assert records.measured_configs(study.get_trials(), "d") == {("defaults", 1)}  # never proposed again
    study.add_trial(optuna.trial.create_trial(value=10.0, user_attrs={**attrs, "config": "allocator=default",
                                                                       "baseline": False}, params={"x": 0.0},
                                              distributions={"x": FloatDistribution(0, 1)}))
    assert records.distinct_configs(study) == 1


def trial_of(config: str, state: optuna.trial.TrialState, **attrs: object) -> optuna.trial.FrozenTrial:
    """A recorded trial of `config` (batch 1, settings "d") that ended in `state`."""
    from optuna.trial import TrialState, create_trial

    return create_trial(state=state, value=1.0 if state == TrialState.COMPLETE else None,
                        user_attrs={"config": config, "batch_size": 1, "settings_digest": "d", **attrs})


def study_of(*trials: optuna.trial.FrozenTrial) -> optuna.Study:
    study = optuna.create_study()
    for trial in trials:
        study.add_trial(trial)
    return study


def test_a_crashed_configuration_and_its_rerun_count_as_one_trial_of_trials() -> None:
    from optuna.trial import TrialState

    killed = {"fail_cause": records.KILLED}
    study = study_of(trial_of("defaults", TrialState.COMPLETE, baseline=True),
                     trial_of("mkldnn=on", TrialState.FAIL, **killed),
                     trial_of("mkldnn=on", TrialState.COMPLETE),  # its rerun
                     trial_of("allocator=jemalloc", TrialState.FAIL, **killed))  # not run again (yet)
    assert [t.number for t in records.counted(study.get_trials())] == [0, 2, 3]
    assert records.finished(study) == records.distinct_configs(study) == 3


def test_only_a_rerun_that_measures_the_same_settings_retries_a_failed_trial() -> None:
    from optuna.trial import TrialState

    killed = {"fail_cause": records.KILLED}
    cases = {
        "cut short": trial_of("mkldnn=on", TrialState.FAIL, fail_cause=records.CUT_SHORT),
        "a duplicate": trial_of("mkldnn=on", TrialState.COMPLETE, duplicate_of=0),
        "another batch size": trial_of("mkldnn=on", TrialState.COMPLETE, batch_size=8),
        "other settings": trial_of("mkldnn=on", TrialState.COMPLETE, settings_digest="e"),
    }
    for later in cases.values():
        study = study_of(trial_of("mkldnn=on", TrialState.FAIL, **killed), later)
        assert records.measured_again(study.get_trials()) == set()
    running = study_of(trial_of("mkldnn=on", TrialState.FAIL, **killed), trial_of("mkldnn=on", TrialState.RUNNING))
    assert records.measured_again(running.get_trials()) == {0}  # a worker measures it again now


def test_a_rerun_records_the_trial_it_retries() -> None:
    from optuna.trial import TrialState

    study = study_of(trial_of("mkldnn=on", TrialState.FAIL, fail_cause=records.KILLED),
                     trial_of("allocator=jemalloc", TrialState.FAIL, fail_cause=records.ERROR))
    rerun, other = study.ask(), study.ask()
    for trial, config in ((rerun, "mkldnn=on"), (other, "omp_runtime=intel")):
        for key, value in {"config": config, "batch_size": 1, "settings_digest": "d"}.items():
            trial.set_user_attr(key, value)
    assert records.mark_rerun(rerun, study.get_trials()) == 0
    assert records.mark_rerun(other, study.get_trials()) is None
    assert study.get_trials()[rerun.number].user_attrs["retry_of"] == 0
    assert "retry_of" not in study.get_trials()[other.number].user_attrs


def generating(tpot_p90s: list[float]) -> replicates.Measurement:
    """A --task generate measurement: one run of one instance per p90 time per output token."""
    runs = []
    for tpot in tpot_p90s:
        run = run_with([100.0, 110.0, 120.0], 0.0)
        metrics = run.instances[0].metrics | {"generation": {"ttft_p50_ms": 40.0, "tpot_p50_ms": tpot - 2,
                                                             "tpot_p90_ms": tpot},
                                              "setup": {"weight_bytes": 10**6}}
        runs.append(dataclasses.replace(run, instances=(dataclasses.replace(run.instances[0], metrics=metrics),)))
    return replicates.Measurement(tuple(runs))


def recorded(measurement: replicates.Measurement, limits: Limits) -> dict[str, object]:
    study = optuna.create_study()
    trial = study.ask()
    records.record_metrics(trial, measurement, None)
    quality_records.record_limits(trial, limits, trial.user_attrs)
    study.tell(trial, 1.0)
    return {**study.get_trials()[0].user_attrs, "constraints": study.get_trials()[0].system_attrs}


def test_a_generating_trial_records_its_p90_time_per_output_token_and_the_limit_it_breaks() -> None:
    attrs = recorded(generating([18.0, 24.0, 30.0]), Limits(tpot_p90_ms=20.0))
    assert attrs["generation"] == {"ttft_p50_ms": 40.0, "tpot_p50_ms": 22.0, "tpot_p90_ms": 24.0,
                                   "weight_bytes": 10**6}  # medians over the runs' instances
    assert attrs["constraint_tpot_p90_over_limit_ms"] == 4.0 and attrs["feasible"] is False
    assert attrs["constraints"] == {"constraints:tpot_p90_over_limit_ms": 4.0}


def test_a_trial_must_keep_every_limit_to_be_feasible() -> None:
    within = recorded(generating([18.0]), Limits(latency_p90_ms=500.0, tpot_p90_ms=20.0))
    assert within["feasible"] is True and within["constraint_latency_p90_over_limit_ms"] < 0
    assert within["constraint_tpot_p90_over_limit_ms"] == -2.0
    slow = recorded(generating([18.0]), Limits(latency_p90_ms=100.0, tpot_p90_ms=20.0))
    assert slow["feasible"] is False and slow["constraint_latency_p90_over_limit_ms"] > 0


def test_a_trial_that_measured_no_time_per_token_breaks_a_token_limit_and_none_set_records_nothing() -> None:
    forward = recorded(replicates.Measurement((run_with([10.0, 11.0], 0.0),)), Limits(tpot_p90_ms=20.0))
    assert forward["feasible"] is False and forward["constraint_tpot_p90_over_limit_ms"] == float("inf")
    free = recorded(generating([18.0]), Limits())
    assert "feasible" not in free and free["constraints"] == {}


def test_a_searchs_wall_time_is_broken_down_where_it_went() -> None:
    """Build, warm-up and timed windows of the trials that decided; an undecided attempt's whole
    measuring wall (it is measured again); a duplicate's nothing; the rest of the wall time: the rest."""
    def trial(state: TrialState, **attrs: object) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(state=state, values=[1.0] if state == TrialState.COMPLETE else None,
                                         user_attrs={"measure_wall_s": 20.0, **attrs})

    trials = [trial(TrialState.COMPLETE, build_s=8.0, warmup_s=1.0, timed_s=6.0),
              trial(TrialState.PRUNED, build_s=30.0, warmup_s=1.0, timed_s=2.0),
              trial(TrialState.FAIL, build_s=8.0, warmup_s=1.0, timed_s=6.0, fail_cause=records.UNDECIDED),
              trial(TrialState.COMPLETE, build_s=8.0, warmup_s=1.0, timed_s=6.0, duplicate_of=0)]
    assert accounting.breakdown(trials, 100.0) == {"build_s": 38.0, "warmup_s": 2.0, "timed_s": 8.0,
                                                   "undecided_s": 20.0, "other_s": 32.0}
    assert accounting.breakdown(trials, 10.0)["other_s"] == 0.0  # never below nothing


def test_a_trial_an_older_autotune_recorded_is_broken_down_from_its_instances_set_up() -> None:
    """Trials recorded before trials kept build_s and warm-up (issue 68's "before" studies) read
    them from their last run's instances: the slowest one's set-up, its parts summed where the
    child recorded no ready_s, its ready_s where it did; a trial with neither counts nothing."""
    def old(*setups: dict[str, float]) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
            "measure_wall_s": 30.0, "timed_s": 6.0,
            "instances": [{"index": i, "setup": s} for i, s in enumerate(setups)]})

    parts = {"build_s": 2.9, "compile_s": 17.0, "artifact_load_s": 1.3, "first_forward_s": 0.5, "warmup_s": 1.4}
    trials = [old(parts, {"build_s": 1.0, "warmup_s": 5.0}),  # the slowest instance: 21.7 s to build
              old({"ready_s": 9.0, "compile_s": 7.5, "warmup_s": 1.0}),  # ready_s holds compile_s
              optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={"measure_wall_s": 5.0})]
    assert accounting.breakdown(trials, 100.0) == {"build_s": 30.7, "warmup_s": 2.4, "timed_s": 12.0,
                                                   "undecided_s": 0.0, "other_s": 54.9}



def test_a_trials_first_call_and_its_measurements_set_up_seconds_read_the_same_costs() -> None:
    """One rule says which of a child's `setup` figures are set-up costs (`InstanceResult.setup_costs`):
    a trial's `first_call_s` keeps each cost's worst instance, the measurement's build and warm-up add
    up one instance's per process. Both read the same costs: never the wait for another plan's turn
    (`held_s`), nor a figure that is no duration."""
    from dataclasses import replace

    from tests.support.studies import fake_result

    one = {"build_s": 2.0, "quantize_s": 4.0, "compile_s": 10.0, "load_s": 0.5, "first_forward_s": 1.5,
           "warmup_s": 1.0, "held_s": 30.0, "warmup_iterations": 12, "weight_bytes": 1000, "first_request_s": "?"}
    other = {"build_s": 3.0, "compile_s": 8.0, "first_forward_s": 2.5, "warmup_s": 0.5, "held_s": 0.1}

    def measured(*setups: dict[str, object]) -> replicates.Measurement:
        run = fake_result([20.0] * 5)
        instances = tuple(replace(run.instances[0], index=i, metrics={**run.instances[0].metrics, "setup": setup})
                          for i, setup in enumerate(setups))
        return replicates.Measurement((replace(run, instances=instances),))

    alone = measured(one)
    costs = records.first_call(alone)
    assert costs == {"build_s": 2.0, "quantize_s": 4.0, "compile_s": 10.0, "load_s": 0.5, "first_forward_s": 1.5,
                     "warmup_s": 1.0}
    assert alone.setup_seconds() == {"build_s": sum(costs.values()) - costs["warmup_s"], "warmup_s": costs["warmup_s"]}
    both = measured(one, other)
    assert records.first_call(both) == costs | {"build_s": 3.0, "first_forward_s": 2.5}  # each cost's worst
    assert both.setup_seconds() == {"build_s": 18.0, "warmup_s": 1.0}  # the slower instance's process
