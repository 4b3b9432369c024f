"""One configuration measured the trustworthy way: several fresh processes (replicates), pooled
statistics, noise detection and a bounded re-measure when the spread is too large."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from autotune.base.thresholds import REMEASURE, STARVED
from autotune.host.cpustat import busy_reason
from autotune.measure import stats
from autotune.measure.plan import LaunchPlan, stretched
from autotune.measure.results import InstanceResult, RunResult, generation_figures
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
    floor: float | None = None  # this host's spread floor (host/floor.py) when the windows were judged

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
    def steal_share(self) -> float:
        """The largest share of the CPUs the hypervisor gave to other VMs while a replicate measured."""
        return max((float(r.noise.get("steal_share", 0.0)) for r in self.runs), default=0.0)

    @property
    def own_cpu_share(self) -> float | None:
        """The smallest share of its threads' CPU time a replicate's child got (None: not measured)."""
        shares = [_utilization((run,)) for run in self.runs]
        return min((s for s in shares if s), default=None)

    @property
    def window_spread(self) -> float:
        """The spread of this measurement's windows as this host's floor reads it: each instance's own
        relative IQR (two one-thread instances are two distributions, not one wide one), the median
        over a window's instances, the largest over its windows."""
        return max((run_spread(r) for r in self.runs if r.ok), default=0.0)

    @property
    def disturbed_reason(self) -> str:
        """Evidence that something outside the measurement took CPU while it measured, or "": other
        processes' CPU use, hypervisor steal, a child starved of CPU time. Such a window never decides."""
        busy = busy_reason(self.other_cpu_share, self.steal_share)
        reasons = [busy] if busy else []
        own = self.own_cpu_share
        if own is not None and own < STARVED:
            reasons.append(f"the child got {own:.0%} of its threads' CPU time < {STARVED:.0%}")
        return "; ".join(reasons)

    @property
    def wide_reason(self) -> str:
        """Why the windows are wider than this host's own undisturbed windows (`floor`), or "" (also
        where no floor is known yet)."""
        if self.floor is None or self.window_spread <= self.floor:
            return ""
        return f"IQR/median {self.window_spread:.0%} > this host's floor {self.floor:.0%}"

    @property
    def noisy_reason(self) -> str:
        """Why the measurement is not to be trusted as it is, or "": a disturbance
        (`disturbed_reason`), or windows wider than this host's floor (`wide_reason`), or both."""
        return "; ".join(r for r in (self.wide_reason, self.disturbed_reason) if r)

    @property
    def noisy(self) -> bool:
        return bool(self.noisy_reason)

    @property
    def disturbed(self) -> bool:
        return bool(self.disturbed_reason)

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
            "disturbed": self.disturbed,
            "window_spread": round(self.window_spread, 4),
            "spread_floor": self.floor,
            **self.setup_seconds(),
            "child_cpu_utilization": round(_utilization(self.runs), 3),
            "other_cpu_share_max": self.other_cpu_share,
            "steal_share_max": self.steal_share,
            "load_before": noise[0].get("load_before") if noise else None,
            "load_after": noise[-1].get("load_after") if noise else None,
        } | ({"generation": self.generation} if self.generation else {})

    def setup_seconds(self) -> dict[str, float]:
        """Seconds the measuring processes spent before their windows: building (loading, converting,
        quantizing, compiling, loading the artifact, the first forward: every set-up cost the child
        records, `InstanceResult.setup_costs`, but the warm-up) and warming up, the slowest instance
        of each process. A warm replicate is a part of one process and carries that process's setup:
        counted once (the parts hold the same figures)."""
        per_run = [max((setup_split(i) for i in r.instances), default=(0.0, 0.0))
                   for r in self.runs if r.ok]
        distinct = list(dict.fromkeys(per_run))
        return {"build_s": round(sum(b for b, _ in distinct), 3), "warmup_s": round(sum(w for _, w in distinct), 3)}

    @cached_property
    def generation(self) -> dict[str, float]:
        """--task generate: time to first token and per output token over every run's instances,
        and the weights a decode step reads ({} otherwise)."""
        instances = [i.metrics for r in self.runs for i in r.instances]
        figures = generation_figures(instances)
        weights = next((m["setup"]["weight_bytes"] for m in instances if "weight_bytes" in m.get("setup", {})), None)
        return figures | ({"weight_bytes": weights} if figures and weights else {})


def noisy_reason(run: RunResult, floor: float | None = None) -> str:
    """Why one run is not to be trusted as it is, or "": `Measurement.noisy_reason` of it alone."""
    return Measurement((run,), floor=floor).noisy_reason


def setup_split(instance: InstanceResult) -> tuple[float, float]:
    """(building, warming up) in seconds: the instance's set-up costs, the warm-up apart; building is
    its `ready_s`, from the start of the build to the warm-up (the parts nest: quantize_s inside
    compile_s), or for a child that recorded none (an older one) the sum of its parts."""
    costs = instance.setup_costs()
    warmup = costs.pop("warmup_s", 0.0)
    return costs.get("ready_s", sum(costs.values())), warmup


def run_spread(run: RunResult) -> float:
    """One window's spread: the median of its instances' own relative IQRs."""
    return median([stats.relative_iqr(sorted(i.metrics["latencies_ms"])) for i in run.instances
                   if i.metrics.get("latencies_ms")] or [0.0])


def undisturbed_spreads(measurement: Measurement) -> list[float]:
    """The spreads of the windows no disturbance touched, for this host's floor (`host/floor.py`)."""
    return [run_spread(run) for run in measurement.runs
            if run.ok and not Measurement((run,)).disturbed
            and any(i.metrics.get("latencies_ms") for i in run.instances)]


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
            give_up_above_ms: Sequence[float] = (), floor: float | None = None) -> Measurement:
    """Run `plan` `policy.replicates` times, plus up to `max_extra` while the windows are wide
    (`wider`: pooled spread above REMEASURE and, once known, beyond this host's `floor`).
    `after_each(index, run, more_planned)` may stop early (pruning) by returning True;
    it is told whether more replicates are planned, since stopping after the last saves nothing.
    Replicates in one process stop after the k-th window when its median latency is above the k-th
    of `give_up_above_ms` (`pruning.GiveUp`): one run, whatever it measured."""
    runs: list[RunResult] = []
    limit = policy.replicates
    if policy.in_process and limit > 1:
        run = runner(stretched(plan, limit, give_up_above_ms), policy.timeout_s)
        runs.extend(run.parts(limit))
        if not run.ok:
            return Measurement(tuple(runs), floor=floor)
        if run.gave_up:
            after_each(0, run, False)  # its value, reported
            return Measurement((run,), stopped_early=True, floor=floor)
        for index, part in enumerate(runs):
            after_each(index, part, False)  # reported; stopping now would save nothing
    while True:
        room = limit < policy.replicates + policy.max_extra
        if len(runs) == limit and room and wider(Measurement(tuple(runs), floor=floor)):
            limit += 1
        if len(runs) >= limit:
            return Measurement(tuple(runs), floor=floor)
        run = runner(plan, policy.timeout_s)
        runs.append(run)
        if not run.ok:
            return Measurement(tuple(runs), floor=floor)
        if after_each(len(runs) - 1, run, len(runs) < limit):
            return Measurement(tuple(runs), stopped_early=True, floor=floor)


def wider(measurement: Measurement) -> bool:
    """Whether a measurement's windows are wide enough to take another replicate: undisturbed, the
    pooled spread above REMEASURE, and (once this host's floor is known) the windows wider than the
    floor too, so that a host whose windows always spread 30% pays no extra replicate for it. A
    disturbed window takes none: more windows beside the same neighbour tell nothing more."""
    if measurement.disturbed or measurement.spread <= REMEASURE:
        return False
    return measurement.floor is None or bool(measurement.wide_reason)
