"""A trial against this CPU's measured peak (study/efficiency.py)."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

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
