"""PyTorch's defaults vs the best the tuner finds with the seed's knobs alone vs with all knobs.

For resnext101: batch size 1 latency and batch size 8 throughput. Four searches (seed space and
default space, each objective), then the three contenders of each setting re-measured side by
side in interleaved rounds (fresh processes, a random balanced order), speedups paired by round with
an order-statistic interval labelled with its real coverage. The searches' own numbers are not
reused: only the final interleaved rounds are printed.

    .venv/bin/python benchmarks/beyond_seed.py                  # about 40 minutes on 2 cores
    .venv/bin/python benchmarks/beyond_seed.py --trials 6 --rounds 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from autotune.child.settings import MeasureSettings
from autotune.config import space
from autotune.host import machine
from autotune.measure import stats
from autotune.measure.objectives import metric_of
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import ReplicatePolicy
from autotune.measure.runner import run_series
from autotune.search import loop, opening
from autotune.search.rounds import Contender, interleave, paired
from autotune.study import records

SETTINGS = [("latency", 1), ("throughput", 8)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnext101")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    here = machine.this_machine()
    rows = []
    with tempfile.TemporaryDirectory(prefix="autotune-beyond-") as tmp:
        for objective, batch in SETTINGS:
            measure = MeasureSettings(min_iterations=10 if batch == 1 else 5)
            found = {name: best_of(args, here, objective, batch, name, measure, Path(tmp))
                     for name in ("seed", "default")}
            rows += side_by_side(args, objective, batch, found)
    print(f"\n{args.model}: PyTorch defaults vs the tuner's best, {args.rounds} interleaved rounds per setting "
          f"(searches of {args.trials} trials each)\n")
    print("| setting | contender | knobs | median p50 ms | median items/s | speedup vs defaults (interval) | p |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)


def best_of(args: argparse.Namespace, here: machine.Machine, objective: str, batch: int, space_name: str,
            measure: MeasureSettings, folder: Path) -> tuple[LaunchPlan, LaunchPlan, str]:
    """Search one space; return (baseline plan, best plan, best knobs)."""
    request = opening.SearchRequest(model=args.model, trials=args.trials, space=space.find(space_name),
                                  objective=objective, batch_size=batch, studies_dir=folder,
                                  study=f"{space_name}-{objective}", measure=measure,
                                  replicates=ReplicatePolicy(replicates=2, timeout_s=args.timeout), seed=0)
    opened = opening.open_search(request, here)
    loop.run_search(opened, here, lambda e: progress(space_name, objective, e))
    base = records.baseline(opened.study)
    best = records.best_trials(opened.study)[0]
    assert base is not None
    return (LaunchPlan.from_json(base.user_attrs["plan"]), LaunchPlan.from_json(best.user_attrs["plan"]),
            str(best.user_attrs.get("config")))


def progress(space_name: str, objective: str, event: loop.TrialEvent) -> None:
    if event.kind == "done":
        o = event.outcome
        value = f"{o.values[0]:.2f}" if o.values else f"{o.state.name.lower()}: {o.reason[:80]}"
        print(f"[{space_name}/{objective}] trial {event.number}: {value} ({event.config.describe()})", file=sys.stderr)


def side_by_side(args: argparse.Namespace, objective: str, batch: int,
                 found: dict[str, tuple[LaunchPlan, LaunchPlan, str]]) -> list[str]:
    defaults = Contender("PyTorch defaults", found["default"][0])
    seed = Contender("best, seed knobs", found["seed"][1])
    everything = Contender("best, all knobs", found["default"][1])
    metric = metric_of(objective)
    contenders = [defaults, seed, everything]
    measured = interleave(contenders, args.rounds, metric, args.timeout, run_series,
                                  lambda e: print(f"round {e.round + 1}: {e.contender.label}: "
                                                  f"{'ok' if e.result.ok else e.result.reason}", file=sys.stderr))
    knobs = ["defaults", found["seed"][2], found["default"][2]]
    setting = f"batch {batch}, {objective}"
    rows = []
    for position, contender in enumerate(contenders):
        values = measured.values(position)
        ran = [v for v in values if v is not None]
        if len(ran) < len(values):
            reason = next(r.reason for r in measured.runs[position] if r.value is None)
            rows.append(f"| {setting} | {contender.label} | {knobs[position]} | failed: {reason[:80]} | | | |")
            continue
        result = paired(measured.values(0), values, metric, 0.0)
        p50 = stats.median(ran) if metric == "latency_p50_ms" else None
        ips = stats.median(ran) if metric != "latency_p50_ms" else None
        speed = f"{result.speedup:.2f}x ({result.interval.describe(2)})" if result else "-"
        p_value = f"{result.p_value:.3g}" if result and position else "-"
        rows.append(f"| {setting} | {contender.label} | {knobs[position]} | {_f(p50)} | {_f(ips)} | {speed} "
                    f"| {p_value} |")
    return rows


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
