"""What a new user's search costs and finds: `autotune search` run exactly as the README says, in
an empty folder (no study, no compiled artifacts), timed from the outside, then the study's own
accounting and the confirmation's verdict, next to the best expert recipe the study ran. The
search gets a temporary folder of its own (TMPDIR) too: inductor keeps its precompiled headers
(about 11 s to build on the 2-CPU host) under the temporary folder whatever
TORCHINDUCTOR_CACHE_DIR says, so without it every run after a machine's first would find them.

The search runs in OUT/search (its log, its study under studies/ for a later look, its compiled
models under studies/cache: delete OUT when done); the table goes to OUT/search_cost.md and
stdout. Takes 17.8 min on the 2-core AVX-512 EPYC at batch 1 (50 trials with their confirmation),
32 min at batch 8 throughput; --quick (resnet18, 6 trials, the quick space, short windows) is meant
to take minutes.

    .venv/bin/python benchmarks/search_cost.py                                   # resnext101, bs1, 50 trials
    .venv/bin/python benchmarks/search_cost.py --objective throughput --batch-size 8
    .venv/bin/python benchmarks/search_cost.py --seed 1 --out /tmp/cost -- --time-budget 15m
    .venv/bin/python benchmarks/search_cost.py --quick
    .venv/bin/python benchmarks/search_cost.py --model resnet50 --after /tmp/cost     # a second study, warm
    .venv/bin/python benchmarks/search_cost.py --model resnet50 --after /tmp/cost -- --no-warm-start

With --again OUT nothing runs: the table of an earlier run in OUT is printed again, its breakdown
read by this checkout's rule from the study, whatever autotune recorded it (a "before" run of an
older commit, whose study has no breakdown of its own); its command, commit, host, date, exit code
and outside wall are the earlier table's.

    .venv/bin/python benchmarks/search_cost.py --model hf:bert --again /tmp/bert-before -- --seq-lens 32,128,384

With --after OUT the search runs in an earlier run's OUT/search folder, beside its study (and its
compiled artifacts), as a user's second study on the same host does: it starts warm from what won
there unless told --no-warm-start. The table gives where the wall time went (the study's own
breakdown), the confirmation's share, and the trial at which the recommended configuration was
first measured: warm against cold, that is what a warm start saves.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import optuna

from autotune.study import accounting, records, storage

from lib import common

QUICK_TRIALS = 6


def main() -> int:
    args = parse()
    if args.again:
        return again(args)
    folder = (args.after or args.out) / "search"
    folder.mkdir(exist_ok=True)
    before = set((folder / "studies").glob("*.db"))
    argv = ["search", "--model", args.model, "--trials", str(args.trials), "--objective", args.objective,
            "--batch-size", args.batch_size, "--confirm-rounds", str(args.confirm_rounds), "--seed", str(args.seed),
            *args.extra]
    start = time.monotonic()
    # beside an earlier run (--after), a log of its own: the earlier search's stays
    code = common.autotune(folder, *argv, log=f"search-{args.model}.log" if args.after else "search.log")
    wall = time.monotonic() - start
    [db] = sorted(set((folder / "studies").glob("*.db")) - before) or [max(
        (folder / "studies").glob("*.db"), key=lambda p: p.stat().st_mtime)]
    with storage.quiet_optuna():
        study = optuna.load_study(study_name=db.stem, storage=f"sqlite:///{db}")
    found = common.provenance_line(common.provenance(folder)).removeprefix("Command: ")
    common.write_table(args.out, "search_cost", report(args, found, study, wall, code))
    return 0


def again(args: argparse.Namespace) -> int:
    """An earlier run's table again (`--again`), its breakdown by this checkout's rule."""
    earlier = args.again / "search_cost.md"
    if not earlier.is_file():
        print(f"search_cost: no {earlier}: --again takes the OUT of an earlier search_cost run", file=sys.stderr)
        return 2
    text = earlier.read_text()
    wall = re.search(r"\| wall, search \+ confirmation \| ([0-9.]+) min \|", text)
    code = re.search(r"in an empty folder \(exit (-?[0-9]+)\)", text)
    said = next((line for line in text.splitlines() if line.startswith("Command: ")), None)
    if wall is None or code is None or said is None:
        print(f"search_cost: {earlier} is not a search_cost table (no wall, exit code or command line)",
              file=sys.stderr)
        return 2
    dbs = sorted((args.again / "search" / "studies").glob("*.db"), key=lambda p: p.stat().st_mtime)
    if not dbs:
        print(f"search_cost: no study under {args.again / 'search' / 'studies'}", file=sys.stderr)
        return 2
    with storage.quiet_optuna():
        study = optuna.load_study(study_name=dbs[-1].stem, storage=f"sqlite:///{dbs[-1]}")
    print(report(args, said.removeprefix("Command: "), study, float(wall.group(1)) * 60, int(code.group(1))), end="")
    return 0


def parse() -> argparse.Namespace:
    p = common.parser(__doc__, f"{common.QUICK_MODEL}, {QUICK_TRIALS} trials, the quick space, short windows, "
                      "one candidate confirmed in 5 rounds")
    common.add_model(p)
    p.add_argument("--trials", type=int, help=f"default 50 ({QUICK_TRIALS} with --quick)")
    p.add_argument("--objective", default="latency")
    p.add_argument("--batch-size", default="1")
    p.add_argument("--confirm-rounds", type=int, help=f"default 10 ({common.QUICK_CONFIRM_ROUNDS} with --quick)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--after", type=Path, help="run in an earlier run's OUT/search folder, beside its study")
    p.add_argument("--again", type=Path, help="run nothing: an earlier run's OUT table again, broken down by "
                                              "this checkout's rule (give its --model, --trials and flags)")
    p.add_argument("extra", nargs="*", help="more `autotune search` flags, after --")
    args = p.parse_args()
    common.fill(args, {"model": common.MODEL, "trials": 50, "confirm_rounds": 10},
                {"model": common.QUICK_MODEL, "trials": QUICK_TRIALS, "confirm_rounds": common.QUICK_CONFIRM_ROUNDS})
    args.extra = [*(common.QUICK_MEASURE if args.quick else ()), *args.extra]
    if not args.again:
        args.out = common.out_folder(args.out, "autotune-search-cost-")
    return args


def report(args: argparse.Namespace, found: str, study: optuna.Study, wall: float, code: int) -> str:
    """The table: `found`, the provenance line's text after "Command: "."""
    a = study.user_attrs.get("accounting", {})  # the study's own, over its searches' sessions
    verdict = study.user_attrs.get("confirmation", {})
    key = "speedup_throughput" if args.objective == "throughput" else "speedup_latency"
    trials = study.get_trials(deepcopy=False, states=records.FINISHED)
    recipes = [t for t in trials if t.user_attrs.get("recipe") and t.user_attrs.get(key)]
    best_recipe = max(recipes, key=lambda t: t.user_attrs[key], default=None)
    lines = [f"{args.model}, {args.objective}, batch {args.batch_size}: `autotune search --trials {args.trials} "
             f"--confirm-rounds {args.confirm_rounds} --seed {args.seed}{''.join(' ' + e for e in args.extra)}` "
             f"in an empty folder (exit {code})", "", f"Command: {found}", "",
             "| measure | value |", "|---|---|",
             f"| wall, search + confirmation | {wall / 60:.1f} min |",
             f"| wall, trials (study accounting) | {a.get('wall_s', 0) / 60:.1f} min |",
             f"| timed samples / trial wall | {a.get('efficiency', 0):.0%} ({a.get('timed_s', 0):.0f} s) |",
             f"| trials, distinct configurations | {a.get('trials')}, {a.get('distinct_configurations')} |",
             f"| trials per hour | {a.get('trials_per_hour', 0):.0f} |",
             f"| undecided attempts (noisy windows) | {a.get('undecided', 0)} |"]
    # by this checkout's rule, also for a study an older autotune recorded without a breakdown
    parts = accounting.breakdown(trials, float(a.get("wall_s", 0.0))) if a else {}
    if parts:
        lines.append("| trial wall: build and compile, warm-up, timed, undecided, the rest | "
                     + ", ".join(f"{parts.get(k, 0):.0f} s" for k in ("build_s", "warmup_s", "timed_s", "undecided_s",
                                                                       "other_s")) + " |")
    if verdict:
        lines.append(f"| confirmation | {verdict.get('wall_s', 0) / 60:.1f} min, stopped by "
                     f"{verdict.get('stopped_by')}, {verdict.get('noisy_reruns', 0)} noisy runs run again |")
    first = first_measured(study, verdict.get("recommended_trial"))
    warm = [t.number for t in trials if t.user_attrs.get("warm_start")]
    lines.append(f"| recommended configuration first measured at trial | {first} |")
    lines.append(f"| warm start | {'trials ' + ', '.join(map(str, warm)) if warm else 'cold'} |")
    if best_recipe is not None:
        lines.append(f"| best recipe in the search | {best_recipe.user_attrs['recipe']}: "
                     f"{best_recipe.user_attrs[key]:.2f}x (trial {best_recipe.number}, search measurement) |")
    lines.append(f"| confirmed winner | {verdict.get('message', 'no confirmation recorded')} |")
    return "\n".join(lines) + "\n"


def first_measured(study: optuna.Study, recommended: int | None) -> int | None:
    """The trial at which the recommended configuration was first measured (a duplicate's first)."""
    trials = study.get_trials(deepcopy=False)
    chosen = next((t for t in trials if t.number == recommended), None)
    if chosen is None:
        return None
    wanted = records.identity(chosen)
    return min(t.number for t in trials if "config" in t.user_attrs and records.identity(t) == wanted)


if __name__ == "__main__":
    sys.exit(main())
