"""A generating model's efficiency: the weights a decode step reads over its time per token, against
the memory bandwidth the probe measured (`study.efficiency`), as the search and bench say it."""

from __future__ import annotations

import optuna
import pytest

from autotune.cli.display import generation_text
from autotune.study import efficiency


def test_the_bandwidth_fraction_is_weights_over_time_per_token_against_the_bandwidth() -> None:
    found = efficiency.bandwidth_fraction(3, weight_bytes=500e6, tpot_ms=25.0, bandwidth_gbs=40.0)
    assert found["read_gbs"] == 20.0 and found["fraction"] == 0.5 and found["ceiling_tokens_per_s"] == 80.0


def test_a_generating_trial_is_judged_by_bandwidth_not_by_flops() -> None:
    study = optuna.create_study()
    study.set_user_attr("probe", {"bandwidth_gbs": 40.0, "peaks": {}})
    trial = study.ask()
    trial.set_user_attr("generation", {"ttft_p50_ms": 300.0, "tpot_p50_ms": 25.0, "weight_bytes": 500e6})
    study.tell(trial, 1.0)
    found = efficiency.of_trial(study, study.trials[0])
    assert found is not None and found["fraction"] == 0.5 and found["ttft_ms"] == 300.0
    said = efficiency.words(found)
    assert said.startswith("trial 0 decodes at 25.0 ms per token after a first token at 300 ms, reading its 0.50 GB")
    assert "50% of this CPU's measured memory bandwidth (40.0 GB/s; at most 80.0 tokens/s" in said


def test_without_a_measured_bandwidth_there_is_no_fraction() -> None:
    study = optuna.create_study()
    trial = study.ask()
    trial.set_user_attr("generation", {"tpot_p50_ms": 25.0, "weight_bytes": 500e6})
    study.tell(trial, 1.0)
    assert efficiency.of_trial(study, study.trials[0]) is None


@pytest.mark.parametrize(("bandwidth", "tail"), [
    (40.0, "50% of the 40.0 GB/s this CPU measured (at most 80.0 tokens/s)"), (None, "(40.0 tokens/s decode)")])
def test_bench_says_the_same(bandwidth: float | None, tail: str) -> None:
    said = generation_text({"ttft_p50_ms": 300.0, "tpot_p50_ms": 25.0, "weight_bytes": 500e6}, bandwidth)
    assert said.startswith("generation (p50 over requests): time to first token 300.0 ms, per output token 25.00 ms")
    assert said.endswith(tail)
