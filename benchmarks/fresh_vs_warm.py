"""What do fresh-process replicates cost, and what do they protect against?

A trial's value is the median of its replicates. Fresh: each replicate is a new process (start,
import, build, compile check or artifact load, warmup). Warm: the replicates are consecutive
windows of one process, which pays those once. For a few configurations, in interleaved rounds,
each mode measures one trial per round; the table gives, per mode:

- wall: seconds one trial took (median over rounds);
- within: the spread of the replicates inside a trial, (max - min) / median (median over rounds):
  what the replicates see of each other;
- across: the spread of the trial values over the rounds, (max - min) / median: how much a trial
  would move if measured again, which is what ranking configurations needs small;
- vs fresh: the warm trial values' median over the fresh ones' (a bias if not ~1).

    .venv/bin/python benchmarks/fresh_vs_warm.py                      # resnet18, about 6 minutes
    .venv/bin/python benchmarks/fresh_vs_warm.py --model resnext101 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.child.settings import MeasureSettings
from autotune.config.knobs import Config
from autotune.host import machine
from autotune.measure import requests
from autotune.measure.replicates import ReplicatePolicy, measure_replicates
from autotune.measure.runner import run_plan
from autotune.measure.stats import median

CONFIGS = [[], ["allocator=jemalloc"], ["backend=torchscript"], ["omp_threads=1"],
           ["backend=inductor", "precision=bf16", "memory_format=channels_last"]]
MODES = {"fresh": False, "warm": True}


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / median(values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--replicates", type=int, default=3)
    p.add_argument("--duration", type=float, default=2.0, help="timed seconds per replicate")
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/autotune-fresh-vs-warm"))
    args = p.parse_args()
    here = machine.this_machine()
    plans = [requests.make_plan(requests.BenchRequest(
        model=args.model, config=Config.from_assignments(c), measure=MeasureSettings(duration_s=args.duration),
        cache_dir=args.cache_dir), here) for c in CONFIGS]
    for plan in plans:  # compile what needs compiling before anything is timed
        run_plan(plan, 900)
    trials: dict[tuple[int, str], list[tuple[float, list[float]]]] = {}
    for round_no in range(args.rounds):
        for index, plan in enumerate(plans):
            for mode, warm in MODES.items():
                policy = ReplicatePolicy(replicates=args.replicates, max_extra=0, in_process=warm)
                measured = measure_replicates(plan, policy, run_plan)
                if not measured.ok:
                    print(f"{plan.config.describe()} {mode}: FAILED {measured.reason}", file=sys.stderr)
                    continue
                wall = sum(r.wall_s for r in measured.runs)  # a warm trial's parts share its wall time
                values = [r.latency_p50_ms for r in measured.runs]
                trials.setdefault((index, mode), []).append((wall, values))
                print(f"round {round_no + 1} {plan.config.describe()} {mode}: {median(values):.2f} ms "
                      f"({', '.join(f'{v:.2f}' for v in values)}), {wall:.1f} s", file=sys.stderr, flush=True)
    print(f"\n{args.model}, batch 1, {args.replicates} replicates of {args.duration:g} s, {args.rounds} interleaved "
          f"rounds\n")
    print("| configuration | mode | p50 ms | wall s per trial | within a trial | across rounds | vs fresh |")
    print("|---|---|---|---|---|---|---|")
    for index, plan in enumerate(plans):
        fresh = [median(v) for _, v in trials.get((index, "fresh"), [])]
        for mode in MODES:
            rows = trials.get((index, mode), [])
            if not rows:
                continue
            values = [median(v) for _, v in rows]
            bias = f"{median(values) / median(fresh):.3f}" if fresh else "-"
            print(f"| {plan.config.describe()} | {mode} | {median(values):.2f} | {median([w for w, _ in rows]):.1f} | "
                  f"{median([spread(v) for _, v in rows]):.1%} | {spread(values):.1%} | {bias} |")


if __name__ == "__main__":
    main()
