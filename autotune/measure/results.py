"""What one execution of a plan produced: per-instance results and their aggregation.

Aggregated metrics exist only when every instance succeeded; a failure is a result with a reason.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autotune.child.settings import HELD
from autotune.measure.stats import median, percentile

STDERR_TAIL_CHARS = 2000  # of a failed child's output: what a result carries and a trial keeps

STOPPED_BY = "stopped because instance"  # the reason of an instance another one's failure stopped

# A measuring child's set-up costs: every number of its `setup` record under a key ending in `_s`
# (build_s, quantize_s, compile_s, load_s, first_forward_s, warmup_s, ...), but the time it waited
# for another plan's turn (`HELD`): that is the other plan's, not this configuration's.
# `InstanceResult.setup_costs` is the one reading of it.
SECONDS_SUFFIX = "_s"
NOT_COSTS = (HELD,)


@dataclass(frozen=True)
class InstanceResult:
    index: int
    ok: bool
    reason: str
    returncode: int | None
    stderr_tail: str
    metrics: Mapping[str, Any] = field(default_factory=dict)
    wrong_answers: bool = False  # failed the guard against eager fp32: the converted model's verdict

    def percentile(self, q: float) -> float:
        return percentile(self.metrics["latencies_ms"], q)

    def setup_costs(self) -> dict[str, float]:
        """The seconds this instance's process spent setting up, per cost as it recorded them."""
        setup: Mapping[str, Any] = self.metrics.get("setup", {})
        return {key: float(value) for key, value in setup.items()
                if key.endswith(SECONDS_SUFFIX) and key not in NOT_COSTS and isinstance(value, (int, float))}


@dataclass(frozen=True)
class RunResult:
    """One execution of a plan; aggregated metrics exist only when every instance succeeded."""

    ok: bool
    reason: str
    instances: tuple[InstanceResult, ...]
    wall_s: float
    noise: Mapping[str, float] = field(default_factory=dict)

    @property
    def latency_p50_ms(self) -> float:
        return median([i.percentile(50) for i in self.instances])

    @property
    def latency_p90_ms(self) -> float:
        return median([i.percentile(90) for i in self.instances])

    @property
    def throughput_ips(self) -> float:
        """What the machine delivered in the common window: the items all instances finished, over
        the time from the window's START to the last instance's last iteration (`span_s`). An
        instance that started late, or one that ran past END, stretches that time for all, so the
        sum never counts time an instance was not running in (a sum of each instance's own rate
        did). A warm replicate (`parts`) is the same rule over its share of that time."""
        spans = [span_s(i.metrics) for i in self.instances]
        longest = max(spans, default=0.0)
        return sum(float(i.metrics["items"]) for i in self.instances) / longest if longest > 0 else 0.0

    @property
    def bucket_p50s_ms(self) -> dict[str, float]:
        """Per sequence-length bucket, the median over the instances of its p50 ms ({} without buckets)."""
        return bucket_p50s([i.metrics for i in self.instances])

    @property
    def generation(self) -> dict[str, float]:
        """--task generate: the median over the instances of their TTFT and TPOT p50s and TPOT p90s
        ({} otherwise)."""
        return generation_figures([i.metrics for i in self.instances])

    @property
    def peak_rss_mb(self) -> float:
        """What serving holds: the instances' peaks over warmup and the timed loop, summed."""
        return sum(float(i.metrics["peak_rss_mb"]) for i in self.instances)

    @property
    def setup_peak_rss_mb(self) -> float:
        """What building and converting the models held at their peak, summed."""
        return sum(float(i.metrics["setup_peak_rss_mb"]) for i in self.instances)

    @property
    def gave_up(self) -> bool:
        """An instance stopped at one of its checks, its median latency above the limit it was
        given (`launch.stretched`): what it measured is one run, not `count` parts of equal time."""
        return any("gave_up_above_ms" in i.metrics for i in self.instances)

    def windows(self, planned: int) -> int:
        """How many of its `planned` consecutive windows this run's process measured: fewer when it
        gave up (`gave_up_windows`); an instance that went on measured them all."""
        return max((int(i.metrics.get("gave_up_windows", planned)) for i in self.instances), default=planned)

    def parts(self, count: int) -> tuple[RunResult, ...]:
        """The window cut into `count` consecutive windows of equal time, each a run of its own:
        replicates inside one warmed process. Each instance is cut by its own clock (the sum of
        its iteration times), and each part's `span_s` is its share of the instance's by that
        clock; process-wide figures (peak RSS, setup) stay with every part."""
        if not self.ok or count <= 1 or self.gave_up:
            return (self,)
        cut = [_parts(i.metrics, count) for i in self.instances]
        return tuple(RunResult(True, "", tuple(replace(i, metrics=pieces[n])
                                               for i, pieces in zip(self.instances, cut, strict=True)),
                               self.wall_s / count, self.noise) for n in range(count))

    def summary(self) -> dict[str, Any]:
        """Aggregated metrics, or the failure, as plain data for JSON and the study."""
        out: dict[str, Any] = {"ok": self.ok, "reason": self.reason, "wall_s": round(self.wall_s, 3),
                               "noise": dict(self.noise)}
        if self.ok:
            out.update(latency_p50_ms=self.latency_p50_ms, latency_p90_ms=self.latency_p90_ms,
                       throughput_ips=self.throughput_ips, peak_rss_mb=self.peak_rss_mb,
                       setup_peak_rss_mb=self.setup_peak_rss_mb)
            if self.generation:
                weights = next((i.metrics["setup"]["weight_bytes"] for i in self.instances
                                if "weight_bytes" in i.metrics.get("setup", {})), None)
                out["generation"] = self.generation | ({"weight_bytes": weights} if weights else {})
        out["instances"] = [instance_summary(i) for i in self.instances]
        return out


def _parts(metrics: Mapping[str, Any], count: int) -> list[dict[str, Any]]:
    """One instance's samples split where its iterations cross each 1/count of its window."""
    iterations = list(metrics["iterations_ms"])
    latencies = list(metrics["latencies_ms"])
    total = sum(iterations) or 1.0
    per_item = metrics["items"] / max(len(latencies), 1)
    bounds: list[tuple[int, int]] = []
    clock, start = 0.0, 0
    for index, spent in enumerate(iterations):
        clock += spent
        if clock >= total * (len(bounds) + 1) / count and len(bounds) < count - 1:
            bounds.append((start, index + 1))
            start = index + 1
    bounds.append((start, len(iterations)))
    if any(low == high for low, high in bounds):  # one iteration crossed two cuts: cut by count instead
        edges = [round(len(iterations) * n / count) for n in range(count + 1)]
        bounds = list(itertools.pairwise(edges))
    pieces, span = [], span_s(metrics)
    for low, high in bounds:
        seconds = sum(iterations[low:high]) / 1e3
        items, share = per_item * (high - low), span * seconds * 1e3 / total
        pieces.append({**metrics, "latencies_ms": latencies[low:high], "iterations_ms": iterations[low:high],
                       "items": items, "window_s": seconds, "span_s": share,
                       "throughput_ips": items / share if share else 0.0,
                       "cpu_s": float(metrics.get("cpu_s", 0.0)) * seconds * 1e3 / total})
    return pieces


def span_s(metrics: Mapping[str, Any]) -> float:
    """An instance's time from the common window's START to its last iteration's end: `span_s`,
    which the child records, or (a result from before it did) its late start plus its own loop."""
    if "span_s" in metrics:
        return float(metrics["span_s"])
    return max(float(metrics.get("late_start_s") or 0.0), 0.0) + float(metrics["window_s"])


def instance_summary(result: InstanceResult) -> dict[str, Any]:
    out: dict[str, Any] = {"index": result.index, "ok": result.ok, "reason": result.reason,
                           "returncode": result.returncode}
    if result.ok:
        m = result.metrics
        out.update(latency_p50_ms=result.percentile(50), latency_p90_ms=result.percentile(90),
                   throughput_ips=m["throughput_ips"], peak_rss_mb=m["peak_rss_mb"],
                   setup_peak_rss_mb=m["setup_peak_rss_mb"], peak_rss_note=m.get("peak_rss_note", ""),
                   samples=len(m["latencies_ms"]), window=m.get("window"), window_s=m["window_s"],
                   late_start_s=m.get("late_start_s"), setup=m.get("setup", {}), runtime=m.get("runtime", {}))
        if "buckets" in m:  # sequence-length buckets: each one's median sweep, its sweeps, lengths and weight
            out["buckets"] = m["buckets"]
        if "generation" in m:  # --task generate: time to first token, time per output token, tokens/s
            out["generation"] = m["generation"]
    else:
        out.update(stderr_tail=result.stderr_tail, wrong_answers=result.wrong_answers)
    return out


def bucket_p50s(instances: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per sequence-length bucket, the median over `instances` (each one's metrics or summary, with
    its `buckets`) of the bucket's p50 ms ({} without buckets)."""
    seen: dict[str, list[float]] = {}
    for instance in instances:
        for length, bucket in (instance.get("buckets") or {}).items():
            seen.setdefault(length, []).append(float(bucket["latency_p50_ms"]))
    return {length: median(p50s) for length, p50s in seen.items()}


def generation_figures(instances: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """--task generate: the median over `instances` (metrics or summaries) of their time to first
    token and time per output token p50s, and of their p90 time per output token ({} without
    generation)."""
    found = [m["generation"] for m in instances if m.get("generation")]
    out = {}
    for key in ("ttft_p50_ms", "tpot_p50_ms", "tpot_p90_ms"):
        values = [float(g[key]) for g in found if g.get(key) is not None]
        if values:
            out[key] = median(values)
    return out


def stopped_by(index: int, what: str = "failed") -> str:
    """The reason of an instance stopped because another failed: not a cause of its own."""
    return f"{STOPPED_BY} {index} {what}"


def combine(results: tuple[InstanceResult, ...], wall_s: float,
            noise: Mapping[str, float] | None = None) -> RunResult:
    """The run's verdict: failed when any instance failed, naming the first that failed of its own
    accord (the instances it stopped say only that)."""
    failed = [r for r in results if not r.ok]
    cause = next((r for r in failed if not r.reason.startswith(STOPPED_BY)), failed[0]) if failed else None
    reason = "" if cause is None else f"instance {cause.index}: {cause.reason}"
    return RunResult(ok=not failed, reason=reason, instances=results, wall_s=wall_s, noise=noise or {})
