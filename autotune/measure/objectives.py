"""What a search optimises and what a verdict compares: objectives, metrics, and the fewest rounds
a verdict needs (from the thresholds in `autotune.base.thresholds`).

One owner for these words, so that the study, pruning, confirmation and display agree on them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from autotune.base.errors import AutotuneError
from autotune.base.thresholds import ALPHA

Objective = Literal["latency", "throughput", "both"]
Metric = Literal["latency_p50_ms", "throughput_ips"]
OBJECTIVES: tuple[Objective, ...] = ("latency", "throughput", "both")
COMPARABLE: tuple[Objective, ...] = ("latency", "throughput")  # one number per run, so pairs compare
# The figures a search may bound: each one's flag, how a breach reads, its tag in a study's name, its unit
# ("" for a quality drop: accuracy points or percent of perplexity, as the task measures it).
LIMITED = {"latency_p90_ms": ("--max-latency-ms", "a p90 latency", "p90", "ms"),
           "tpot_p90_ms": ("--max-tpot-ms", "a p90 time per output token", "tpot", "ms"),
           "quality_drop": ("--max-quality-drop", "a quality drop", "qdrop", "")}



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


@dataclass(frozen=True)
class Limits:
    """The bounds a result keeps to count (a trial within them is feasible): `--max-latency-ms` on
    the p90 latency of a request, `--max-tpot-ms` on the p90 time per output token of one
    (`--task generate`). Both are figures of one run: an instance's p90, the median over instances."""

    latency_p90_ms: float | None = None
    tpot_p90_ms: float | None = None
    quality_drop: float | None = None  # `--max-quality-drop`: on the user's data (`autotune.measure.quality`)

    def bounds(self) -> dict[str, float]:
        """Each limit set, by the figure it bounds."""
        return {figure: float(limit) for figure in LIMITED if (limit := getattr(self, figure)) is not None}

    def over(self, figures: Mapping[str, Any]) -> dict[str, float]:
        """Per limit set, by how much (in its unit) `figures` exceed it (<= 0: within); a figure that was
        not measured is over by infinity."""
        return {figure: (math.inf if figures.get(figure) is None else float(figures[figure])) - limit
                for figure, limit in self.bounds().items()}

    def breach(self, figures: Mapping[str, Any]) -> str:
        """What breaks a limit, said for a verdict ("" when within them all)."""
        for figure, excess in self.over(figures).items():
            if excess > 0:
                flag, what, _, unit = LIMITED[figure]
                value = figures.get(figure)
                shown = "none measured" if value is None else f"{float(value):.2f}{' ' + unit if unit else ''}"
                return f"had {what} of {shown} in these rounds, over {flag} {self.bounds()[figure]:g}"
        return ""

    def suffix(self) -> str:
        """The limits' part of a study's name."""
        return "".join(f"-{LIMITED[figure][2]}max{limit:g}{LIMITED[figure][3]}"
                       for figure, limit in self.bounds().items())

    @staticmethod
    def constraint(figure: str) -> str:
        """The Optuna constraint (and user attribute) a limit on `figure` is recorded as."""
        unit = LIMITED[figure][3]
        return f"{figure.removesuffix('_' + unit) if unit else figure}_over_limit{'_' + unit if unit else ''}"

    @classmethod
    def of_study(cls, attrs: Mapping[str, Any]) -> Limits:
        """The limits a study was opened with (its user attributes)."""
        def read(key: str) -> float | None:
            return float(attrs[key]) if attrs.get(key) else None
        drop = attrs.get("max_quality_drop")
        return cls(read("max_latency_ms"), read("max_tpot_ms"), None if drop is None else float(drop))


NO_LIMITS = Limits()
