"""int8 against the bf16 ceiling: PyTorch's defaults, the expert bf16 recipe and int8, side by side.

For resnext101 at batch 8 (throughput, items/s) and at batch 1 (latency, p50 ms): PyTorch's
defaults; the expert recipe (compile + bf16 + channels_last, Intel OpenMP, jemalloc); and int8
with the same process knobs (compile + int8 + channels_last, Intel OpenMP, jemalloc). Every round
runs each configuration once, as a fresh process, in the balanced random order that `autotune
confirm` uses (`rounds.interleave`); speedups are paired per round (`rounds.paired`: the median
ratio, its order-statistic interval labelled with its real coverage, Wilcoxon p for a gain above
3%). The int8 row also gives its guard's figures (top-1 agreement, lowest cosine similarity with
eager fp32). Compiling (and quantizing) happens once, before the rounds, into --cache-dir.

    .venv/bin/python benchmarks/int8.py --rounds 5 --duration 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from autotune.child.settings import MeasureSettings
from autotune.host import machine
from autotune.measure import requests, stats
from autotune.measure.objectives import Metric
from autotune.measure.runner import run_plan
from autotune.search import rounds

PROCESS = ["omp_runtime=intel", "allocator=jemalloc"]
CONFIGS = {"PyTorch defaults": [],
           "expert bf16": ["backend=inductor", "memory_format=channels_last", "precision=bf16", *PROCESS],
           "int8": ["backend=inductor", "memory_format=channels_last", "precision=int8", *PROCESS]}
SETTINGS: tuple[tuple[str, int, Metric], ...] = (("batch 8, throughput", 8, "throughput_ips"),
                                                 ("batch 1, latency", 1, "latency_p50_ms"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnext101")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--cache-dir", type=Path, default=Path("studies/cache"))
    args = p.parse_args()
    here = machine.this_machine()
    for title, batch, metric in SETTINGS:
        measure = MeasureSettings(duration_s=args.duration)
        contenders = [rounds.Contender(label, requests.make_plan(requests.BenchRequest.from_flags(
            args.model, knobs, batch, measure=measure, cache_dir=args.cache_dir), here))
            for label, knobs in CONFIGS.items()]
        guard = warm(contenders)
        measured = rounds.interleave(contenders, args.rounds, metric, 1800, run_plan, progress)
        table(f"{args.model}, {title}", measured, metric, guard)


def warm(contenders: list[rounds.Contender]) -> dict[str, Any]:
    """Compile (and quantize) each configuration once, so that every timed round loads its artifact;
    returns the int8 guard's figures from that first process."""
    found: dict[str, Any] = {}
    for contender in contenders:
        result = run_plan(contender.plan, 1800)
        setup = result.summary()["instances"][0].get("setup", {}) if result.instances else {}
        print(f"{contender.label}: built, compile {setup.get('compile_s', 0):.0f} s "
              f"{'ok' if result.ok else 'FAILED ' + result.reason}", file=sys.stderr)
        if contender.label == "int8":
            found = {k: setup.get(k) for k in ("top1_agreement", "min_cosine", "guard_items", "quantize_s")}
    return found


def progress(event: rounds.RunEvent) -> None:
    value = "FAILED " + event.result.reason if not event.result.ok else (
        f"{event.result.throughput_ips:.2f} items/s, p50 {event.result.latency_p50_ms:.1f} ms")
    print(f"round {event.round + 1}/{event.rounds}: {event.contender.label}: {value}", file=sys.stderr)


def table(title: str, measured: rounds.Rounds, metric: Metric, guard: dict[str, Any]) -> None:
    unit = "items/s" if metric == "throughput_ips" else "p50 ms"
    print(f"\n{title}, {len(measured.orders)} interleaved rounds (median of the rounds; speedup paired per round)")
    print(f"| configuration | {unit} | vs defaults | vs expert bf16 |")
    print("|---|---|---|---|")
    for position, contender in enumerate(measured.contenders):
        values = [v for v in measured.values(position) if v is not None]
        middle = f"{stats.median(values):.2f}" if values else "failed"
        print(f"| {contender.label} | {middle} | {versus(measured, 0, position, metric)} | "
              f"{versus(measured, 1, position, metric)} |")
    if guard:
        print(f"int8 guard: top-1 agreement {guard['top1_agreement']:.1%} of {guard['guard_items']} inputs, "
              f"lowest cosine similarity {guard['min_cosine']:.5f}; quantizing took {guard['quantize_s']:.0f} s")


def versus(measured: rounds.Rounds, reference: int, position: int, metric: Metric) -> str:
    if reference == position:
        return "-"
    compared = rounds.paired(measured.values(reference), measured.values(position), metric, 0.03)
    return compared.describe() if compared else "n/a"


if __name__ == "__main__":
    main()
