"""Should a fleet trial's objective be its raw metric or its speedup over its own host's baseline?

Measured with real torch (resnet18, batch 1, the real benchmark child, each measurement a fresh
process). Rounds alternate between two "hosts" on this one machine: a quiet one, and a slower one
made for real by a noisy neighbour (one busy-loop process pinned to each CPU the child uses, for
the whole round). Each round measures the baseline (PyTorch's defaults) and a few configurations,
in a seeded random order, so that every configuration has a baseline of its own host measured
beside it.

(a) One host class, noise only (quiet rounds): per configuration, the spread over rounds of the
    raw p50 latency and of its ratio to the round's baseline (coefficient of variation); and,
    for every pair of configurations measured in two different quiet rounds (as two hosts of one
    class would), how often raw and normalised order them against the truth (the order of their
    medians over all quiet rounds).
(b) Two hosts of different speed: configurations split across a quiet and a noisy round, every
    split: how often the raw and the normalised value pick the wrong winner.

    python benchmarks/host_normalised.py                     # about 5 minutes on 2 cores
    python benchmarks/host_normalised.py --rounds 4 --duration 0.5
    python benchmarks/host_normalised.py --from-log run.err  # the tables again from a run's round lines
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from autotune.child.settings import MeasureSettings
from autotune.config.knobs import Config
from autotune.host import machine
from autotune.measure import requests
from autotune.measure.plan import LaunchPlan
from autotune.measure.runner import run_plan
from autotune.measure.stats import median

CONFIGS = [["allocator=jemalloc"], ["memory_format=channels_last"], ["omp_threads=1"]]
HOSTS = ("quiet", "noisy")
Rounds = dict[str, list[dict[str, float]]]  # host -> rounds -> configuration (or "baseline") -> p50 ms


@contextmanager
def neighbour(cpus: Sequence[int]) -> Iterator[None]:
    """A busy loop pinned to each CPU for the block: the same machine, slower."""
    spinners = [subprocess.Popen(["taskset", "-c", str(cpu), "sh", "-c", "while :; do :; done"]) for cpu in cpus]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def measure_round(plans: dict[str, LaunchPlan], rng: random.Random) -> dict[str, float]:
    order = list(plans)
    rng.shuffle(order)
    values = {}
    for name in order:
        result = run_plan(plans[name], 300)
        if not result.ok:
            raise SystemExit(f"{name} failed: {result.reason}")
        values[name] = result.latency_p50_ms
    return values


def measure(plans: dict[str, LaunchPlan], rounds: int, seed: int) -> Rounds:
    rng, measured = random.Random(seed), {host: [] for host in HOSTS}
    cpus = sorted({cpu for plan in plans.values() for inst in plan.instances for cpu in inst.cpus})
    for number, host in itertools.product(range(rounds), HOSTS):
        with neighbour(cpus) if host == "noisy" else _quiet():
            measured[host].append(measure_round(plans, rng))
        print(f"round {number + 1} {host}: " + ", ".join(f"{k} {v:.2f}" for k, v in measured[host][-1].items()),
              file=sys.stderr, flush=True)
    return measured


@contextmanager
def _quiet() -> Iterator[None]:
    yield


def cv(values: Sequence[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values)


def value(row: dict[str, float], name: str, normalised: bool) -> float:
    return row[name] / row["baseline"] if normalised else row[name]


def pair_errors(first: list[dict[str, float]], second: list[dict[str, float]], names: list[str],
                truth: dict[str, float], normalised: bool) -> tuple[int, int]:
    """Pairs of configurations, one measured in a round of `first`, the other in a different round
    of `second`: (ordered against the truth, all)."""
    wrong = total = 0
    for a, b in itertools.permutations(names, 2):
        for i, j in itertools.product(range(len(first)), range(len(second))):
            if first is second and i == j:
                continue
            said = value(first[i], a, normalised) < value(second[j], b, normalised)
            wrong += said != (truth[a] < truth[b])
            total += 1
    return wrong, total


def winner_errors(measured: Rounds, names: list[str], truth: dict[str, float], normalised: bool,
                  hosts: tuple[str, str]) -> tuple[int, int]:
    """Every split of the configurations over two hosts (each host: one round, its own baseline):
    (wrong winner, splits)."""
    best = min(names, key=truth.__getitem__)
    wrong = total = 0
    for sides in itertools.product((0, 1), repeat=len(names)):
        if len(set(sides)) < 2:
            continue
        for i, j in itertools.product(range(len(measured[hosts[0]])), range(len(measured[hosts[1]]))):
            if hosts[0] == hosts[1] and i == j:
                continue
            rows = (measured[hosts[0]][i], measured[hosts[1]][j])
            picked = min(names, key=lambda n: value(rows[sides[names.index(n)]], n, normalised))
            wrong += picked != best
            total += 1
    return wrong, total


def rate(counts: tuple[int, int]) -> str:
    return f"{counts[0] / counts[1]:.1%} ({counts[0]}/{counts[1]})"


def report(measured: Rounds, names: list[str]) -> None:
    quiet = measured["quiet"]
    truth = {n: median([r[n] for r in quiet]) for n in names}
    print("\n(a) one host class, noise only: spread over the quiet rounds\n")
    print("| configuration | p50 ms (median) | CV raw | CV ratio to its round's baseline | slowdown noisy/quiet |")
    print("|---|---|---|---|---|")
    for n in ["baseline", *names]:
        ratio = "-" if n == "baseline" else f"{cv([value(r, n, True) for r in quiet]):.2%}"
        slow = median([r[n] for r in measured["noisy"]]) / median([r[n] for r in quiet])
        raw = [r[n] for r in quiet]
        print(f"| {n} | {median(raw):.2f} | {cv(raw):.2%} | {ratio} | {slow:.2f}x |")
    print("\n| comparison | raw: wrong | normalised: wrong |\n|---|---|---|")
    for label, hosts in (("pairs, two quiet rounds (one class)", ("quiet", "quiet")),
                         ("winner, split over two quiet rounds", ("quiet", "quiet")),
                         ("pairs, a quiet and a noisy round (two speeds)", ("quiet", "noisy")),
                         ("winner, split over a quiet and a noisy round", ("quiet", "noisy"))):
        if label.startswith("pairs"):
            raw = pair_errors(measured[hosts[0]], measured[hosts[1]], names, truth, False)
            norm = pair_errors(measured[hosts[0]], measured[hosts[1]], names, truth, True)
        else:
            raw = winner_errors(measured, names, truth, False, hosts)
            norm = winner_errors(measured, names, truth, True, hosts)
        print(f"| {label} | {rate(raw)} | {rate(norm)} |")


def from_log(path: Path) -> Rounds:
    """The rounds a run printed on stderr (`round N HOST: NAME MS, ...`); a cut-short run's too."""
    measured: Rounds = {host: [] for host in HOSTS}
    for line in path.read_text().splitlines():
        if line.startswith("round "):
            head, _, body = line.partition(": ")
            pairs = (item.rsplit(" ", 1) for item in body.split(", "))
            measured[head.split()[2]].append({name: float(ms) for name, ms in pairs})
    rounds = min(len(measured[host]) for host in HOSTS)
    return {host: measured[host][:rounds] for host in HOSTS}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--rounds", type=int, default=6, help="rounds per host (quiet and noisy alternate)")
    p.add_argument("--duration", type=float, default=1.0, help="timed seconds per process")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/autotune-host-normalised"))
    p.add_argument("--from-log", type=Path, help="report the rounds of an earlier run's stderr, measure nothing")
    args = p.parse_args()
    if args.from_log:
        measured = from_log(args.from_log)
        print(f"{args.from_log}: {len(measured['quiet'])} rounds per host")
        report(measured, [n for n in measured["quiet"][0] if n != "baseline"])
        return
    here = machine.this_machine()
    settings = MeasureSettings(warmup=3, warmup_s=0.3, duration_s=args.duration, min_iterations=10)
    plans = {(" ".join(c) or "baseline"): requests.make_plan(requests.BenchRequest(
        model=args.model, config=Config.from_assignments(c), measure=settings, cache_dir=args.cache_dir), here)
        for c in [[], *CONFIGS]}
    measured = measure(plans, args.rounds, args.seed)
    print(f"\n{args.model}, batch 1, {args.duration:g} s per fresh process, {args.rounds} rounds per host, "
          f"seed {args.seed}")
    report(measured, [n for n in plans if n != "baseline"])


if __name__ == "__main__":
    main()
