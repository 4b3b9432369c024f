"""autotune's confirmed winner against the runtimes a user would pick instead (issue 39).

For each model and objective (batch 1 latency, batch 8 throughput): a fresh `autotune search` in a
folder of its own, `autotune export best.env`, then side by side, each a fresh `autotune bench`
process per round in a balanced random order (the confirmation's Williams schedule): PyTorch's
defaults, every recipe the study ran (the expert recipes and the peer recipes, with the names and
knobs the project gives them, read from the study's records; where it ran no peer recipe, the
issue's three, recorded as failures where this autotune cannot run them), and the exported winner.

Per contender: the median p50 ms (latency) or items/s (throughput) over the rounds with its range,
and the speedup over the defaults as the Hodges-Lehmann estimate of the paired rounds with the
signed-rank interval (autotune/measure/stats.py), labelled with its real coverage. Then the winner
against the best peer of each round (the fastest peer in that round, which favours the peers) and
against the best peer by median. Everything goes to OUT/peers.json after each part; each part's
markdown table, ready for benchmarks/RESULTS.md, goes to OUT/<model>-<objective>.md and stdout.

    PYTHONPATH=. .venv/bin/python benchmarks/peers.py --out /tmp/peers      # all four parts: 3-4 h on 2 cores
    PYTHONPATH=. .venv/bin/python benchmarks/peers.py --models bert --objectives latency
    PYTHONPATH=. .venv/bin/python benchmarks/peers.py --models resnet18 --trials 3 --rounds 2 \\
        --duration 0.5 --warmup-time 0.3 --out /tmp/peers-smoke -- --space seed --confirm-top 1 \\
        --confirm-rounds 5 --replicates 1 --duration 0.5 --warmup-time 0.3     # smoke run, about 10 min
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import peers_report

from autotune.child.envfile import read as read_env
from autotune.child.knobs import PEER_BACKENDS
from autotune.measure.results import bucket_p50s
from autotune.search.rounds import schedule
from autotune.study import storage

REPO = Path(__file__).resolve().parent.parent
MODELS = {  # --models name: (what --model gets, whether it takes BERT's example inputs)
    "resnext101": ("resnext101", False),
    "bert": ("benchmarks.models.bert:bert_base", True),
    "resnet18": ("resnet18", False),  # for a short check of the script itself
}
BATCH = {"latency": 1, "throughput": 8}
MIN_ITERATIONS = {"latency": 10, "throughput": 5}  # a batch of 8 through resnext101 takes seconds
# The issue's peer recipes: measured when the study ran no peer recipe (an autotune without them, a
# runtime not installed, a space without it), so the table says so instead of leaving them out.
ISSUE_PEERS = {
    "OpenVINO defaults (LATENCY hint)": ["backend=openvino"],
    "OpenVINO int8 (NNCF)": ["backend=openvino", "precision=int8"],
    "ONNX Runtime defaults": ["backend=onnxruntime"],
}
BERT_INPUTS = "bert_inputs.pt"
KEPT = 300  # characters of a failure's reason kept, from its start (where it says what failed)


@dataclass(frozen=True)
class Contender:
    label: str
    kind: str  # defaults, expert, peer, winner
    knobs: tuple[str, ...]
    note: str = ""
    unavailable: str = ""  # why it cannot run at all: each of its rounds is recorded as this failure


def main() -> int:
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    say(f"peers: {args.models} x {args.objectives}, {args.trials} trials, {args.rounds} rounds, out {args.out}")
    found: dict[str, Any] = {"command": command_line(), **peers_report.provenance(cli_env(args.out)),
                             "args": {k: str(v) for k, v in vars(args).items()}, "parts": []}
    for model in args.models:
        for objective in args.objectives:
            part = run_part(args, model, objective)
            found["parts"].append(part)
            (args.out / "peers.json").write_text(json.dumps(found, indent=2, default=str) + "\n")
            table = peers_report.markdown(found, part)
            (args.out / f"{model}-{objective}.md").write_text(table)
            print(table, flush=True)
    return 0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=names(MODELS), default=["resnext101", "bert"], help="resnext101,bert")
    return shared_options(p, "autotune-peers-")


def shared_options(p: argparse.ArgumentParser, prefix: str) -> argparse.Namespace:
    """The flags of a search-then-side-by-side benchmark (this one, transformers.py), parsed, with
    --out resolved (default: a new temporary folder named `prefix`...)."""
    p.add_argument("--objectives", type=names(BATCH), default=list(BATCH), help="latency,throughput")
    p.add_argument("--trials", type=int, default=50, help="trials of each search (default 50)")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds of the side-by-side (default 6)")
    p.add_argument("--duration", type=float, default=3.0, help="timed seconds per bench process (default 3)")
    p.add_argument("--warmup-time", type=float, default=1.0, help="untimed warmup seconds (default 1)")
    p.add_argument("--seed", type=int, help="seed of the searches and of the rounds' order (default: random)")
    p.add_argument("--out", type=Path, help="where everything goes (default: a new temporary folder)")
    p.add_argument("extra", nargs="*", help="more `autotune search` flags, after --")
    args = p.parse_args()
    args.out = (args.out or Path(tempfile.mkdtemp(prefix=prefix))).resolve()
    return args


def names(known: dict[str, Any]) -> Any:
    def split(text: str) -> list[str]:
        chosen = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in chosen if n not in known]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(known)}")
        return chosen
    return split


def run_part(args: argparse.Namespace, model: str, objective: str) -> dict[str, Any]:
    """One (model, objective): search, export, then every contender side by side."""
    source = [*model_flags(args, model), "--batch-size", str(BATCH[objective])]
    part = search_and_compare(args, args.out / f"{model}-{objective}", source, objective, peer_contenders)
    return {"model": model, **part}


def search_and_compare(args: argparse.Namespace, folder: Path, source: list[str], objective: str,
                       pick: Callable[[dict[str, Any]], list[Contender]], *export: str) -> dict[str, Any]:
    """A fresh search in `folder`, its export (with `export`'s flags), then side by side the defaults,
    the recipes `pick` takes from the study's records and the exported winner."""
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    seed = ["--seed", str(args.seed)] if args.seed is not None else []
    search = autotune(folder, "search", *source, "--objective", objective, "--trials", str(args.trials),
                      *seed, *args.extra, log="search.log")
    exported = autotune(folder, "export", "best.env", *export, log="export.log")
    study = read_study(folder)
    contenders = [Contender("PyTorch defaults", "defaults", ()), *pick(study), winner(folder, exported, study)]
    order_seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    runs = side_by_side(args, folder, source, objective, contenders, order_seed)
    return {"objective": objective, "batch_size": BATCH[objective], "folder": str(folder),
            "order_seed": order_seed, "search_exit": search,
            "export_exit": exported, "study": study.get("name"),
            "verdict": study.get("verdict"), "contenders": [asdict(c) for c in contenders], "runs": runs,
            "summary": peers_report.summarise(contenders, runs, objective)}


def peer_contenders(study: dict[str, Any]) -> list[Contender]:
    """Every recipe the study ran, and the issue's peers where it ran none."""
    recipes = recipes_of(study)
    return [*recipes, *missing_peers(recipes)]


def model_flags(args: argparse.Namespace, model: str) -> list[str]:
    name, needs_inputs = MODELS[model]
    if not needs_inputs:
        return ["--model", name]
    inputs = args.out / BERT_INPUTS
    if not inputs.exists():
        subprocess.run([sys.executable, "-m", "benchmarks.models.bert", str(inputs)], env=cli_env(args.out),
                       check=True)
    return ["--model", name, "--example-inputs", str(inputs)]


def cli_env(folder: Path) -> dict[str, str]:
    """This checkout's autotune and benchmarks.models first, and a TMPDIR of the part's own (inductor
    builds its headers again, as for a new user)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    (folder / "tmp").mkdir(parents=True, exist_ok=True)  # AOTInductor's loader fails in a TMPDIR that is not there
    return {**os.environ, "PYTHONPATH": path, "TMPDIR": str(folder / "tmp")}


def autotune(folder: Path, *argv: str, log: str) -> int:
    """`autotune ARGV` from this checkout in `folder`, its output in folder/log; its exit code."""
    say(f"{folder.name}: $ autotune {shlex.join(argv)} (log: {folder / log})")
    with open(folder / log, "wb") as out:
        done = subprocess.run([sys.executable, "-m", "autotune", *argv], cwd=folder, env=cli_env(folder),
                              stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False)
    say(f"{folder.name}: autotune {argv[0]} exited {done.returncode}")
    return done.returncode


def read_study(folder: Path) -> dict[str, Any]:
    """The recipes the search ran, as its records name them, and its confirmation verdict."""
    try:
        study = storage.find_study(folder / "studies", None, None)
    except storage.StudyError as exc:
        return {"error": str(exc), "recipes": []}
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    recipes = [{"trial": t.number, "name": str(t.user_attrs["recipe"]), "config": str(t.user_attrs.get("config", "")),
                "state": t.state.name} for t in trials if t.user_attrs.get("recipe")]
    return {"name": study.study_name, "recipes": recipes, "verdict": study.user_attrs.get("confirmation")}


def recipes_of(study: dict[str, Any]) -> list[Contender]:
    seen: dict[str, Contender] = {}
    for recipe in study["recipes"]:
        knobs = tuple(recipe["config"].split()) if recipe["config"] not in ("", "defaults") else ()
        kind = "peer" if backend_of(knobs) in PEER_BACKENDS else "expert"
        seen.setdefault(recipe["name"], Contender(recipe["name"], kind, knobs, f"trial {recipe['trial']}"))
    return list(seen.values())


def missing_peers(recipes: list[Contender]) -> list[Contender]:
    """The issue's peers, only when the study ran no peer recipe at all: where it ran some, the
    project's own list (names and knobs) is the one measured."""
    if any(r.kind == "peer" for r in recipes):
        return []
    return [Contender(name, "peer", tuple(knobs), "the issue's peer; the study ran no peer recipe")
            for name, knobs in ISSUE_PEERS.items()]


def backend_of(knobs: tuple[str, ...]) -> str:
    return next((k.partition("=")[2] for k in knobs if k.startswith("backend=")), "eager")


def winner(folder: Path, export_exit: int, study: dict[str, Any]) -> Contender:
    """What `autotune export` wrote, benched from its AUTOTUNE_KNOBS line; a failed export is a
    contender whose every run fails with that reason."""
    label = "autotune's confirmed winner (exported)"
    if export_exit != 0:
        why = f"autotune export exited {export_exit} (see export.log)"
        return Contender(label, "winner", (), why, unavailable=why)
    env = read_env(folder / "best.env").env
    return Contender(label, "winner", tuple(env.get("AUTOTUNE_KNOBS", "").split()), exported_trial(folder, study))


def exported_trial(folder: Path, study: dict[str, Any]) -> str:
    """Which trial the export wrote (its header line names it) and the recipe it is, if it is one."""
    number = exported_number(folder)
    if number is None:
        return ""
    recipe = next((r["name"] for r in study["recipes"] if r["trial"] == number), None)
    return f"trial {number}" + (f", the recipe {recipe!r}" if recipe else "")


def exported_number(folder: Path) -> int | None:
    """The number of the trial folder/best.env holds (its header line names it)."""
    number = re.search(r"trial (\d+)", (folder / "best.env").read_text().partition("\n")[0])
    return int(number[1]) if number else None


def side_by_side(args: argparse.Namespace, folder: Path, source: list[str], objective: str,
                 contenders: list[Contender], seed: int) -> list[list[dict[str, Any]]]:
    """runs[contender][round]: each a fresh `autotune bench` process, rounds in a balanced random order."""
    runs: list[list[dict[str, Any]]] = [[] for _ in contenders]
    for number, order in enumerate(schedule(len(contenders), args.rounds, seed)):
        for position in order:
            run = bench(args, folder, source, objective, contenders[position])
            runs[position].append({"round": number, **run})
            shown = f"{run['value']:.2f}" if run["ok"] else f"FAILED {run['reason'][:120]}"
            say(f"{folder.name}: round {number + 1}/{args.rounds}: {contenders[position].label}: {shown}")
    return runs


def bench(args: argparse.Namespace, folder: Path, source: list[str], objective: str,
          contender: Contender) -> dict[str, Any]:
    if contender.unavailable:
        return {"ok": False, "value": None, "reason": contender.unavailable, "exit": None}
    sets = [arg for knob in contender.knobs for arg in ("--set", knob)]
    command = [sys.executable, "-m", "autotune", "bench", *source, *sets, "--duration", str(args.duration),
               "--warmup-time", str(args.warmup_time), "--min-iterations", str(MIN_ITERATIONS[objective]), "--json"]
    done = subprocess.run(command, cwd=folder, env=cli_env(folder), capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    try:
        result = json.loads(done.stdout)["result"]
    except (json.JSONDecodeError, KeyError, TypeError):  # an `Error:` line (exit 2), a crash
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}, no output"])[-1]
        return {"ok": False, "value": None, "reason": reason[:KEPT], "exit": done.returncode}
    metric = "latency_p50_ms" if objective == "latency" else "throughput_ips"
    ok = bool(result.get("ok"))
    return {"ok": ok, "value": result.get(metric) if ok else None, "reason": str(result.get("reason", ""))[:KEPT],
            "exit": done.returncode, "p90_ms": result.get("latency_p90_ms"), "peak_rss_mb": result.get("peak_rss_mb"),
            "buckets": bucket_p50s(result.get("instances", [])) if ok else {},
            "instances": len(result.get("instances", []))}


def command_line() -> str:
    return shlex.join(["PYTHONPATH=.", ".venv/bin/python", "benchmarks/peers.py", *sys.argv[1:]])


def say(text: str) -> None:
    print(f"[{peers_report.clock()}] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
