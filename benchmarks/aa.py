"""How often does a verdict lie? A/A comparisons (a configuration against itself) give the false-win
rate; A/B comparisons against a variant doing about 10% more work give the detection rate.

Each comparison is what `autotune compare` does: two contenders, each its own series of fresh
processes, in interleaved rounds of a random balanced order; a one-sided Wilcoxon signed-rank test
on the per-round ratios at alpha 0.05, once with no minimum effect (the strictest reading) and
once with the default minimum effect that `confirm` uses. Rates come with exact (Clopper-Pearson)
95% intervals. The A/B variant is the same model fed 3x235x235 images instead of 3x224x224
(10.1% more pixels, so about 10% more convolution work).

A confirmation builds two runs at a time and measures each alone (`runner.run_series`; a
child built beside another records how long it waited, `held_s`), so the A/A pairs also say
whether the run that waited its turn measures differently from the one measured right after
building (the median ratio of the second's latency to the first's, its order-statistic interval
and a two-sided Wilcoxon p); `--one-by-one` runs them the old way, each process started after the
last ended.

The table goes to OUT/aa.md and stdout, each comparison's line to OUT/aa.json. 20 A/A and 10 A/B
comparisons of 6 rounds take about 20 minutes on 2 cores; 60 A/A, enough to show a false-win rate
under 5%, about 50; --quick (2 A/A, 1 A/B, 0.3 s windows) is meant to take minutes.

    .venv/bin/python benchmarks/aa.py                       # 20 A/A + 10 A/B, 6 rounds each
    .venv/bin/python benchmarks/aa.py --aa 40 --ab 20 --rounds 10
    .venv/bin/python benchmarks/aa.py --quick
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from scipy import stats as scipy_stats

from autotune.base.thresholds import ALPHA, MIN_EFFECT
from autotune.child.settings import MeasureSettings
from autotune.config.knobs import Config
from autotune.host import machine
from autotune.measure import requests, stats
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import SeriesRunner, one_by_one
from autotune.measure.results import RunResult
from autotune.measure.runner import run_plan, run_series
from autotune.measure.stats import PairedComparison, median
from autotune.search import compare, rounds
from autotune.search.rounds import Contender

from lib import common

HEAVIER = "3x235x235"  # (235/224)^2 = 1.101: about 10% more work per image
FULL = {"aa": 20, "ab": 10, "duration": 0.5}
QUICK = {"aa": 2, "ab": 1, "duration": 0.3}


def main() -> int:
    args = parse()
    runner = one_by_one(run_plan) if args.one_by_one else run_series
    here = machine.this_machine()
    measure = MeasureSettings(warmup=3, warmup_s=0.3, duration_s=args.duration, min_iterations=10)
    normal = plan_for(args.model, None, measure, here)
    heavier = plan_for(args.model, HEAVIER, measure, here)
    waited: list[float] = []
    aa = series(args, runner, "A/A", Contender("A", normal), Contender("A'", normal), args.aa, 0, waited)
    ab = series(args, runner, "A/B", Contender("10% more work", heavier), Contender("A", normal), args.ab, args.aa, [])
    how = "each process after the last" if args.one_by_one else "two built at a time, each measured alone"
    found = common.provenance(args.out)
    common.write_json(args.out, "aa", {**found, "aa": [describe(r) for r in aa], "ab": [describe(r) for r in ab],
                                       "waited": waited})
    lines = [f"{args.model} batch 1, {args.rounds} interleaved rounds per comparison ({how}), {args.duration:g} s "
             f"timed per run; one-sided Wilcoxon at alpha {ALPHA}", "", common.provenance_line(found), "",
             "| experiment | comparisons | significant, min effect 0 | significant, min effect "
             f"{MIN_EFFECT:.0%} | median speedup (min-max) |", "|---|---|---|---|---|",
             row("A/A (false wins)", aa), row("A/B 10% more work (detected)", ab), "", position_effect(waited)]
    common.write_table(args.out, "aa", lines)
    return 0


def parse() -> argparse.Namespace:
    p = common.parser(__doc__, f"{QUICK['aa']} A/A and {QUICK['ab']} A/B comparisons, {QUICK['duration']} s windows")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--aa", type=int, help=f"A/A comparisons (default {FULL['aa']})")
    p.add_argument("--ab", type=int, help=f"A/B comparisons (default {FULL['ab']})")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--duration", type=float, help=f"timed seconds per run (default {FULL['duration']})")
    p.add_argument("--seed", type=int, default=0, help="first order seed; comparison k uses seed + k")
    p.add_argument("--one-by-one", action="store_true", help="start each process after the last ended")
    args = p.parse_args()
    common.fill(args, FULL, QUICK)
    args.out = common.out_folder(args.out, "autotune-aa-")
    return args


def describe(result: tuple[PairedComparison, PairedComparison] | None) -> str:
    """A comparison as its line says it (the strict reading), or why there is none."""
    return result[0].describe() if result else "a run failed"


def plan_for(model: str, shape: str | None, measure: MeasureSettings, here: machine.Machine) -> LaunchPlan:
    request = requests.BenchRequest(model=model, config=Config(), measure=measure, input_shape=shape)
    return requests.make_plan(request, here)


def series(args: argparse.Namespace, runner: SeriesRunner, name: str, first: Contender, second: Contender,
           count: int, seed_offset: int, waited: list[float]) -> list[tuple[PairedComparison, PairedComparison] | None]:
    """`count` comparisons of second vs first: (no minimum effect, default minimum effect), or None
    when a run failed. `waited` gets each pair's latency of its second run over its first's."""
    out: list[tuple[PairedComparison, PairedComparison] | None] = []
    for k in range(count):
        events: list[rounds.RunEvent] = []
        measured = rounds.interleave([first, second], args.rounds, "latency_p50_ms", 600, runner,
                                      events.append, seed=args.seed + seed_offset + k)
        waited.extend(second_over_first([e.result for e in events]))
        strict = compare.compared(measured, "latency_p50_ms", 0.0)
        usual = compare.compared(measured, "latency_p50_ms", MIN_EFFECT)
        out.append((strict, usual) if strict and usual else None)
        shown = strict.describe() if strict else "a run failed"
        common.say(f"{name} {k + 1}/{count}: {shown}")
    return out


def row(name: str, results: Sequence[tuple[PairedComparison, PairedComparison] | None]) -> str:
    done = [r for r in results if r is not None]
    speedups = [strict.speedup for strict, _ in done]
    spread = f"{median(speedups):.3f}x ({min(speedups):.3f}-{max(speedups):.3f})" if speedups else "-"
    return (f"| {name} | {len(done)} of {len(results)} | {rate([s.significant for s, _ in done])} "
            f"| {rate([u.significant for _, u in done])} | {spread} |")


def second_over_first(ran: Sequence[RunResult]) -> list[float]:
    """Each pair built together (both held, in turn): the p50 of the one that waited for the
    other's window over the other's."""
    def held(result: RunResult) -> bool:
        return result.ok and all("held_s" in i.metrics.get("setup", {}) for i in result.instances)

    ratios, index = [], 0
    while index + 1 < len(ran):
        if held(ran[index]) and held(ran[index + 1]):
            ratios.append(ran[index + 1].latency_p50_ms / ran[index].latency_p50_ms)
            index += 2
        else:
            index += 1
    return ratios


def position_effect(ratios: Sequence[float]) -> str:
    """The A/A rounds' second run against their first: a line for benchmarks/RESULTS.md."""
    if len(ratios) < 2:
        return "position effect: too few A/A pairs built together"
    interval = stats.median_ci(sorted(ratios))
    p = scipy_stats.wilcoxon([r - 1.0 for r in ratios]).pvalue
    return (f"position effect, A/A pairs: the second run's p50 over the first's, median {median(ratios):.4f} "
            f"({interval.label} {interval.low:.4f}-{interval.high:.4f}), two-sided Wilcoxon p={p:.3g}, "
            f"{len(ratios)} pairs")


def rate(hits: Sequence[bool]) -> str:
    """k/n, the rate and its exact (Clopper-Pearson) 95% interval."""
    if not hits:
        return "-"
    k, n = sum(hits), len(hits)
    interval = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return f"{k}/{n} = {k / n:.0%} (95% CI {interval.low:.0%}-{interval.high:.0%})"


if __name__ == "__main__":
    sys.exit(main())
