"""A trial against this CPU's measured peak (study/efficiency.py)."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from autotune.host.capabilities import precision_peak
from autotune.study import efficiency
from tests.support import probes


def _study(winner_items_s: float, work: float | None = 32.8e9) -> optuna.Study:
    study = optuna.create_study()
    study.set_user_attr("probe", probes.probe({"torch:int8:conv": {"gops": {"1": 400.0, "2": 600.0}}}).summary(2)
                        | {"op": "conv"})
    dist = {"x": CategoricalDistribution(["a"])}
    base_attrs = {"baseline": True, "config": "defaults", "throughput_ips": 4.0}
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=250.0, params={"x": "a"}, distributions=dist,
                                 user_attrs=base_attrs | ({"flops_per_item": work} if work else {})))
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=50.0, params={"x": "a"}, distributions=dist,
                                 user_attrs={"config": "backend=inductor precision=int8 omp_threads=1 instances=2",
                                             "throughput_ips": winner_items_s}))
    return study


def test_the_winner_is_set_against_its_precisions_peak_on_the_models_operation() -> None:
    study = _study(winner_items_s=12.2)
    found = efficiency.of_trial(study, study.trials[1])
    assert found is not None
    assert (found["runtime"], found["precision"], found["op"]) == ("torch", "int8", "conv")
    assert found["achieved_gops"] == 400.2 and found["peak_gops"] == 800.0 and found["fraction"] == 0.5
    assert efficiency.words(found) == ("trial 1 computes 400 GOP/s (32.80 GFLOP per item): 50% of this CPU's "
                                       "measured int8 peak (800 GOP/s on the probe's conv, torch, 2 x 1 thread(s))")
    assert efficiency.of_recommended(study) == found  # no confirmation: the best measured trial


def test_without_the_models_work_there_is_no_figure() -> None:
    study = _study(winner_items_s=12.2, work=None)
    assert efficiency.of_trial(study, study.trials[1]) is None


def _two_runtimes(trials: dict[str, float]) -> optuna.Study:
    """A CPU whose int8 conv PyTorch runs at 1260 GOP/s and OpenVINO at 621 (the report that once set
    an OpenVINO trial against OpenVINO's kernel alone: 114%), with a trial per configuration."""
    study = optuna.create_study()
    slow = {"gops": {"1": 100.0, "2": 200.0}}
    measured = {f"{runtime}:int8:{op}": slow for runtime in ("torch", "openvino", "onnxruntime")
                for op in ("conv", "matmul")}
    measured |= {"torch:int8:conv": {"gops": {"1": 630.0, "2": 1260.0}},
                 "openvino:int8:conv": {"gops": {"1": 300.0, "2": 621.0}}}
    study.set_user_attr("probe", probes.probe(measured).summary(2) | {"op": "conv"})
    dist = {"x": CategoricalDistribution(["a"])}
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=250.0, params={"x": "a"}, distributions=dist,
                                 user_attrs={"baseline": True, "config": "defaults", "throughput_ips": 4.0,
                                             "flops_per_item": 10e9}))
    for config, items in trials.items():
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=1000 / items, params={"x": "a"},
                                     distributions=dist, user_attrs={"config": config, "throughput_ips": items}))
    return study


def test_a_precision_has_one_peak_the_best_any_runtime_measured() -> None:
    study = _two_runtimes({"backend=openvino precision=int8": 71.1, "backend=inductor precision=int8": 50.0})
    on_openvino, on_inductor = (efficiency.of_trial(study, t) for t in study.trials[1:])
    assert on_openvino is not None and on_inductor is not None
    assert on_openvino["runtime"] == "openvino" and on_openvino["peak_runtime"] == "torch"
    assert on_openvino["peak_gops"] == on_inductor["peak_gops"] == 1260.0  # one figure, whichever runtime ran
    assert on_openvino["fraction"] == 0.564  # 711 of 1260, not 114% of OpenVINO's own 621
    said = efficiency.words(on_openvino)
    assert "56% of this CPU's measured int8 peak (1260 GOP/s on the probe's conv, torch" in said
    assert efficiency.of_recommended(study) == on_openvino  # what the report and the search's summary both say


def test_a_trial_above_every_probe_kernel_is_the_peak_so_no_share_exceeds_all() -> None:
    study = _two_runtimes({"backend=openvino precision=int8": 150.0, "backend=inductor precision=int8": 100.0})
    shares = [efficiency.of_trial(study, t) for t in study.trials[1:]]
    assert [s["fraction"] for s in shares if s] == [1.0, 0.667]
    best = shares[0]
    assert best is not None and best["peak_trial"] == 1 and best["peak_gops"] == 1500.0
    assert efficiency.words(best).endswith("(1500 GOP/s by trial 1, above the 1260 GOP/s of the best probe kernel "
                                           "on its conv)")


def test_the_one_peak_per_precision_reads_every_runtime() -> None:
    peaks = {"torch:int8:conv": {"gops": 1260.0}, "openvino:int8:conv": {"gops": 621.0},
             "openvino:int8_dynamic:matmul": {"gops": 300.0}, "torch:fp32:conv": {"gops": 5000.0}}
    assert precision_peak(peaks, "int8", "conv") == ("torch:int8:conv", {"gops": 1260.0})
    assert precision_peak(peaks, "int8_dynamic", "conv") == ("openvino:int8_dynamic:matmul",
                                                                        {"gops": 300.0})
    assert precision_peak(peaks, "bf16", "conv") is None
