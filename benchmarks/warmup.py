"""How much untimed warmup does a measurement need?

Every process autotune measures first runs `--warmup` iterations (3) and `--warmup-time` seconds
(1.0) untimed. This script measures what a shorter warmup would have let into the first timed
window. Each configuration runs in fresh processes with only the 3 warmup iterations and one long
timed window; its samples, in order, are then cut as if the warmup had lasted W more seconds: the
p50 of the 2 s after W, over the p50 of the steady tail (the samples after W_MAX + 2 s). A ratio
above 1 is what that warmup leaves in (first calls, a cold allocator, DataLoader workers still
starting); the row for the current 1.0 s shows the noise of two 2 s windows of a warm process.

    .venv/bin/python benchmarks/warmup.py                       # resnext101, about 8 minutes
    .venv/bin/python benchmarks/warmup.py --model resnet18 --rounds 5
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from autotune.child.settings import MeasureSettings
from autotune.config.knobs import Config
from autotune.host import machine
from autotune.measure import requests
from autotune.measure.runner import run_plan
from autotune.measure.stats import median

# The kinds of configuration a search measures: eager, the experts' recipes, TorchScript,
# loaded AOTInductor artifacts (int8, bf16), two bound instances, DataLoader workers.
CONFIGS = [
    [],
    ["mkldnn=on", "weight_cache=on", "omp_runtime=intel", "kmp_affinity=compact", "kmp_blocktime=1",
     "allocator=jemalloc"],
    ["backend=torchscript", "precision=bf16", "memory_format=channels_last", "allocator=tcmalloc"],
    ["precision=bf16", "memory_format=channels_last", "allocator=jemalloc", "dataloader_workers=2"],
    ["backend=inductor", "precision=int8", "memory_format=channels_last"],
    ["backend=inductor", "precision=int8", "omp_threads=1", "instances=2", "allocator=jemalloc"],
    ["backend=inductor", "precision=bf16", "memory_format=channels_last", "omp_runtime=llvm"],
]
WARMUPS = (0.0, 0.25, 0.5, 1.0)  # seconds of warmup after the 3 iterations, as if it had lasted that long
WINDOW_S = 2.0
W_MAX = max(WARMUPS)


def cut(latencies: list[float], iterations: list[float], start_s: float, end_s: float) -> list[float]:
    """The latencies of the iterations that began in [start_s, end_s) of the timed loop."""
    picked, clock = [], 0.0
    for latency, iteration in zip(latencies, iterations, strict=True):
        if start_s <= clock < end_s:
            picked.append(latency)
        clock += iteration / 1000
    return picked


def ratios(latencies: list[float], iterations: list[float]) -> dict[float, float]:
    """Per warmup: the first window's p50 over the steady tail's."""
    tail = cut(latencies, iterations, W_MAX + WINDOW_S, float("inf"))
    out = {}
    for warmup in WARMUPS:
        first = cut(latencies, iterations, warmup, warmup + WINDOW_S)
        if first and tail:
            out[warmup] = median(first) / median(tail)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnext101")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tail", type=float, default=2.0, help="seconds of steady tail after the last window")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/autotune-warmup"))
    args = p.parse_args()
    here = machine.this_machine()
    measure = MeasureSettings(warmup=3, warmup_s=0.0, duration_s=W_MAX + WINDOW_S + args.tail, min_iterations=1)
    plans = [requests.make_plan(requests.BenchRequest(
        model=args.model, config=Config.from_assignments(c), measure=measure, cache_dir=args.cache_dir), here)
        for c in CONFIGS]
    for plan in plans:  # compile what needs compiling before anything is measured
        run_plan(plan, 1800)
    seen: dict[int, list[dict[float, float]]] = {i: [] for i in range(len(plans))}
    rng = random.Random(args.seed)
    for round_no in range(args.rounds):
        for index in rng.sample(range(len(plans)), len(plans)):
            run = run_plan(plans[index], 900)
            if not run.ok:
                print(f"round {round_no} config {index}: failed: {run.reason}", flush=True)
                continue
            for instance in run.instances:
                metrics = instance.metrics
                seen[index].append(ratios(metrics["latencies_ms"], metrics["iterations_ms"]))
            print(f"round {round_no} config {index}: {seen[index][-1]}", flush=True)
    table(args, seen)


def table(args: argparse.Namespace, seen: dict[int, list[dict[float, float]]]) -> None:
    print(f"\n{args.model}, batch 1: first {WINDOW_S:g} s window after 3 iterations and W s of warmup, p50 over "
          f"the steady tail's; median over {args.rounds} rounds x instances (largest in brackets)")
    print("| configuration | " + " | ".join(f"W = {w:g} s" for w in WARMUPS) + " |")
    print("|---|" + "---|" * len(WARMUPS))
    for index, config in enumerate(CONFIGS):
        cells = []
        for warmup in WARMUPS:
            values = [r[warmup] for r in seen[index] if warmup in r]
            cells.append(f"{median(values):.3f} ({max(values):.3f})" if values else "-")
        print(f"| {' '.join(config) or 'defaults'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
