"""Pruning noisy trials: each replicate's deciles are intermediate values, and a trial that is
clearly worse than the best (by more than a margin, paired decile by decile) stops early."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune import stats
from autotune.objectives import Objective
from autotune.results import RunResult

P_THRESHOLD = 0.01  # how sure the test must be that a trial is worse before it stops
MARGIN = 0.05  # worse by more than this (relative) counts; a hair behind stays for confirmation
DECILES = 9  # steps reported per replicate
MIN_STEPS = 2 * DECILES  # two replicates at least: one disturbed process alone never prunes


class MarginWilcoxonPruner(optuna.pruners.BasePruner):
    """Stops a trial that is clearly worse than the best: a one-sided Wilcoxon signed-rank test on
    paired deciles says it is more than `margin` worse with p < `p_threshold`.

    Unlike Optuna's WilcoxonPruner (which tests any difference), the margin keeps a configuration
    that is merely a hair behind on a noisy machine alive for confirmation to judge.
    """

    def __init__(self, p_threshold: float = P_THRESHOLD, margin: float = MARGIN, min_steps: int = MIN_STEPS) -> None:
        self.p_threshold, self.margin, self.min_steps = p_threshold, margin, min_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return self.p_worse(study, trial)[0] < self.p_threshold

    def p_worse(self, study: optuna.Study, trial: FrozenTrial) -> tuple[float, int, int | None]:
        """(p, paired steps, best trial number); p = 1 when there is nothing to compare yet."""
        try:
            best = study.best_trial
        except ValueError:
            return 1.0, 0, None
        steps = sorted(set(trial.intermediate_values) & set(best.intermediate_values))
        if len(steps) < self.min_steps or best.number == trial.number:
            return 1.0, len(steps), best.number
        minimize = study.direction == optuna.study.StudyDirection.MINIMIZE
        p = stats.paired_worse_p([trial.intermediate_values[s] for s in steps],
                                 [best.intermediate_values[s] for s in steps], minimize, self.margin)
        return p, len(steps), best.number


class PruneCheck:
    """After each replicate: report its deciles as intermediate values and ask the pruner.

    Deciles (9 steps per replicate) pair trials quantile by quantile, so the Wilcoxon pruner has
    enough pairs to stop a clearly worse configuration after its first replicate.
    """

    def __init__(self, study: optuna.Study, trial: optuna.Trial, objective: Objective) -> None:
        self.study, self.trial, self.objective, self.reason = study, trial, objective, ""

    def __call__(self, index: int, run: RunResult, more_planned: bool) -> bool:
        if len(self.study.directions) > 1:
            return False  # Optuna prunes single-objective studies only
        for offset, value in enumerate(_step_values(self.objective, run)):
            self.trial.report(value, index * DECILES + offset)
        if not more_planned or not self.trial.should_prune():  # after the last one it would save nothing
            return False
        self.reason = self._why(index)
        return True

    def _why(self, index: int) -> str:
        study = self.study
        pruner = MarginWilcoxonPruner()
        p, steps, best = pruner.p_worse(study, study._storage.get_trial(self.trial._trial_id))
        return (f"more than {pruner.margin:.0%} worse than trial {best} after {index + 1} replicate(s): "
                f"Wilcoxon p={p:.3g} on {steps} paired deciles")


def _step_values(objective: Objective, run: RunResult) -> list[float]:
    """Deciles of the replicate's forward latencies, or of its items/s per iteration."""
    if objective == "throughput":
        per_instance = [[1000.0 * _items_per_iteration(i.metrics) / ms for ms in i.metrics["iterations_ms"]]
                        for i in run.instances]
        return [sum(d) for d in zip(*(stats.deciles(v) for v in per_instance), strict=True)]
    return stats.deciles([x for i in run.instances for x in i.metrics["latencies_ms"]])


def _items_per_iteration(metrics: Any) -> float:
    iterations = len(metrics["latencies_ms"]) or 1
    return float(metrics["items"]) / iterations


