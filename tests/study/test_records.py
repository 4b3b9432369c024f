"""What a trial records of its measurement."""

from __future__ import annotations

import json
import time

import optuna

from autotune.measure import replicates
from autotune.study import records
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
