"""Does building two trials' processes side by side save time, and does waiting for its turn change
what a process measures? A search could claim two trials at a time and build both processes
together, as the confirmation does (tried at 39bd215 and withdrawn on this benchmark's answer,
benchmarks/RESULTS.md, "What a search costs"); two whole searches cannot show what that saves, since each takes
its own path (which configurations, how many compile, how many give up). This replays the trials
of a kept study instead, each as the search ran it (its recorded plan, its three windows in one
warmed process, no giving up), in study order: every block of `--block` trials is run twice, once
one by one (`run_plan`) and once in pairs (`run_series`, the pair built together, each measured
alone), the order alternating from block to block (AB, BA, ...), so drift cancels. A warm-up pass
first compiles what the trials compiled (one window each, untimed), into a cache of the
benchmark's own: the blocks measure process starts, builds and artifact loads, not compiles.

    .venv/bin/python benchmarks/trial_pairs.py STUDY.db [--trials 20] [--block 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna

from autotune.measure import replicates
from autotune.measure.plan import LaunchPlan, stretched
from autotune.measure.results import RunResult
from autotune.measure.runner import run_plan, run_series
from autotune.measure.stats import median
from autotune.study import records, storage

WINDOWS = 3  # a search's trial: its replicates as windows of one warmed process


def plans(db: Path, count: int, cache: Path) -> list[tuple[int, LaunchPlan, float | None]]:
    """The study's first `count` trials that ran a plan of their own, in order, pointed at `cache`,
    with the peak memory each recorded (building or serving, the larger; None: not recorded)."""
    url = f"sqlite:///{db}"
    with storage.quiet_optuna():
        study = optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url)
    ran = [t for t in study.get_trials(deepcopy=False) if "plan" in t.user_attrs and not records.is_duplicate(t)]
    return [(t.number, cached(records.plan_of(t), cache), peak(t.user_attrs)) for t in ran[:count]]


def peak(attrs: dict[str, Any]) -> float | None:
    recorded = [float(attrs[key]) for key in ("peak_rss_mb", "setup_peak_rss_mb") if key in attrs]
    return max(recorded) if recorded else None


def cached(plan: LaunchPlan, cache: Path) -> LaunchPlan:
    """The plan with its artifacts in `cache` (the study's own folder is gone with its search)."""
    def command(words: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(str(cache) if i and words[i - 1] == "--cache-dir" else w for i, w in enumerate(words))

    instances = tuple(dataclasses.replace(i, command=command(i.command)) for i in plan.instances)
    return dataclasses.replace(plan, bench=dataclasses.replace(plan.bench, cache_dir=str(cache)), instances=instances)


def in_pairs(peaks: dict[str, float | None]) -> Callable[[Sequence[LaunchPlan], float], Iterator[RunResult]]:
    """`run_series` with each plan expected to hold what its trial recorded: pairs where they fit."""
    def series(block: Sequence[LaunchPlan], timeout_s: float) -> Iterator[RunResult]:
        return run_series(block, timeout_s, expected_mb=lambda plan: peaks.get(identity(plan)))

    return series


def identity(plan: LaunchPlan) -> str:
    return json.dumps(plan.to_json(), sort_keys=True)


def timed(mode: Callable[[Sequence[LaunchPlan], float], Iterator[RunResult]], block: Sequence[LaunchPlan],
          timeout_s: float) -> tuple[float, list[RunResult]]:
    start = time.monotonic()
    results = list(mode(block, timeout_s))
    return time.monotonic() - start, results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", type=Path, help="a study kept by `benchmarks/search_cost.py --keep`")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--block", type=int, default=4, help="trials per block (even: whole pairs)")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="autotune-trial-pairs-") as folder:
        chosen = plans(args.study, args.trials, Path(folder))
        for _, plan, _ in chosen:  # compile and cache what the trials compiled or traced, untimed
            if plan.config.get("backend") != "eager" or plan.config.get("weight_cache"):
                run_plan(plan, args.timeout)
        runs = [stretched(plan, WINDOWS) for _, plan, _ in chosen]
        pairs = in_pairs({identity(run): mb for run, (_, _, mb) in zip(runs, chosen, strict=True)})
        one_by_one = replicates.one_by_one(run_plan)
        print(f"{args.study.name}: trials {', '.join(str(n) for n, _, _ in chosen)}; blocks of {args.block}, each run "
              "one by one and in pairs, the order alternating\n")
        print("| block | order | one by one, s | in pairs, s | saved, s a trial | failed runs |")
        print("|---|---|---|---|---|---|")
        walls: dict[str, float] = {"one": 0.0, "pairs": 0.0}
        ratios: list[float] = []
        for number, first in enumerate(range(0, len(runs), args.block)):
            block = runs[first:first + args.block]
            order = (("one", one_by_one), ("pairs", pairs)) if number % 2 == 0 else (
                ("pairs", pairs), ("one", one_by_one))
            took = {name: timed(mode, block, args.timeout) for name, mode in order}
            for name, (wall, _) in took.items():
                walls[name] += wall
            alone, paired = took["one"][1], took["pairs"][1]
            ratios += [b.latency_p50_ms / a.latency_p50_ms for a, b in zip(alone, paired, strict=True) if a.ok and b.ok]
            failed = sum(not r.ok for r in alone + paired)
            saved = (took["one"][0] - took["pairs"][0]) / len(block)
            print(f"| {number + 1} | {' then '.join(name for name, _ in order)} | {took['one'][0]:.1f} | "
                  f"{took['pairs'][0]:.1f} | {saved:.2f} | {failed} |", flush=True)
        trials = len(runs)
        print(f"\nall blocks: one by one {walls['one']:.1f} s, in pairs {walls['pairs']:.1f} s "
              f"({(walls['one'] - walls['pairs']) / trials:.2f} s a trial saved, "
              f"{1 - walls['pairs'] / walls['one']:.1%}); p50 in pairs over p50 one by one, per trial: median "
              f"{median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} trials)")


if __name__ == "__main__":
    main()
