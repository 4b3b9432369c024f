"""How far can autotune's numbers be trusted on this machine?

1. Spread: the same configuration (PyTorch defaults) measured in N separate runs, each a fresh
   process with the standard in-process protocol.
2. Round trip: a short search, its confirmation, the export; then the exported configuration is
   planned again from the env file and re-measured in fresh runs. Reported: how far the
   re-measured median lands from the value confirmation stored (target: within 5%).

    .venv/bin/python benchmarks/repeatability.py            # resnext101, batch size 1
    .venv/bin/python benchmarks/repeatability.py --model resnet18 --trials 6 --runs 6
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import optuna

from autotune.child.settings import MeasureSettings
from autotune.config import space
from autotune.config.knobs import Config
from autotune.deploy import export
from autotune.host import machine
from autotune.measure import requests, stats
from autotune.measure.replicates import ReplicatePolicy
from autotune.measure.runner import run_plan
from autotune.search import confirm, loop, opening


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnext101")
    p.add_argument("--runs", type=int, default=10, help="fresh runs of the same configuration")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--space", default="quick")
    p.add_argument("--rounds", type=int, default=10, help="confirmation rounds")
    args = p.parse_args()
    here = machine.this_machine()
    measure = MeasureSettings()
    spread(args, here, measure)
    round_trip(args, here, measure)


def spread(args: argparse.Namespace, here: machine.Machine, measure: MeasureSettings) -> None:
    plan = requests.make_plan(requests.BenchRequest(model=args.model, config=Config(), measure=measure), here)
    p50s = []
    for number in range(args.runs):
        result = run_plan(plan, 900)
        if result.ok:
            p50s.append(result.latency_p50_ms)
            print(f"run {number + 1}/{args.runs}: p50 {result.latency_p50_ms:.1f} ms "
                  f"(other processes' CPU share {result.noise.get('other_cpu_share', 0):.0%})", file=sys.stderr)
    interval = stats.median_ci(p50s)
    print(f"\n1. {plan.bench.model} batch 1, PyTorch defaults, {len(p50s)} separate runs "
          f"({measure.duration_s:g} s window each)\n")
    print("| median p50 ms | min | max | max/min | IQR/median across runs | interval of the median |")
    print("|---|---|---|---|---|---|")
    print(f"| {stats.median(p50s):.1f} | {min(p50s):.1f} | {max(p50s):.1f} | {max(p50s) / min(p50s):.2f} "
          f"| {stats.relative_iqr(p50s):.1%} | {interval.describe(1)} |")


def round_trip(args: argparse.Namespace, here: machine.Machine, measure: MeasureSettings) -> None:
    with tempfile.TemporaryDirectory(prefix="autotune-repeat-") as tmp:
        request = opening.SearchRequest(model=args.model, trials=args.trials, space=space.find(args.space),
                                      studies_dir=Path(tmp), cache_dir=Path("studies/cache"), measure=measure,
                                      replicates=ReplicatePolicy(replicates=3), seed=0)
        opened = opening.open_search(request, here)
        loop.run_search(opened, here, lambda e: print(_line(e), file=sys.stderr) if e.kind == "done" else None)
        verdict = confirm.confirm(opened.study, 3, args.rounds, 0.03, 900, lambda e: None)
        trial = export.pick_trial(opened.study, None)
        path = Path(tmp) / "best.env"
        export.write(path, export.render(opened.study, trial))
        plan = requests.plan_from_exported(export.read(path).env, here, measure)
        again = [r.latency_p50_ms for r in (run_plan(plan, 900) for _ in range(args.runs)) if r.ok]
        confirmed = _confirmed_value(verdict, trial.number, opened.study)
        median = stats.median(again)
        print(f"\n2. search ({args.trials} trials, space {args.space}), confirm ({args.rounds} rounds), export, "
              f"re-measure ({len(again)} fresh runs of the exported file)\n")
        print(f"verdict: {verdict['message']}\n")
        print("| exported | confirmed p50 ms | re-measured median p50 ms | min-max | difference | within 5% |")
        print("|---|---|---|---|---|---|")
        diff = median / confirmed - 1
        print(f"| trial {trial.number}: {trial.user_attrs.get('config')} | {confirmed:.1f} | {median:.1f} | "
              f"{min(again):.1f}-{max(again):.1f} | {diff:+.1%} | {'yes' if abs(diff) <= 0.05 else 'no'} |")


def _confirmed_value(verdict: dict, number: int, found: optuna.Study) -> float:
    """The median the confirmation rounds measured for the exported trial."""
    row = next((r for r in verdict["candidates"] if r["trial"] == number), None)
    if row:
        return float(row["median"])
    if number == verdict["baseline_trial"] and verdict.get("baseline_median"):
        return float(verdict["baseline_median"])
    return float(found.get_trials()[number].user_attrs["latency_p50_ms"])


def _line(event: loop.TrialEvent) -> str:
    outcome = event.outcome
    value = f"{outcome.values[0]:.1f} ms" if outcome.values else outcome.state.name.lower()
    return f"trial {event.number}: {value} ({event.config.describe()})"


if __name__ == "__main__":
    main()
