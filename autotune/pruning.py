"""Pruning: a trial whose replicates are all clearly worse than every replicate of the best trial
stops before its last replicate.

This is a stated rule, not a statistical test, and it prints no p-value: the values that really
repeat are the replicates (fresh processes), and two or three of them cannot give a meaningful
test at a strict level. The rule asks for separation instead: with at least `MIN_REPLICATES` runs,
this trial's best replicate is worse by more than `MARGIN` than the best trial's worst replicate.
A trial merely a hair behind stays for confirmation to judge.

Each replicate reports, as the trial's intermediate value, the median of the replicates so far:
the same number a completed trial stores as its value, so a pruned trial's value (Optuna keeps the
last intermediate value) compares like with like in the study and its plots.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from autotune import records, stats
from autotune.objectives import Metric, Objective, lower_is_better, metric_of, metric_value
from autotune.results import RunResult

MARGIN = 0.05  # worse by more than this (relative) counts; a hair behind stays for confirmation
MIN_REPLICATES = 2  # one disturbed process alone never prunes


def separated(mine: Sequence[float], best: Sequence[float], metric: Metric, margin: float = MARGIN) -> bool:
    """True when every value of `mine` is worse than every value of `best` by more than `margin`."""
    if lower_is_better(metric):
        return min(mine) > max(best) * (1 + margin)
    return max(mine) * (1 + margin) < min(best)


class PruneCheck:
    """After each replicate: report the running median and decide whether to stop."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial, objective: Objective) -> None:
        self.study, self.trial, self.metric = study, trial, metric_of(objective)
        self.single = len(study.directions) == 1  # Optuna prunes single-objective studies only
        self.values: list[float] = []
        self.reason = ""

    def __call__(self, index: int, run: RunResult, more_planned: bool) -> bool:
        if not self.single:
            return False
        self.values.append(metric_value(run, self.metric))
        self.trial.report(stats.median(self.values), index)
        if not more_planned or len(self.values) < MIN_REPLICATES:  # after the last one it would save nothing
            return False
        best = self._best()
        if best is None or not separated(self.values, best[1], self.metric):
            return False
        self.reason = self._why(best[0], best[1])
        return True

    def _best(self) -> tuple[int, list[float]] | None:
        """The best other trial's number and its replicates' values (as it recorded them)."""
        for trial in records.best_trials(self.study):
            values = records.replicate_values(trial, self.metric)
            if trial.number != self.trial.number and values:
                return trial.number, values
        return None

    def _why(self, best: int, theirs: Sequence[float]) -> str:
        unit = "ms" if lower_is_better(self.metric) else "items/s"
        return (f"all {len(self.values)} replicates more than {MARGIN:.0%} worse than every replicate of trial "
                f"{best} ({_span(self.values)} vs {_span(theirs)} {unit})")


def _span(values: Sequence[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"
