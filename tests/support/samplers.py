"""Optuna samplers whose proposals a test decides: the values given, nothing modelled."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import IntDistribution


class Told(optuna.samplers.BaseSampler):
    """Proposes what `value` says for each parameter; no relative sampling."""

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return {}

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
        return self.value(trial, name, distribution)

    def value(self, trial: Any, name: str, distribution: Any) -> Any:
        raise NotImplementedError


class Stubborn(Told):
    """Always proposes the same values: a sampler that has settled."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def value(self, trial: Any, name: str, distribution: Any) -> Any:
        return self.values[name]


class Scripted(Told):
    """Proposes the values scripted for each trial number (the first choice otherwise)."""

    def __init__(self, script: dict[int, dict[str, Any]]) -> None:
        self.script = script

    def value(self, trial: Any, name: str, distribution: Any) -> Any:
        first = distribution.low if isinstance(distribution, IntDistribution) else distribution.to_external_repr(0)
        return self.script.get(trial.number, {}).get(name, first)
