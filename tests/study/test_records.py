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
