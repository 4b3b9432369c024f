"""The seed's best known methods, measured side by side on this machine.

For one model (resnext101 at batch size 1 by default): PyTorch's defaults, the seed's full recipe
(mkldnn + weight cache + Intel OpenMP + jemalloc + KMP settings) and each single knob changed from
the defaults. Rounds are interleaved (every configuration once per round, each a fresh process)
so that a noisy spell on a shared machine hits all configurations alike; the table reports the
median of the rounds' p50 latencies and their spread.

    .venv/bin/python benchmarks/seed_recipes.py --rounds 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.child.settings import MeasureSettings
from autotune.host import machine
from autotune.measure import requests, stats
from autotune.measure.runner import run_plan

SEED_RECIPE = ["mkldnn=on", "weight_cache=on", "omp_runtime=intel", "allocator=jemalloc",
               "kmp_affinity=compact", "kmp_blocktime=1"]
SINGLE_CHANGES = [["mkldnn=on"], ["weight_cache=on"], ["omp_runtime=intel"], ["omp_runtime=llvm"],
                  ["omp_proc_bind=close"], ["allocator=jemalloc"], ["allocator=tcmalloc"],
                  ["omp_threads=1"], ["instances=1"], ["instances=2"], ["dataloader_workers=1"]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnext101")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--cache-dir", type=Path, default=Path("studies/cache"))
    args = p.parse_args()
    here = machine.this_machine()
    configs = [[], SEED_RECIPE, *SINGLE_CHANGES]
    plans = [requests.make_plan(requests.BenchRequest.from_flags(
        args.model, c, args.batch_size, measure=MeasureSettings(duration_s=args.duration),
        cache_dir=args.cache_dir), here)
        for c in configs]
    rows: dict[int, list[dict[str, float]]] = {i: [] for i in range(len(plans))}
    for round_no in range(args.rounds):
        for i, plan in enumerate(plans):
            result = run_plan(plan, timeout_s=900)
            label = plan.config.describe()
            if result.ok:
                rows[i].append({"p50": result.latency_p50_ms, "ips": result.throughput_ips,
                                "rss": result.peak_rss_mb})
                print(f"round {round_no + 1}: {label}: p50 {result.latency_p50_ms:.1f} ms", file=sys.stderr)
            else:
                print(f"round {round_no + 1}: {label}: FAILED {result.reason}", file=sys.stderr)
    print_table(args, plans, rows)


def print_table(args: argparse.Namespace, plans: list, rows: dict[int, list[dict[str, float]]]) -> None:
    base = stats.median(r["p50"] for r in rows[0]) if rows[0] else float("nan")
    base_ips = stats.median(r["ips"] for r in rows[0]) if rows[0] else float("nan")
    print(f"\n{plans[0].bench.model}, batch size {args.batch_size}, {args.rounds} interleaved rounds "
          f"of {args.duration:g}s, median of rounds (min-max of the rounds' p50)\n")
    print("| configuration | p50 latency ms | latency speedup | throughput items/s | throughput speedup "
          "| peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for i, plan in enumerate(plans):
        label = "PyTorch defaults" if i == 0 else ("seed recipe: " if i == 1 else "") + plan.config.describe()
        runs = rows[i]
        if not runs:
            print(f"| {label} | failed | | | | |")
            continue
        p50s = [r["p50"] for r in runs]
        p50, ips = stats.median(p50s), stats.median(r["ips"] for r in runs)
        rss = stats.median(r["rss"] for r in runs)
        print(f"| {label} | {p50:.1f} ({min(p50s):.1f}-{max(p50s):.1f}) | {base / p50:.2f}x | {ips:.2f} "
              f"| {ips / base_ips:.2f}x | {rss:.0f} |")


if __name__ == "__main__":
    main()
