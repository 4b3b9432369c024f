"""A model that gave wrong answers is not proposed again under other process knobs: the guard's
verdict belongs to the converted model, so every process running it would fail the same way.
Fake runner, no processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config.knobs import Config
from autotune.host.machine import Machine
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import Measurement, ReplicatePolicy
from autotune.measure.results import InstanceResult, RunResult
from autotune.search import loop, opening
from autotune.study import quality_records, records
from tests.support.studies import SPACE, fake_result, request

WRONG = InstanceResult(0, False, "wrong answers: max relative error 0.2 > tolerance 0.001", 3, "", wrong_answers=True)
ERROR = InstanceResult(0, False, "exited with code 1: RuntimeError: no kernel", 1, "")


def failing_mkldnn(failure: InstanceResult) -> tuple[list[str], Any]:
    """A runner under which every mkldnn=on configuration fails with `failure`; the rest run."""
    calls: list[str] = []

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        calls.append(plan.config.describe())
        if plan.config.get("mkldnn"):
            return RunResult(False, f"instance 0: {failure.reason}", (failure,), 1.0)
        return fake_result([90.0, 91.0, 92.0])

    return calls, runner


@pytest.mark.parametrize(("failure", "mkldnn_runs"), [(WRONG, 1), (ERROR, 4)])
def test_a_model_that_gave_wrong_answers_is_not_proposed_with_other_process_knobs(
        tmp_path: Path, here: Machine, failure: InstanceResult, mkldnn_runs: int) -> None:
    # small.yaml: mkldnn (a model knob) x omp_runtime x allocator (process knobs), 8 configurations
    calls, runner = failing_mkldnn(failure)
    opened = opening.open_search(request(tmp_path, 20, space=SPACE, replicates=ReplicatePolicy(1, 0)), here)
    stopped = loop.run_search(opened, here, lambda event: None, runner=runner)
    ran = [c for c in calls if "mkldnn=on" in c]
    assert len(ran) == mkldnn_runs  # an error of another kind says nothing of the other processes
    trials = opened.study.get_trials()
    assert len(trials) == 4 + mkldnn_runs  # the baseline, mkldnn=off's 3 others, and mkldnn=on's
    first = next(t for t in trials if "mkldnn=on" in t.user_attrs["config"])
    assert bool(first.user_attrs.get(records.WRONG_ANSWERS)) is (failure is WRONG)
    if failure is WRONG:
        assert stopped == (f"every configuration of the space has run (5 distinct, baseline included, and no other "
                           f"configuration of the model that gave wrong answers in trial {first.number}); widen the "
                           f"space (--space) to search further")
    else:
        assert "wrong answers" not in stopped


def failed(number: int, config: str, *, digest: str = "d", klass: str = "k", batch: int = 1,
           wrong: bool = True) -> optuna.trial.FrozenTrial:
    attrs = {"config": config, "settings_digest": digest, records.HOST_CLASS: klass, "batch_size": batch,
             **({records.WRONG_ANSWERS: True} if wrong else {})}
    trial = optuna.trial.create_trial(state=TrialState.FAIL, user_attrs=attrs)
    trial.number = number
    return trial


def test_a_models_answers_ignore_process_knobs_and_a_peers_placement_but_not_its_arithmetic() -> None:
    def model(described: str, batch: int = 1) -> tuple[str, int]:
        return quality_records.model_of(Config.from_description(described), batch)

    int8 = "backend=inductor memory_format=channels_last precision=int8"
    assert model(f"{int8} omp_threads=1 allocator=tcmalloc instances=2") == model(f"{int8} omp_threads=2")
    assert model(int8) != model("backend=inductor precision=int8") != model(int8, 8)
    assert model("backend=inductor precision=int8 shapes=dynamic") != model("backend=inductor precision=int8")
    assert model("backend=openvino precision=int8 ov_hint=throughput ov_streams=2 ov_pinning=off") == \
        model("backend=openvino precision=int8")
    assert model("backend=openvino precision=bf16") != model("backend=openvino")  # bf16 arithmetic
    assert model("backend=onnxruntime ort_optimization=basic") != model("backend=onnxruntime")  # rewrites the graph
    assert model("backend=onnxruntime ort_execution=parallel ort_inter_threads=2") == model("backend=onnxruntime")


def test_only_this_host_classs_wrong_answers_under_these_settings_count() -> None:
    int8 = "backend=inductor precision=int8"
    trials = [failed(3, f"{int8} omp_threads=1"), failed(5, f"{int8} omp_threads=2"),
              failed(6, "backend=inductor precision=bf16", digest="other"),
              failed(7, "backend=inductor precision=bf16", klass="other"),
              failed(8, "backend=torchscript", wrong=False),
              failed(9, "nosuchknob=1")]  # recorded by another autotune: left out, not an error
    found = quality_records.wrong_models(trials, "d", "k")
    assert found == {quality_records.model_of(Config.from_description(int8), 1): 3}


def test_a_failed_run_gave_wrong_answers_when_an_instance_did_whatever_stopped_the_others() -> None:
    def measured(*instances: InstanceResult) -> Measurement:
        return Measurement((RunResult(False, "instance 0: ...", instances, 1.0),))

    stopped = InstanceResult(1, False, "stopped because instance 0 failed", -9, "")
    assert records.answered_wrong(measured(WRONG)) and records.answered_wrong(measured(stopped, WRONG))
    assert not records.answered_wrong(measured(ERROR)) and not records.answered_wrong(measured(stopped, ERROR))
