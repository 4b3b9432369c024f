"""Which sampler finds the best configuration in the fewest trials? A tabular benchmark, as HPO
research uses them: every configuration of a reduced but realistic space is measured once, with
replicates, and stored as a table; samplers are then replayed against the table, each noisy
observation a recorded replicate drawn at random.

    .venv/bin/python benchmarks/sampler_replay.py collect   # measure the table: about 25 minutes here
    .venv/bin/python benchmarks/sampler_replay.py replay    # replay the samplers: about 15 minutes
    .venv/bin/python benchmarks/sampler_replay.py replay --samplers GPSampler   # over 10 minutes a GPSampler row
    .venv/bin/python benchmarks/sampler_replay.py collect --quick   # 8 configurations, into a temporary folder
    .venv/bin/python benchmarks/sampler_replay.py replay --quick    # two samplers, 3 seeds, the committed table

`collect` measures `benchmarks/data/replay_space.yaml` (72 configurations on 2 cores) for resnet18
at batch 1, `--replicates` fresh processes each, in passes over a shuffled order (a replicate of
every configuration, then the next), and writes `benchmarks/data/sampler_replay_resnet18.json`
(OUT/sampler_replay_resnet18.json with --out) after every configuration (an interrupted collection
resumes). `collect --quick` measures 8 configurations once, with short windows, into a temporary
folder (or OUT), never into benchmarks/data. Each replicate records its p50, its
wall time, and the p50 of the first quarter of its window (what a 4x shorter replicate would have
seen), so that the replay can also price a shorter first replicate.

`replay` runs each sampler `--seeds` times for `--trials` trials through autotune's own proposal
path (`proposals.Proposer`: distinct configurations only, recipes first where the variant has
them) and reports, per sampler, the median and IQR of the trials needed until the incumbent (the
configuration with the best observed value so far) is truly within 3% of the table's optimum
(its true value: the median of its recorded replicates), and the regret (incumbent's true value
over the optimum, minus 1) after 10, 25 and 50 trials. Trials that never get there count as
"never" and make the median "never" when they are half or more. Its tables go to OUT/sampler_replay.md
and stdout; `replay --quick` replays the default sampler and random for 3 seeds of 20 trials.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from autotune.base import thresholds
from autotune.child.settings import MeasureSettings
from autotune.config import recipes, space, space_fit
from autotune.config.knobs import KNOBS, Config
from autotune.host import machine
from autotune.measure import requests
from autotune.measure.results import RunResult
from autotune.measure.runner import run_plan
from autotune.measure.stats import median
from autotune.search import opening, proposals, pruning
from autotune.study import storage

from lib import common

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
SPACE = DATA / "replay_space.yaml"
SHORT = 0.25  # the short fidelity: the first quarter of a replicate's window
SHORT_MARGIN = 0.10  # a short first replicate prunes when this much worse than the best trial's worst
BUSY_RETRIES = 3  # a replicate taken while other processes used the CPUs is taken again
QUICK_CONFIGURATIONS = 8
QUICK_SAMPLERS = ["experts first, then TPE as configured", "random"]


def table_path(folder: Path, model: str) -> Path:
    return folder / f"sampler_replay_{model}.json"


def replay_space(cores: int) -> space.SearchSpace:
    return space_fit.adapt(space.load(SPACE), cores, {})


def collect(args: argparse.Namespace) -> None:
    here = machine.this_machine()
    configs = replay_space(len(here.topology.usable_cores)).configurations()
    assert configs is not None
    path = table_path(args.out, args.model)
    table = json.loads(path.read_text()) if path.exists() else {
        "model": args.model, "batch_size": 1, "space": str(SPACE.relative_to(HERE.parent)),
        "measure": vars(MeasureSettings(warmup_s=args.warmup_time, duration_s=args.duration)),
        "machine": machine.fingerprint(here), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "configs": {}}
    for entry in table["configs"].values():  # a replicate another process disturbed is measured again
        entry["replicates"] = [r for r in entry["replicates"] if r["other_cpu_share"] <= thresholds.BUSY_MACHINE]
    order = list(configs)
    random.Random(args.seed).shuffle(order)
    order = order[:QUICK_CONFIGURATIONS] if args.quick else order
    measure = MeasureSettings(warmup_s=args.warmup_time, duration_s=args.duration)
    for rep in range(args.replicates):
        for number, config in enumerate(order):
            entry = table["configs"].setdefault(config.describe(), {"knobs": dict(config.values), "replicates": []})
            if len(entry["replicates"]) > rep or entry.get("failed"):
                continue
            request = requests.BenchRequest(model=args.model, config=config, measure=measure,
                                            cache_dir=Path(args.cache_dir))
            run = run_plan(requests.make_plan(request, here), args.timeout)
            for _ in range(BUSY_RETRIES):
                if not run.ok or run.noise.get("other_cpu_share", 0.0) <= thresholds.BUSY_MACHINE:
                    break
                run = run_plan(requests.make_plan(request, here), args.timeout)
            if not run.ok:
                entry["failed"] = run.reason
            else:
                entry["replicates"].append(replicate(run))
            common.say(f"pass {rep + 1}/{args.replicates} {number + 1}/{len(order)} {config.describe()}: "
                       f"{entry['replicates'][-1]['p50_ms'] if run.ok else run.reason}")
            table["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(table, indent=1))
            tmp.replace(path)


def replicate(run: RunResult) -> dict[str, Any]:
    """What the replay needs of one fresh process."""
    [instance] = run.instances
    samples = list(instance.metrics["latencies_ms"])
    short = samples[: max(1, int(len(samples) * SHORT))]
    setup = instance.metrics.get("setup", {})
    return {"p50_ms": round(run.latency_p50_ms, 4), "short_p50_ms": round(median(short), 4),
            "samples": len(samples), "wall_s": round(run.wall_s, 3), "window_s": round(instance.metrics["window_s"], 3),
            "compile_s": round(float(setup.get("compile_s", setup.get("trace_s", 0.0))), 3),
            "other_cpu_share": run.noise.get("other_cpu_share", 0.0)}


WITHIN = 0.03  # "found": the incumbent's true value within 3% of the optimum
CHECKPOINTS = (10, 25, 50)


class Table:
    """The measured configurations: their replicates, true values and the optimum."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.cores = int(raw["machine"]["usable_physical_cores"])
        self.space = replay_space(self.cores)
        self.replicates = {key: [r["p50_ms"] for r in entry["replicates"]]
                           for key, entry in raw["configs"].items() if entry["replicates"] and not entry.get("failed")}
        self.truth = {key: median(values) for key, values in self.replicates.items()}
        self.optimum = min(self.truth.values())

    def key(self, config: Config) -> str:
        """A recipe sets fewer knobs than the table's configurations: the rest are at their defaults
        (threads: all the cores), as when the recipe runs."""
        values = dict(config.values)
        full = {}
        for rng in self.space.knobs:
            default = KNOBS[rng.name].default
            full[rng.name] = values.get(rng.name, self.cores if default is None else default)
        return Config.from_mapping(full).describe()

    def observe(self, config: Config, rng: random.Random) -> float:
        """A noisy observation: one recorded replicate at random (a failed configuration: inf)."""
        values = self.replicates.get(self.key(config))
        return rng.choice(values) if values else math.inf

    def true(self, config: Config) -> float:
        return self.truth.get(self.key(config), math.inf)


def machine_recipes(table: Table) -> tuple[recipes.Recipe, ...]:
    """The recipes a latency search on this machine (the table's) runs, fitted to the replay space;
    with its defaults filled in, a recipe is one of the table's configurations."""
    kept, _ = recipes.fitting(recipes.recipes(machine.this_machine().topology, "latency"), table.space)
    return kept


Sampler = Callable[[int | None], optuna.samplers.BaseSampler]
SAMPLERS: dict[str, tuple[Sampler, bool, int]] = {
    # name: (sampler for a seed, recipes first, trials proposed at a time)
    "TPE as configured (multivariate, group, 8 startup)": (opening.sampler, False, 1),
    "TPE, Optuna defaults": (lambda seed: optuna.samplers.TPESampler(seed=seed), False, 1),
    "GPSampler": (lambda seed: optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False), False, 1),
    "random": (lambda seed: optuna.samplers.RandomSampler(seed=seed), False, 1),
    "grid order": (lambda seed: optuna.samplers.RandomSampler(seed=seed), False, 1),  # replaced below
    "experts first, then TPE as configured": (opening.sampler, True, 1),
    "experts first, then TPE with 4 startup": (lambda seed: optuna.samplers.TPESampler(
        multivariate=True, group=True, n_startup_trials=4, seed=seed), True, 1),
    "experts first, then GPSampler": (lambda seed: optuna.samplers.GPSampler(
        seed=seed, warn_independent_sampling=False), True, 1),
    # Two trials claimed at a time, so that their processes could build side by side: the second
    # proposed before the first's result, the first's configuration excluded (as a fleet's workers
    # propose); with the constant liar, TPE also counts the running trial as bad. The search does
    # not do this: benchmarks/RESULTS.md ("Which sampler", "Trials in pairs, replayed") says why.
    "experts first, then TPE as configured, two at a time": (opening.sampler, True, 2),
    "experts first, then TPE as configured, two at a time, constant liar": (
        lambda seed: opening.sampler(seed, constant_liar=True), True, 2),
}


def replay_once(table: Table, name: str, seed: int, trials: int) -> list[float]:
    """One replay: the incumbent's true value after each trial."""
    make, experts, at_a_time = SAMPLERS[name]
    rng = random.Random(seed)
    with storage.quiet_optuna():
        study = optuna.create_study(sampler=make(seed))
    proposer = proposals.Proposer(table.space, (1,), make, machine_recipes(table) if experts else (), seed)
    order = table.space.configurations() or []
    measured: set[proposals.Identity] = set()
    best_seen, incumbent = math.inf, math.inf
    curve: list[float] = []
    total = min(trials, len(order))
    while len(curve) < total:
        claimed: list[tuple[optuna.Trial, Config]] = []
        for _ in range(min(at_a_time, total - len(curve))):
            if name == "grid order":
                config = order[len(curve)]
                proposal: proposals.Proposal | None = proposals.Proposal(config, 1, table.space.params(config))
            else:
                proposal = proposer.next(study, study.get_trials(deepcopy=False), measured)
            if proposal is None:
                break
            claimed.append(start_trial(study, table, proposal, measured))
        if not claimed:
            break
        for trial, config in claimed:
            value = table.observe(config, rng)
            if math.isinf(value):
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, value)
            if value < best_seen:
                best_seen, incumbent = value, table.true(config)
            curve.append(incumbent)
    return curve


def start_trial(study: optuna.Study, table: Table, proposal: proposals.Proposal,
                measured: set[proposals.Identity]) -> tuple[optuna.Trial, Config]:
    """The proposal as a trial, the way the search starts one: enqueue its parameters, ask, sample."""
    with storage.quiet_optuna():
        study.enqueue_trial(proposal.params)
        trial = study.ask()
    measured.add(proposal.identity)
    return trial, table.space.sample(trial, only=proposal.config if proposal.recipe else None)


def trials_to_target(curve: list[float], optimum: float) -> float:
    return next((i + 1 for i, v in enumerate(curve) if v <= optimum * (1 + WITHIN)), math.inf)


def regret(curve: list[float], optimum: float, after: int) -> float:
    return curve[min(after, len(curve)) - 1] / optimum - 1


def replay(args: argparse.Namespace) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    table = Table(json.loads(args.table.read_text()))
    found = common.provenance(args.out)
    lines = [common.provenance_line(found), "", *samplers(args, table), "", *fidelity(args, table)]
    common.write_table(args.out, "sampler_replay", lines)


def samplers(args: argparse.Namespace, table: Table) -> list[str]:
    """Each sampler's trials to within 3% of the optimum and its regret after 10, 25 and 50 trials."""
    grid = len(table.replicates)
    lines = [f"{args.model} at batch 1, {grid} configurations measured ({table.raw['space']}), optimum "
             f"{table.optimum:.2f} ms p50; {args.seeds} seeds x {args.trials} trials per sampler; "
             f"target: within {WITHIN:.0%} of the optimum in {grid // 4} trials (25% of the grid) or fewer", "",
             "| sampler | trials to within 3%: median | IQR | never | regret @10 | @25 | @50 |",
             "|---|---|---|---|---|---|---|"]
    for name in args.samplers:
        curves = [replay_once(table, name, seed, args.trials) for seed in range(args.seeds)]
        hits = sorted(trials_to_target(c, table.optimum) for c in curves)
        regrets = [[regret(c, table.optimum, k) for c in curves] for k in CHECKPOINTS]
        never = sum(math.isinf(h) for h in hits)
        lines.append(f"| {name} | {_trials(rank(hits, 0.5))} | {_trials(rank(hits, 0.25))}-"
                     f"{_trials(rank(hits, 0.75))} | {never}/{len(hits)} | "
                     + " | ".join(f"{median(r):.1%}" for r in regrets) + " |")
        common.say(lines[-1])
    return lines


def fidelity(args: argparse.Namespace, table: Table) -> list[str]:
    """Does a 4x shorter first replicate, pruned from when clearly worse, save time without losing
    winners? And a warmed process that gives up after its first window, or its second? Every
    variant runs the default sampler (experts first, then TPE) over the same seeds and pays each
    replicate's recorded wall time; the short one pays a quarter of its window, one that gave up
    the windows it measured."""
    lines = [f"Multi-fidelity, {args.seeds} seeds: wall seconds until the incumbent is within {WITHIN:.0%} of "
             "the optimum (recorded replicate costs), and how often a configuration within 3% was pruned", "",
             "| first replicate | seconds to within 3%: median | IQR | never | near-optimal pruned "
             "| seconds per trial |", "|---|---|---|---|---|---|"]
    labels = {"full": f"fresh processes, full (pruned from the 2nd replicate, {thresholds.MARGIN:.0%})",
              "short": f"fresh processes, the 1st short ({SHORT:.0%} of the window, pruned when {SHORT_MARGIN:.0%} "
                       "worse)",
              "warm": "one warmed process, 3 windows (no pruning)",
              "give-up-first": f"one warmed process, stopped after its 1st window when more than "
                               f"{thresholds.GIVE_UP[0]:g}x worse than the best trial",
              "give-up": f"one warmed process, stopped after its 1st window when more than {thresholds.GIVE_UP[0]:g}x "
                         f"worse than the best trial, after its 2nd when more than {thresholds.GIVE_UP[1]:g}x "
                         "(the default)"}
    for mode, label in labels.items():
        runs = [costed_replay(table, seed, args.trials, mode) for seed in range(args.seeds)]
        costs = sorted(r[0] for r in runs)
        lines.append(f"| {label} | {_seconds(rank(costs, 0.5))} | {_seconds(rank(costs, 0.25))}-"
                     f"{_seconds(rank(costs, 0.75))} | {sum(math.isinf(c) for c in costs)}/{len(costs)} | "
                     f"{sum(r[1] for r in runs)}/{len(runs)} | {median([r[2] for r in runs]):.1f} |")
        common.say(lines[-1])
    return lines


def costed_replay(table: Table, seed: int, trials: int, mode: str) -> tuple[float, bool, float]:
    """(seconds until within 3% or inf, whether a near-optimal configuration was pruned by the short
    screen, mean seconds per trial) for the default sampler, replicates drawn in random order."""
    rng = random.Random(seed)
    with storage.quiet_optuna():
        study = optuna.create_study(sampler=opening.sampler(seed))
    proposer = proposals.Proposer(table.space, (1,), opening.sampler, machine_recipes(table), seed)
    measured: set[proposals.Identity] = set()
    best: list[float] = []
    best_seen, spent, reached, lost, count = math.inf, 0.0, math.inf, False, 0
    for _ in range(trials):
        proposal = proposer.next(study, study.get_trials(deepcopy=False), measured)
        if proposal is None:
            break
        trial, config = start_trial(study, table, proposal, measured)
        count += 1
        reps = list(table.raw["configs"].get(table.key(config), {}).get("replicates", []))
        if not reps:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        rng.shuffle(reps)
        cost, values, pruned = _replicates(reps, best, mode)
        spent += cost
        lost = lost or (pruned and table.true(config) <= table.optimum * (1 + WITHIN))
        value = median(values)
        study.tell(trial, value)
        if not pruned and value < best_seen:
            best_seen, best = value, values
            if table.true(config) <= table.optimum * (1 + WITHIN) and math.isinf(reached):
                reached = spent
    return reached, lost, spent / max(count, 1)


def _replicates(reps: list[dict[str, Any]], best: list[float], mode: str) -> tuple[float, list[float], bool]:
    """(seconds, values, pruned) of one trial under autotune's replicate rule in a mode; the
    recorded replicates are reused in turn (a fourth draws the first). Warm: one process pays its
    start once and then two more windows; fresh replicates' values stand in for its windows. Give-up:
    warm, stopped after the k-th window (paying the first process and k - 1 more windows) when the
    median of the values so far is more than thresholds.GIVE_UP[k-1] times the best trial's (fresh
    values stand in for windows, which agree better within a process; "give-up-first" checks after
    the first window only)."""
    def full(i: int) -> tuple[float, float]:
        r = reps[i % len(reps)]
        return r["wall_s"], r["p50_ms"]

    cost, values = 0.0, []
    if mode in ("warm", "give-up", "give-up-first"):
        values = [full(i)[1] for i in range(3)]
        margins = {"warm": (), "give-up-first": thresholds.GIVE_UP[:1], "give-up": thresholds.GIVE_UP}[mode]
        for seen, margin in enumerate(margins[:2], start=1):
            if best and median(values[:seen]) > margin * median(best):
                return reps[0]["wall_s"] + (seen - 1) * reps[0]["window_s"], values[:seen], True
        return reps[0]["wall_s"] + 2 * reps[0]["window_s"], values, False
    if mode == "short":
        first = reps[0]
        cost += first["wall_s"] - (1 - SHORT) * first["window_s"]
        if best and first["short_p50_ms"] > max(best) * (1 + SHORT_MARGIN):
            return cost, [first["short_p50_ms"]], True
        for i in (1, 2):
            seconds, value = full(i)
            cost, values = cost + seconds, [*values, value]
        return cost, values, False
    for i in (0, 1):
        seconds, value = full(i)
        cost, values = cost + seconds, [*values, value]
    if best and pruning.separated(values, best, "latency_p50_ms"):
        return cost, values, True
    seconds, value = full(2)
    return cost + seconds, [*values, value], False


def _seconds(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.0f}"


def rank(ordered: list[float], q: float) -> float:
    """The q-quantile as an order statistic (nearest rank): defined when some values are "never"."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _trials(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:g}"


def main() -> int:
    args = parse()
    if args.command == "collect":
        collect(args)
    else:
        replay(args)
    return 0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="measure every configuration of the replay space")
    common.add_out_and_quick(c, f"{QUICK_CONFIGURATIONS} configurations, one replicate each, short windows")
    c.add_argument("--model", default="resnet18")
    c.add_argument("--replicates", type=int, help="fresh processes per configuration (default 3)")
    c.add_argument("--duration", type=float, help="timed seconds per process (default 1)")
    c.add_argument("--warmup-time", type=float, help="untimed warmup seconds (default 0.5)")
    c.add_argument("--timeout", type=float, default=600)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--cache-dir", default="/tmp/autotune-replay-cache")
    r = sub.add_parser("replay", help="replay the samplers against the table")
    common.add_out_and_quick(r, f"{', '.join(QUICK_SAMPLERS)}; 3 seeds of 20 trials")
    r.add_argument("--model", default="resnet18")
    r.add_argument("--table", type=Path,
                   help="the table collect wrote (default benchmarks/data/sampler_replay_MODEL.json)")
    r.add_argument("--seeds", type=int, help="replays per sampler (default 20)")
    r.add_argument("--trials", type=int, help="trials per replay (default 50)")
    r.add_argument("--samplers", nargs="*", choices=list(SAMPLERS), help="only these (default: all)")
    args = p.parse_args()
    if args.command == "collect":
        common.fill(args, {"replicates": 3, "duration": 1.0, "warmup_time": 0.5},
                    {"replicates": 1, "duration": 0.3, "warmup_time": 0.2})
        args.out = DATA if args.out is None and not args.quick else common.out_folder(args.out, "autotune-replay-")
    else:
        common.fill(args, {"seeds": 20, "trials": 50, "samplers": list(SAMPLERS)},
                    {"seeds": 3, "trials": 20, "samplers": QUICK_SAMPLERS})
        args.table = args.table or table_path(DATA, args.model)
        args.out = common.out_folder(args.out, "autotune-replay-")
    return args


if __name__ == "__main__":
    sys.exit(main())
