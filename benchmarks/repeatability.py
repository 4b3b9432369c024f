"""How far can autotune's numbers be trusted on this machine?

1. Spread: the same configuration (PyTorch defaults) measured in N separate runs, each a fresh
   process with the standard in-process protocol.
2. Round trip: a short search, its confirmation, the export; then the exported configuration is
   planned again from the env file and re-measured in fresh runs. Reported: how far the
   re-measured median lands from the value confirmation stored (target: within 5%).

The search's study, compiled models and exported env file go to OUT/search, the two tables to
OUT/repeatability.md and stdout. How long the RESULTS.md run took (resnext101, 8 runs, 6 trials,
6 rounds) was not recorded: a resnext101 trial took about 16 s then. --quick (resnet18, 3 runs,
3 trials, 6 rounds, 0.5 s windows) is meant to take minutes.

    .venv/bin/python benchmarks/repeatability.py --trials 6 --runs 8 --rounds 6   # the RESULTS.md table
    .venv/bin/python benchmarks/repeatability.py --model resnet18 --trials 6 --runs 6
    .venv/bin/python benchmarks/repeatability.py --quick
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

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

from lib import common

FULL = {"model": common.MODEL, "runs": 10, "trials": 10, "rounds": 10}
QUICK = {"model": common.QUICK_MODEL, "runs": 3, "trials": 3, "rounds": 6}
QUICK_WINDOW = MeasureSettings(warmup_s=0.3, duration_s=0.5)


def main() -> int:
    args = parse()
    here = machine.this_machine()
    measure = QUICK_WINDOW if args.quick else MeasureSettings()
    found = common.provenance(args.out)
    tables = [common.provenance_line(found), "", *spread(args, here, measure), "", *round_trip(args, here, measure)]
    common.write_table(args.out, "repeatability", tables)
    return 0


def parse() -> argparse.Namespace:
    p = common.parser(__doc__, "resnet18, 3 runs, a 3-trial search confirmed in 6 rounds, 0.5 s windows")
    common.add_model(p)
    p.add_argument("--runs", type=int, help="fresh runs of the same configuration (default 10)")
    p.add_argument("--trials", type=int, help="trials of the search (default 10)")
    p.add_argument("--space", default="quick")
    p.add_argument("--rounds", type=int, help="confirmation rounds (default 10)")
    args = p.parse_args()
    common.fill(args, FULL, QUICK)
    args.out = common.out_folder(args.out, "autotune-repeatability-")
    return args


def spread(args: argparse.Namespace, here: machine.Machine, measure: MeasureSettings) -> list[str]:
    plan = requests.make_plan(requests.BenchRequest(model=args.model, config=Config(), measure=measure), here)
    p50s = []
    for number in range(args.runs):
        result = run_plan(plan, 900)
        if result.ok:
            p50s.append(result.latency_p50_ms)
            common.say(f"run {number + 1}/{args.runs}: p50 {result.latency_p50_ms:.1f} ms "
                       f"(other processes' CPU share {result.noise.get('other_cpu_share', 0):.0%})")
    interval = stats.median_ci(p50s)
    return [f"1. {plan.bench.model} batch 1, PyTorch defaults, {len(p50s)} separate runs "
            f"({measure.duration_s:g} s window each)", "",
            "| median p50 ms | min | max | max/min | IQR/median across runs | interval of the median |",
            "|---|---|---|---|---|---|",
            f"| {stats.median(p50s):.1f} | {min(p50s):.1f} | {max(p50s):.1f} | {max(p50s) / min(p50s):.2f} "
            f"| {stats.relative_iqr(p50s):.1%} | {interval.describe(1)} |"]


def round_trip(args: argparse.Namespace, here: machine.Machine, measure: MeasureSettings) -> list[str]:
    folder = args.out / "search"
    request = opening.SearchRequest(model=args.model, trials=args.trials, space=space.find(args.space),
                                    studies_dir=folder / "studies", cache_dir=folder / "studies" / "cache",
                                    measure=measure, replicates=ReplicatePolicy(replicates=3), seed=0)
    opened = opening.open_search(request, here)
    loop.run_search(opened, here, lambda e: common.say(_line(e)) if e.kind == "done" else None)
    verdict = confirm.confirm(opened.study, 3, args.rounds, 0.03, 900, lambda e: None)
    trial = export.pick_trial(opened.study, None)
    path = folder / "best.env"
    export.write(path, export.render(opened.study, trial))
    plan = requests.plan_from_exported(export.read(path).env, here, measure)
    again = [r.latency_p50_ms for r in (run_plan(plan, 900) for _ in range(args.runs)) if r.ok]
    confirmed = _confirmed_value(verdict, trial.number, opened.study)
    median = stats.median(again)
    diff = median / confirmed - 1
    return [f"2. search ({args.trials} trials, space {args.space}), confirm ({args.rounds} rounds), export, "
            f"re-measure ({len(again)} fresh runs of the exported file)", "",
            f"verdict: {verdict['message']}", "",
            "| exported | confirmed p50 ms | re-measured median p50 ms | min-max | difference | within 5% |",
            "|---|---|---|---|---|---|",
            f"| trial {trial.number}: {trial.user_attrs.get('config')} | {confirmed:.1f} | {median:.1f} | "
            f"{min(again):.1f}-{max(again):.1f} | {diff:+.1%} | {'yes' if abs(diff) <= 0.05 else 'no'} |"]


def _confirmed_value(verdict: dict[str, Any], number: int, found: optuna.Study) -> float:
    """The median the confirmation rounds measured for the exported trial."""
    row = next((r for r in verdict["candidates"] if r["trial"] == number), None)
    if row:
        return float(row["median"])
    if number == verdict["baseline_trial"] and verdict.get("baseline_median"):
        return float(verdict["baseline_median"])
    return float(found.get_trials()[number].user_attrs["latency_p50_ms"])


def _line(event: loop.TrialEvent) -> str:
    outcome = event.outcome
    if outcome is None:
        return f"trial {event.number}: ({event.config.describe()})"
    value = f"{outcome.values[0]:.1f} ms" if outcome.values else outcome.state.name.lower()
    return f"trial {event.number}: {value} ({event.config.describe()})"


if __name__ == "__main__":
    sys.exit(main())
