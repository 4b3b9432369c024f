"""One configuration measured the trustworthy way: several fresh processes (replicates), pooled
statistics, noise detection and a bounded re-measure when the spread is too large."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune import stats
from autotune.launch import LaunchPlan
from autotune.results import RunResult
from autotune.stats import median

NOISY = 0.10  # IQR/median above this is flagged
REMEASURE = 0.25  # above this more replicates are taken, at most `max_extra` of them

# Executes a plan once with a timeout: the real orchestrator, or a fake in tests.
PlanRunner = Callable[[LaunchPlan, float], RunResult]


@dataclass(frozen=True)
class ReplicatePolicy:
    """How a configuration is measured across processes (inside one process: MeasureSettings)."""

    replicates: int = 3
    max_extra: int = 2
    timeout_s: float = 900.0


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

    @property
    def latency_p50_ms(self) -> float:
        return median([r.latency_p50_ms for r in self.runs])

    @property
    def throughput_ips(self) -> float:
        return median([r.throughput_ips for r in self.runs])

    @property
    def spread(self) -> float:
        return stats.relative_iqr(self.samples())

    @property
    def noisy(self) -> bool:
        return self.spread > NOISY

    def summary(self) -> dict[str, Any]:
        """Everything a trial records about its measurement."""
        samples = self.samples()
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
            "samples": len(samples),
            "replicates": len(self.runs),
            "replicate_p50_ms": [round(r.latency_p50_ms, 3) for r in self.runs],
            "replicate_throughput_ips": [round(r.throughput_ips, 3) for r in self.runs],
            "noisy": self.noisy,
            "child_cpu_utilization": round(_utilization(self.runs), 3),
            "other_cpu_share_max": max((n.get("other_cpu_share", 0.0) for n in noise), default=0.0),
            "steal_share_max": max((n.get("steal_share", 0.0) for n in noise), default=0.0),
            "load_before": noise[0].get("load_before") if noise else None,
            "load_after": noise[-1].get("load_after") if noise else None,
        }


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
            after_each: Callable[[int, RunResult, bool], bool] = lambda i, r, more: False) -> Measurement:
    """Run `plan` `policy.replicates` times, plus up to `max_extra` while the spread stays above
    REMEASURE. `after_each(index, run, more_planned)` may stop early (pruning) by returning True;
    it is told whether more replicates are planned, since stopping after the last saves nothing."""
    runs: list[RunResult] = []
    limit = policy.replicates
    while len(runs) < limit:
        run = runner(plan, policy.timeout_s)
        runs.append(run)
        if not run.ok:
            break
        if after_each(len(runs) - 1, run, len(runs) < limit):
            return Measurement(tuple(runs), stopped_early=True)
        room = limit < policy.replicates + policy.max_extra
        if len(runs) == limit and room and Measurement(tuple(runs)).spread > REMEASURE:
            limit += 1
    return Measurement(tuple(runs))
