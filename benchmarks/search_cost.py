"""What a new user's search costs and finds: `autotune search` run exactly as the README says, in
an empty folder (no study, no compiled artifacts), timed from the outside, then the study's own
accounting and the confirmation's verdict, next to the best expert recipe the study ran. The
search gets a temporary folder of its own (TMPDIR) too: inductor keeps its precompiled headers
(about 11 s to build on the 2-CPU host) under the temporary folder whatever
TORCHINDUCTOR_CACHE_DIR says, so without it every run after a machine's first would find them.

    .venv/bin/python benchmarks/search_cost.py                                   # resnext101, bs1, 50 trials
    .venv/bin/python benchmarks/search_cost.py --objective throughput --batch-size 8
    .venv/bin/python benchmarks/search_cost.py --model resnet18 --trials 10 --confirm-rounds 6
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

from autotune.study import records, storage

BIN = Path(sys.executable).parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnext101")
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--objective", default="latency")
    p.add_argument("--batch-size", default="1")
    p.add_argument("--confirm-rounds", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", type=Path, help="copy the study database here, to look into it afterwards")
    p.add_argument("extra", nargs="*", help="more `autotune search` flags, after --")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="autotune-search-cost-") as folder:
        command = [str(BIN / "autotune"), "search", "--model", args.model, "--trials", str(args.trials),
                   "--objective", args.objective, "--batch-size", args.batch_size,
                   "--confirm-rounds", str(args.confirm_rounds), "--seed", str(args.seed), *args.extra]
        print("$ " + " ".join(command[1:]), file=sys.stderr, flush=True)
        scratch = Path(folder, "tmp")
        scratch.mkdir()
        start = time.monotonic()
        done = subprocess.run(command, cwd=folder, check=False, env={**os.environ, "TMPDIR": str(scratch)})
        wall = time.monotonic() - start
        [db] = Path(folder, "studies").glob("*.db")
        if args.keep:
            shutil.copyfile(db, args.keep)
        with storage.quiet_optuna():
            study = optuna.load_study(study_name=db.stem, storage=f"sqlite:///{db}")
        report(args, study, wall, done.returncode)


def report(args: argparse.Namespace, study: optuna.Study, wall: float, code: int) -> None:
    accounting = study.user_attrs.get("accounting", {})
    verdict = study.user_attrs.get("confirmation", {})
    key = "speedup_throughput" if args.objective == "throughput" else "speedup_latency"
    trials = study.get_trials(deepcopy=False, states=records.FINISHED)
    recipes = [t for t in trials if t.user_attrs.get("recipe") and t.user_attrs.get(key)]
    best_recipe = max(recipes, key=lambda t: t.user_attrs[key], default=None)
    print(f"\n{args.model}, {args.objective}, batch {args.batch_size}: `autotune search --trials {args.trials} "
          f"--confirm-rounds {args.confirm_rounds} --seed {args.seed}{''.join(' ' + e for e in args.extra)}` in an "
          f"empty folder (exit {code})\n")
    print("| measure | value |")
    print("|---|---|")
    print(f"| wall, search + confirmation | {wall / 60:.1f} min |")
    print(f"| wall, trials (study accounting) | {accounting.get('wall_s', 0) / 60:.1f} min |")
    a = accounting
    print(f"| timed samples / trial wall | {a.get('efficiency', 0):.0%} ({a.get('timed_s', 0):.0f} s) |")
    print(f"| trials, distinct configurations | {a.get('trials')}, {a.get('distinct_configurations')} |")
    print(f"| trials per hour | {accounting.get('trials_per_hour', 0):.0f} |")
    if best_recipe is not None:
        print(f"| best recipe in the search | {best_recipe.user_attrs['recipe']}: {best_recipe.user_attrs[key]:.2f}x "
              f"(trial {best_recipe.number}, search measurement) |")
    print(f"| confirmed winner | {_winner(verdict)} |")


def _winner(verdict: dict[str, Any]) -> str:
    """The confirmation's own sentence (winner, speedup, interval, p), and its wall time."""
    return str(verdict.get("message", "no confirmation recorded"))


if __name__ == "__main__":
    main()
