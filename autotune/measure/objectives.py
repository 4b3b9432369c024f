"""What a search optimises and what a verdict compares: objectives, metrics, and the fewest rounds
a verdict needs (from the thresholds in `autotune.base.thresholds`).

One owner for these words, so that the study, pruning, confirmation and display agree on them.
"""

from __future__ import annotations

from typing import Literal, Protocol

from autotune.base.errors import AutotuneError
from autotune.base.thresholds import ALPHA

Objective = Literal["latency", "throughput", "both"]
Metric = Literal["latency_p50_ms", "throughput_ips"]
OBJECTIVES: tuple[Objective, ...] = ("latency", "throughput", "both")
COMPARABLE: tuple[Objective, ...] = ("latency", "throughput")  # one number per run, so pairs compare



def min_rounds(candidates: int = 1, alpha: float = ALPHA) -> int:
    """The fewest paired rounds whose smallest one-sided signed-rank p (1/2**rounds, every round in
    the same direction) can pass Holm's first step at `alpha`, p < alpha / candidates."""
    rounds = 1
    while 0.5**rounds >= alpha / max(candidates, 1):
        rounds += 1
    return rounds


def min_rounds_two_sided() -> int:
    """The fewest paired rounds whose smallest two-sided signed-rank p (2/2**rounds) is below ALPHA."""
    return min_rounds(2)


MIN_ROUNDS = min_rounds(1)  # 5: with fewer, even a lone comparison can never reach p < ALPHA


class Measured(Protocol):
    """Anything with the two headline numbers: one run, or all replicates of a configuration."""

    @property
    def latency_p50_ms(self) -> float: ...

    @property
    def throughput_ips(self) -> float: ...


def parse_objective(text: str, allowed: tuple[Objective, ...] = OBJECTIVES,
                    error: type[AutotuneError] = AutotuneError) -> Objective:
    """The objective a user typed, or `error` saying which ones are allowed."""
    for objective in allowed:
        if objective == text:
            return objective
    choices = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
    raise error(f"--objective {text!r} is not allowed; use {choices}")


def metric_of(objective: str) -> Metric:
    """The single number a paired comparison uses (a two-objective study confirms on latency)."""
    return "throughput_ips" if objective == "throughput" else "latency_p50_ms"


def metric_value(result: Measured, metric: Metric) -> float:
    return result.throughput_ips if metric == "throughput_ips" else result.latency_p50_ms


def values_of(objective: Objective, result: Measured) -> tuple[float, ...]:
    """The study's objective values for a result, in the study's direction order."""
    if objective == "both":
        return (result.latency_p50_ms, result.throughput_ips)
    return (metric_value(result, metric_of(objective)),)


def lower_is_better(metric: Metric) -> bool:
    return metric == "latency_p50_ms"


def unit_of(metric: Metric) -> str:
    return "ms" if lower_is_better(metric) else "items/s"


def speedup_attr(objective: str) -> str:
    """The trial attribute holding its speedup over the baseline on the objective's metric."""
    return "speedup_throughput" if metric_of(objective) == "throughput_ips" else "speedup_latency"
