"""The real thing: autotune bench launching real benchmark children with real libraries preloaded.

CI installs every library (./setup.sh), so nothing here is skipped there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.cli import AUTOTUNE

pytestmark = pytest.mark.e2e

QUICK = ["--duration", "0.3", "--warmup", "1", "--warmup-time", "0.1", "--min-iterations", "3"]


def bench(tmp_path: Path, *args: str, model: str = "resnet18", timeout: float = 240) -> tuple[int, Any, str]:
    proc = subprocess.run(
        [AUTOTUNE, "bench", "--model", model, *QUICK, "--cache-dir", str(tmp_path / "cache"), "--json",
         *args],
        capture_output=True, text=True, timeout=timeout,
    )
    data = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, data, proc.stderr


def knobs(*assignments: str) -> list[str]:
    return [arg for a in assignments for arg in ("--set", a)]


def runtimes(data: Any) -> list[dict[str, Any]]:
    return [inst["runtime"] for inst in data["result"]["instances"]]


@pytest.mark.parametrize(
    ("assignment", "openmp"),
    [("omp_runtime=gnu", "gomp"), ("omp_runtime=intel", "libiomp5"), ("omp_runtime=llvm", "libomp")],
)
def test_each_openmp_runtime_with_two_instances(tmp_path: Path, assignment: str, openmp: str) -> None:
    code, data, err = bench(tmp_path, *knobs("instances=2", assignment))
    assert code == 0, err
    result = data["result"]
    assert result["ok"] and result["throughput_ips"] > 0
    plan_cpus = [inst["cpus"] for inst in data["plan"]["instances"]]
    for runtime, cpus in zip(runtimes(data), plan_cpus, strict=True):
        assert openmp in Path(runtime["openmp_library"]).name
        assert runtime["affinity"] == cpus
        assert runtime["torch_threads"] == len(cpus)
    assert sorted(c for cpus in plan_cpus for c in cpus) == sorted(set(c for cpus in plan_cpus for c in cpus))


@pytest.mark.parametrize(
    ("allocator", "library"),
    [("default", "libc.so"), ("jemalloc", "libjemalloc"), ("tcmalloc", "libtcmalloc")],
)
def test_each_allocator_with_two_instances(tmp_path: Path, allocator: str, library: str) -> None:
    code, data, err = bench(tmp_path, *knobs("instances=2", f"allocator={allocator}"))
    assert code == 0, err
    for runtime in runtimes(data):
        assert Path(runtime["malloc_library"]).name.startswith(library)
        if allocator == "jemalloc":
            assert runtime["env"]["MALLOC_CONF"].startswith("oversize_threshold:1")


def test_two_instances_share_one_window_and_serving_memory_excludes_tracing(tmp_path: Path) -> None:
    code, data, err = bench(tmp_path, *knobs("instances=2", "backend=torchscript"))
    assert code == 0, err
    result = data["result"]
    first, second = result["instances"]
    assert first["window"] == second["window"]
    assert first["window"]["end"] - first["window"]["start"] == pytest.approx(0.3)
    loops = max(inst["late_start_s"] + inst["window_s"] for inst in result["instances"])
    assert loops - 0.05 <= result["noise"]["window_s"] <= loops + 0.25  # the timed loops, not the exits
    for inst in result["instances"]:
        assert inst["late_start_s"] < 0.01  # nothing slow between the window's start and the first sample
        assert inst["peak_rss_note"] == ""
        assert inst["setup_peak_rss_mb"] > inst["peak_rss_mb"]  # eager reference and tracing freed
    assert result["setup_peak_rss_mb"] > result["peak_rss_mb"]


def test_seed_recipe_mkldnn_weight_cache_intel_jemalloc(tmp_path: Path) -> None:
    recipe = knobs("mkldnn=on", "weight_cache=on", "omp_runtime=intel", "allocator=jemalloc",
                   "kmp_affinity=compact", "kmp_blocktime=1")
    code, data, err = bench(tmp_path, *recipe)
    assert code == 0, err
    setup = data["result"]["instances"][0]["setup"]
    assert setup["artifact_hit"] is False and setup["trace_s"] > 0
    assert Path(setup["artifact_file"]).is_file()
    code, again, err = bench(tmp_path, *recipe)
    assert code == 0, err
    assert again["result"]["instances"][0]["setup"]["artifact_hit"] is True
    assert runtimes(again)[0]["env"]["KMP_AFFINITY"] == "granularity=fine,compact,1,0"


def test_dataloader_workers_feed_the_benchmark(tmp_path: Path) -> None:
    code, data, err = bench(tmp_path, *knobs("dataloader_workers=1"), "--batch-size", "2")
    assert code == 0, err
    inst = data["result"]["instances"][0]
    assert inst["runtime"]["dataloader_workers"] == 1
    assert data["result"]["throughput_ips"] > 0


def test_mkldnn_on_an_unsupported_model_names_the_op(tmp_path: Path) -> None:
    code, data, _ = bench(tmp_path, *knobs("mkldnn=on"), model="mobilenet_v3_small")
    assert code == 1
    assert data["result"]["reason"].startswith("instance 0: mkldnn: aten::hardswish_ in module")
    assert data["result"]["reason"].endswith("use mkldnn=off for this model")


def test_a_benchmark_past_its_timeout_is_killed(tmp_path: Path) -> None:
    start = time.monotonic()
    code, data, _ = bench(tmp_path, "--timeout", "1")
    assert code == 1
    assert data["result"]["reason"].startswith("instance 0: timed out after 1s before measuring")
    assert time.monotonic() - start < 30


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    """Start a long `autotune bench` and wait until its measuring children are running."""
    proc = subprocess.Popen(
        [AUTOTUNE, "bench", "--model", "resnet18", "--duration", "60", "--warmup", "1", "--cache-dir",
         str(tmp_path / "cache"), "--json", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if _is_worker(p)]
            if len(workers) == 2 and all(p.cpu_percent(0.5) > 0 for p in workers):
                return proc, workers
            time.sleep(0.5)
        raise AssertionError("benchmark children never started")
    except BaseException:  # never leave the benchmark running for the next tests to trip over
        proc.kill()
        proc.communicate()
        raise


def _is_worker(process: psutil.Process) -> bool:
    """A measuring child; a short-lived helper (ldconfig, lscpu) may exit, or be a zombie, meanwhile."""
    try:
        return "autotune.child.worker" in " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False


def test_a_crashing_child_is_a_failed_run_with_its_signal(tmp_path: Path) -> None:
    proc, workers = _start(tmp_path, *knobs("instances=2"))
    time.sleep(4)  # past setup, into measuring
    os.kill(workers[0].pid, signal.SIGSEGV)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    result = json.loads(out)["result"]
    assert "crashed with SIGSEGV" in result["reason"]
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)


def test_ctrl_c_leaves_no_process_behind(tmp_path: Path) -> None:
    proc, workers = _start(tmp_path, *knobs("instances=2", "dataloader_workers=1"))
    family = workers + [c for w in workers for c in w.children(recursive=True)]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == "Interrupted by the user (Ctrl-C): every benchmark process was stopped."
    time.sleep(0.5)
    left = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == []


def test_a_series_of_real_children_builds_two_at_a_time_and_measures_each_alone(tmp_path: Path) -> None:
    from autotune.child.settings import MeasureSettings
    from autotune.config.knobs import Config
    from autotune.host import machine
    from autotune.measure import requests
    from autotune.measure.runner import run_series

    here = machine.this_machine()
    measure = MeasureSettings(warmup=1, warmup_s=0.1, duration_s=0.3, min_iterations=3)

    def plan(*assignments: str) -> Any:
        config = Config.from_assignments(assignments)
        request = requests.BenchRequest(model="resnet18", config=config, measure=measure,
                                        cache_dir=tmp_path / "cache")
        return requests.make_plan(request, here)

    two = plan("instances=2")
    first, second, third = run_series([two, two, two], 240)
    assert first.ok and second.ok and third.ok, (first.reason, second.reason, third.reason)
    held = [[float(i.metrics["setup"].get("held_s", -1.0)) for i in r.instances] for r in (first, second, third)]
    assert held[0] == [-1.0, -1.0]  # alone: its memory was not known yet
    assert all(0 <= s < 2 for s in held[1])  # released as soon as both plans had built
    assert all(s > 0.3 for s in held[2])  # waited for the second plan's window
    windows = [[i.metrics["window"] for i in r.instances] for r in (second, third)]
    assert windows[1][0]["start"] > windows[0][0]["end"]
    assert not psutil.Process().children(recursive=True)
