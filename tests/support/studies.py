"""Searches without processes: a fake runner with a known landscape, the results it returns, and the
request for a small search space (tests/fixtures/spaces/small.yaml)."""

from __future__ import annotations

import statistics
from pathlib import Path

import optuna

from autotune.config import space
from autotune.host.machine import Machine
from autotune.measure.plan import LaunchPlan
from autotune.measure.results import InstanceResult, RunResult
from autotune.search import loop, opening
from tests.conftest import FIXTURES

SPACE = FIXTURES / "spaces" / "small.yaml"
DEFAULT = space.find("default")


def fake_runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
    """Latency 100 ms at defaults; jemalloc -20, intel -10; mkldnn crashes."""
    config = plan.config
    if config.get("mkldnn"):
        bad = InstanceResult(0, False, "crashed with SIGSEGV", -11, "segfault in oneDNN\n")
        return RunResult(False, "instance 0: crashed with SIGSEGV", (bad,), 1.0)
    latency = 100.0 - 20 * (config.get("allocator") == "jemalloc") - 10 * (config.get("omp_runtime") == "intel")
    return fake_result([latency + jitter for jitter in (-1.0, -0.5, 0.0, 0.5, 1.0)])


def ok_runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
    """Every configuration runs; faster the more knobs it sets (a deterministic landscape)."""
    return fake_result([100.0 - len(plan.config.values) + j for j in (-0.5, 0.0, 0.5)])


def fake_result(latencies: list[float]) -> RunResult:
    """One instance that took these samples, one item each, in a 1 s window; its CPU time is 90%
    of what its iterations took, so that the parts of a warm run are never flagged as starved."""
    busy_s = 0.9 * max(1.0, sum(x + 1 for x in latencies) / 1e3)
    metrics = {"latencies_ms": latencies, "iterations_ms": [x + 1 for x in latencies],
               "throughput_ips": 1000 / statistics.median(latencies), "peak_rss_mb": 500.0, "window_s": 1.0,
               "items": len(latencies), "cpu_s": busy_s, "setup_peak_rss_mb": 600.0}
    return RunResult(True, "", (InstanceResult(0, True, "", 0, "", metrics),), 1.0)


def run_with(latencies: list[float], other_cpu_share: float) -> RunResult:
    """A good run whose window other processes kept `other_cpu_share` busy (the noise record)."""
    metrics = {"latencies_ms": latencies, "iterations_ms": latencies, "throughput_ips": 100.0, "peak_rss_mb": 50.0,
               "setup_peak_rss_mb": 80.0, "window_s": 2.0, "items": len(latencies), "cpu_s": 1.0}
    return RunResult(True, "", (InstanceResult(0, True, "", 0, "", metrics),), 2.0,
                     {"other_cpu_share": other_cpu_share})


def request(tmp_path: Path, trials: int, **kw: object) -> opening.SearchRequest:
    return opening.SearchRequest(**{"model": "resnet18", "trials": trials, "space": SPACE,  # type: ignore[arg-type]
                                        "studies_dir": tmp_path / "studies", "cache_dir": tmp_path / "cache", **kw})


def search(tmp_path: Path, here: Machine, trials: int, **kw: object) -> optuna.Study:
    opened = opening.open_search(request(tmp_path, trials, **kw), here)
    loop.run_search(opened, here, lambda event: None, runner=fake_runner)
    return opened.study
