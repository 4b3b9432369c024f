"""One configuration measured the trustworthy way: several fresh processes (replicates), pooled
statistics, noise detection and a bounded re-measure when the spread is too large."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from autotune.base.thresholds import BUSY_MACHINE, NOISY, REMEASURE, STARVED
from autotune.measure import stats
from autotune.measure.plan import LaunchPlan, stretched
from autotune.measure.results import RunResult, generation_figures
from autotune.measure.stats import median

PERCENTILES = tuple(range(101))  # the stored summary of all samples: p0..p100, a fixed size
# A search's replicates are windows of one warmed process unless --fresh-replicates: measured in
# benchmarks/RESULTS.md, "Fresh or warm replicates".
WARM_SEARCH_DEFAULT = True

# Executes a plan once with a timeout: the real orchestrator, or a fake in tests.
PlanRunner = Callable[[LaunchPlan, float], RunResult]
# Executes plans one after another, each alone while it measures, and yields their results in
# order: the real `runner.run_series` (which builds two at a time), or `one_by_one`.
SeriesRunner = Callable[[Sequence[LaunchPlan], float], Generator[RunResult, None, None]]


def one_by_one(runner: PlanRunner) -> SeriesRunner:
    """A series run plan after plan by `runner` (a fake's series, in tests)."""
    def series(plans: Sequence[LaunchPlan], timeout_s: float) -> Generator[RunResult, None, None]:
        for plan in plans:
            yield runner(plan, timeout_s)
    return series


@dataclass(frozen=True)
class ReplicatePolicy:
    """How a configuration is measured across processes (inside one process: MeasureSettings)."""

    replicates: int = 3
    max_extra: int = 2
    timeout_s: float = 900.0
    # True: the replicates are consecutive windows of one warmed process (one start, one compile
    # check, one warmup); False: each is a fresh process. Extra replicates are always fresh.
    in_process: bool = False


@dataclass(frozen=True)
class Measurement:
    """All replicates of one configuration; metrics exist when every replicate succeeded."""

    runs: tuple[RunResult, ...]
    stopped_early: bool = False

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(r.ok for r in self.runs)

    @property
    def reason(self) -> str:
        failed = next((r for r in self.runs if not r.ok), None)
        return "" if failed is None else failed.reason

    def samples(self) -> list[float]:
        return [x for r in self.runs if r.ok for i in r.instances for x in i.metrics["latencies_ms"]]

    @cached_property
    def _sorted(self) -> list[float]:
        """All samples, sorted once: every statistic below sorts again, in linear time."""
        return sorted(self.samples())

    @property
    def latency_p50_ms(self) -> float:
        return median([r.latency_p50_ms for r in self.runs])

    @property
    def throughput_ips(self) -> float:
        return median([r.throughput_ips for r in self.runs])

    @property
    def spread(self) -> float:
        return stats.relative_iqr(self._sorted)

    @property
    def other_cpu_share(self) -> float:
        """The largest share of the CPUs other processes used while a replicate measured."""
        return max((float(r.noise.get("other_cpu_share", 0.0)) for r in self.runs), default=0.0)

    @property
    def own_cpu_share(self) -> float | None:
        """The smallest share of its threads' CPU time a replicate's child got (None: not measured)."""
        shares = [_utilization((run,)) for run in self.runs]
        return min((s for s in shares if s), default=None)

    @property
    def noisy_reason(self) -> str:
        """Why the measurement is not to be trusted as it is, or "": the spread, other processes'
        CPU use, a child starved of CPU time, or several."""
        reasons = []
        if self.spread > NOISY:
            reasons.append(f"IQR/median {self.spread:.0%} > {NOISY:.0%}")
        if self.other_cpu_share > BUSY_MACHINE:
            reasons.append(f"other processes used {self.other_cpu_share:.0%} of the CPUs > {BUSY_MACHINE:.0%}")
        own = self.own_cpu_share
        if own is not None and own < STARVED:
            reasons.append(f"the child got {own:.0%} of its threads' CPU time < {STARVED:.0%}")
        return "; ".join(reasons)

    @property
    def noisy(self) -> bool:
        return bool(self.noisy_reason)

    def summary(self) -> dict[str, Any]:
        """Everything a trial records about its measurement."""
        samples = self._sorted
        interval = stats.median_ci(samples)
        noise = [r.noise for r in self.runs if r.noise]
        return {
            "latency_p50_ms": round(self.latency_p50_ms, 4),
            "latency_p90_ms": round(stats.percentile(samples, 90), 4),
            "latency_iqr_ms": round(stats.iqr(samples), 4),
            "latency_iqr_rel": round(self.spread, 4),
            "latency_ci_ms": [round(interval.low, 4), round(interval.high, 4)],  # of the pooled samples' median
            "latency_ci_label": interval.label,
            "throughput_ips": round(self.throughput_ips, 4),
            "peak_rss_mb": round(max(r.peak_rss_mb for r in self.runs), 1),
            "setup_peak_rss_mb": round(max(r.setup_peak_rss_mb for r in self.runs), 1),
            "samples": len(samples),
            "timed_s": round(sum(_window_s(r) for r in self.runs), 3),
            "measure_wall_s": round(sum(r.wall_s for r in self.runs), 3),
            "replicates": len(self.runs),
            "replicate_p50_ms": [round(r.latency_p50_ms, 3) for r in self.runs],
            "replicate_throughput_ips": [round(r.throughput_ips, 3) for r in self.runs],
            "latency_percentiles_ms": [round(stats.percentile(samples, q), 4) for q in PERCENTILES],
            "noisy": self.noisy,
            "noisy_reason": self.noisy_reason,
            "child_cpu_utilization": round(_utilization(self.runs), 3),
            "other_cpu_share_max": self.other_cpu_share,
            "steal_share_max": max((n.get("steal_share", 0.0) for n in noise), default=0.0),
            "load_before": noise[0].get("load_before") if noise else None,
            "load_after": noise[-1].get("load_after") if noise else None,
        } | ({"generation": self.generation} if self.generation else {})

    @cached_property
    def generation(self) -> dict[str, float]:
        """--task generate: time to first token and per output token over every run's instances,
        and the weights a decode step reads ({} otherwise)."""
        instances = [i.metrics for r in self.runs for i in r.instances]
        figures = generation_figures(instances)
        weights = next((m["setup"]["weight_bytes"] for m in instances if "weight_bytes" in m.get("setup", {})), None)
        return figures | ({"weight_bytes": weights} if figures and weights else {})


def noisy_reason(run: RunResult) -> str:
    """Why one run is not to be trusted as it is, or "": `Measurement.noisy_reason` of it alone."""
    return Measurement((run,)).noisy_reason


def _window_s(run: RunResult) -> float:
    """Seconds the run took samples in: the common window, as its longest instance measured it."""
    return max((float(i.metrics.get("window_s", 0.0)) for i in run.instances), default=0.0)


def _utilization(runs: Sequence[RunResult]) -> float:
    """Child CPU time over (window x threads): well below 1 means it waited for CPUs or data."""
    shares = []
    for run in runs:
        for inst in run.instances:
            threads = inst.metrics.get("runtime", {}).get("torch_threads") or 1
            window = inst.metrics.get("window_s") or 0
            if window:
                shares.append(float(inst.metrics.get("cpu_s", 0.0)) / (window * threads))
    return median(shares) if shares else 0.0


def measure_replicates(plan: LaunchPlan, policy: ReplicatePolicy, runner: PlanRunner,
            after_each: Callable[[int, RunResult, bool], bool] = lambda i, r, more: False,
            give_up_above_ms: Sequence[float] = ()) -> Measurement:
    """Run `plan` `policy.replicates` times, plus up to `max_extra` while the spread stays above
    REMEASURE. `after_each(index, run, more_planned)` may stop early (pruning) by returning True;
    it is told whether more replicates are planned, since stopping after the last saves nothing.
    Replicates in one process stop after the k-th window when its median latency is above the k-th
    of `give_up_above_ms` (`pruning.GiveUp`): one run, whatever it measured."""
    runs: list[RunResult] = []
    limit = policy.replicates
    if policy.in_process and limit > 1:
        run = runner(stretched(plan, limit, give_up_above_ms), policy.timeout_s)
        runs.extend(run.parts(limit))
        if not run.ok:
            return Measurement(tuple(runs))
        if run.gave_up:
            after_each(0, run, False)  # its value, reported
            return Measurement((run,), stopped_early=True)
        for index, part in enumerate(runs):
            after_each(index, part, False)  # reported; stopping now would save nothing
    while True:
        room = limit < policy.replicates + policy.max_extra
        if len(runs) == limit and room and Measurement(tuple(runs)).spread > REMEASURE:
            limit += 1
        if len(runs) >= limit:
            return Measurement(tuple(runs))
        run = runner(plan, policy.timeout_s)
        runs.append(run)
        if not run.ok:
            return Measurement(tuple(runs))
        if after_each(len(runs) - 1, run, len(runs) < limit):
            return Measurement(tuple(runs), stopped_early=True)
