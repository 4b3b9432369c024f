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

Giving up: when a trial's replicates are windows of one warmed process (the search's default), the
rule above can save nothing (the process runs its windows back to back). Instead the process
itself checks after each window but its last: after the k-th, when the median latency so far is
more than `GIVE_UP[k-1]` times worse than the best trial's value, it stops (`GiveUp`,
`launch.stretched`), and the trial is pruned with what it measured. The first margin is wide on
purpose: a first window can be slower than the windows after it (resnext101 at batch 1 on a 2-CPU
AVX2 host: up to 1.50x its trial's value over a 50-trial search, benchmarks/RESULTS.md, "Giving up after a window"), so
a configuration given up on there is at least 2 / 1.5 = 1.33x worse than the best. Two windows
agree better with their trial's value (their median at most 1.07x of it over the 46 three-window
trials of two later searches), so after the second the margin is 1.5x: a configuration stopped
there is about 1.4x worse than the best or more, never one the confirmation would have to judge
(its finalists were within 1.14x of the best in both searches).

When a sampled compile is not run at all, before a trial starts, is `compile_skip`'s rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from autotune.base.thresholds import GIVE_UP, MARGIN, MIN_REPLICATES
from autotune.measure import stats
from autotune.measure.objectives import Metric, Objective, lower_is_better, metric_of, metric_value
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import Measurement
from autotune.measure.results import RunResult
from autotune.study import records


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
        self.best_values: list[float] = []  # the best trial's replicate values, when a stop read them
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
        self.reason, self.best_values = self._why(best[0], best[1]), list(best[1])
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


def clear_under_spread(measurement: Measurement, give_up: GiveUp | None, pruner: PruneCheck) -> str:
    """Whether a stop on windows wider than this host's floor (and nothing else) still stands once
    their spread is read: the distribution-free 95% interval of the median (`stats.median_ci`) of the
    samples the stop read lies wholly beyond the line it crossed. Returns why it stands, or "" when
    the interval reaches back over the line (then the stop decides nothing: measured again once).
    A give-up reads its stopped instance's samples against that window's limit (a batch's latency,
    for either objective); a pruning, every sample against the best trial's slowest replicate plus
    MARGIN (latency only: a throughput is one figure per window, not a distribution of samples)."""
    last = measurement.runs[-1]
    if give_up is not None and last.gave_up:
        stopped = next(i for i in last.instances if "gave_up_above_ms" in i.metrics)
        line = give_up.above_ms[int(stopped.metrics.get("gave_up_windows", 1)) - 1]
        samples = list(stopped.metrics["latencies_ms"])
    elif pruner.best_values and lower_is_better(pruner.metric):
        line, samples = max(pruner.best_values) * (1 + MARGIN), measurement.samples()
    else:
        return ""
    interval = stats.median_ci(samples)
    if interval.low <= line:
        return ""
    return (f"its median's {interval.label} over {len(samples)} samples, "
            f"{interval.low:.2f}-{interval.high:.2f} ms, lies above {line:.2f} ms")


def _span(values: Sequence[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


@dataclass(frozen=True)
class GiveUp:
    """The latencies above which each instance of a trial's one warmed process stops, one for each
    window but the last: the best trial's value times GIVE_UP, as one instance's median latency
    per batch."""

    above_ms: tuple[float, ...]
    best: int  # the best trial's number
    best_value: float  # its value, in the metric's unit
    metric: Metric

    def reason(self, run: RunResult) -> str:
        """Which instance gave up, after which window, at what median latency (with several, one is
        enough: the run's windows cannot be cut into replicates any more)."""
        stopped = next(i for i in run.instances if "gave_up_above_ms" in i.metrics)
        window = int(stopped.metrics.get("gave_up_windows", 1))
        after = f"gave up after its {_ordinal(window)} window"
        seen = f"instance {stopped.index}'s median latency {stopped.percentile(50):.2f} ms"
        margin = GIVE_UP[window - 1]
        if lower_is_better(self.metric):
            return f"{after}: {seen} is more than {margin:g}x trial {self.best}'s {self.best_value:.2f} ms"
        return (f"{after}: {seen} is above {self.above_ms[window - 1]:.2f} ms, too slow for the instances "
                f"together to reach 1/{margin:g} of trial {self.best}'s {self.best_value:.2f} items/s")


def give_up(study: optuna.Study, objective: Objective, plan: LaunchPlan) -> GiveUp | None:
    """Where this trial's process gives up, from the best trial so far; None without one, and in a
    two-objective study (Optuna prunes single-objective studies only). For throughput each limit is
    what each of the plan's instances may take per batch for their sum to stay within that margin
    of the best: a forward call is part of an iteration, so with instances equally fast (one
    configuration on equal CPUs) the limit never stops a trial that the rule would keep."""
    if len(study.directions) != 1:
        return None
    metric = metric_of(objective)
    best = next(iter(records.best_trials(study)), None)
    if best is None or best.value is None or best.value <= 0:
        return None
    value = float(best.value)
    per_batch_ms = value if lower_is_better(metric) else 1e3 * len(plan.instances) * plan.bench.batch_size / value
    return GiveUp(tuple(margin * per_batch_ms for margin in GIVE_UP), best.number, value, metric)


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")
