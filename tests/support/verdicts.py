"""Studies whose confirmation runs without processes: trials made by hand (a baseline, sampled
configurations, expert and peer recipes) and a runner that gives each configuration a latency with
a small jitter that differs round by round, so that the paired tests decide as the latencies say."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.child.settings import MeasureSettings
from autotune.config.knobs import Config
from autotune.measure.plan import BenchSpec, InstancePlan, LaunchPlan
from autotune.measure.replicates import SeriesRunner, one_by_one
from autotune.measure.results import RunResult
from autotune.search import confirm
from tests.support.studies import fake_result

JITTER = (-1.0, 0.4, -0.3, 1.1, 0.2, -0.6, 0.8, -0.1, 1.3, -0.8, 0.5, 0.0)
FAILS = -1.0  # a latency that stands for a configuration whose every run fails


def plan(config: str) -> LaunchPlan:
    knobs = Config() if config == "defaults" else Config.from_assignments(config.split())
    bench = BenchSpec("fake", (1,), measure=MeasureSettings(duration_s=0.1))
    return LaunchPlan(knobs, bench, "none", (InstancePlan(0, (0,), None, {}, ("true",)),))


def trial(config: str, search_ms: float, configs: tuple[str, ...], **attrs: object) -> FrozenTrial:
    """A completed trial of `config` that measured `search_ms` in the search (`configs`: every
    configuration the study holds, its parameter's choices)."""
    return optuna.trial.create_trial(
        state=TrialState.COMPLETE, values=[search_ms], params={"x": config},
        distributions={"x": CategoricalDistribution(configs)},
        user_attrs={"config": config, "plan": plan(config).to_json(), "batch_size": 1,
                    "latency_p50_ms": search_ms, "latency_p90_ms": search_ms * 1.1,
                    "throughput_ips": 1000.0 / search_ms, "peak_rss_mb": 500.0,
                    "speedup_latency": 100.0 / search_ms, **attrs})


def runner(latency_ms: Mapping[str, float], tpot_p90_ms: Mapping[str, float] | None = None) -> SeriesRunner:
    """Each configuration at its latency, a different small jitter every round (FAILS: it fails);
    with `tpot_p90_ms`, each generates text at that p90 time per output token."""
    jitter: dict[str, Iterator[float]] = {}

    def run(launch: LaunchPlan, timeout_s: float) -> RunResult:
        described = launch.config.describe()
        if latency_ms[described] == FAILS:
            return RunResult(False, "instance 0: crashed with SIGSEGV", (), 1.0)
        shift = next(jitter.setdefault(described, itertools.cycle(JITTER)))
        result = fake_result([latency_ms[described] * (1 + shift / 100) + j for j in (-0.2, 0.0, 0.2)])
        if tpot_p90_ms is None:
            return result
        tpot = tpot_p90_ms[described]
        metrics = result.instances[0].metrics | {"generation": {"tpot_p50_ms": tpot * 0.95, "tpot_p90_ms": tpot}}
        return dataclasses.replace(result, instances=(dataclasses.replace(result.instances[0], metrics=metrics),))

    return one_by_one(run)


def confirmed(made: optuna.Study, latency_ms: Mapping[str, float], top: int = 1,
              on_run: Callable[[confirm.RunEvent], None] = lambda e: None,
              tpot_p90_ms: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The study confirmed in 12 rounds with a 3% minimum effect, the order seeded."""
    return confirm.confirm(made, top=top, rounds=12, min_effect=0.03, timeout_s=60, on_run=on_run,
                           runner=runner(latency_ms, tpot_p90_ms), seed=3)
