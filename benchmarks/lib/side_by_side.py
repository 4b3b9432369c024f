"""A fresh search, its export, then contenders side by side: each a fresh `autotune bench` process
per round, in the confirmation's balanced random order (benchmarks/peers.py, transformer_buckets.py)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.measure.requests import exported_config
from autotune.measure.results import bucket_p50s
from autotune.model.envfile import read as read_env
from autotune.model.knobs import PEER_BACKENDS
from autotune.search.rounds import schedule
from autotune.study import storage

from lib import common, side_by_side_report

BATCH = {"latency": 1, "throughput": 8}
MIN_ITERATIONS = {"latency": 10, "throughput": 5}  # a batch of 8 through resnext101 takes seconds


@dataclass(frozen=True)
class Contender:
    label: str
    kind: str  # defaults, expert, peer, winner
    knobs: tuple[str, ...]
    note: str = ""
    unavailable: str = ""  # why it cannot run at all: each of its rounds is recorded as this failure


def add_options(p: argparse.ArgumentParser) -> None:
    """The flags of a search-then-side-by-side benchmark; those left out are None (`common.defaults`)."""
    p.add_argument("--objectives", type=names(BATCH), default=list(BATCH), help="latency,throughput")
    p.add_argument("--trials", type=int, help="trials of each search (default 50)")
    p.add_argument("--rounds", type=int, help="interleaved rounds of the side-by-side (default 6)")
    p.add_argument("--duration", type=float, help="timed seconds per bench process (default 3)")
    p.add_argument("--warmup-time", type=float, help="untimed warmup seconds (default 1)")
    p.add_argument("--seed", type=int, help="seed of the searches and of the rounds' order (default: random)")
    p.add_argument("extra", nargs="*", help="more `autotune search` flags, after --")


FULL = {"trials": 50, "rounds": 6, "duration": 3.0, "warmup_time": 1.0}
QUICK = {"trials": 3, "rounds": 2, "duration": 0.5, "warmup_time": 0.3}


def names(known: dict[str, Any]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of `known`'s keys."""
    def split(text: str) -> list[str]:
        chosen = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in chosen if n not in known]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(known)}")
        return chosen
    return split


def search_and_compare(args: argparse.Namespace, folder: Path, source: list[str], objective: str,
                       pick: Callable[[dict[str, Any]], list[Contender]], *export: str) -> dict[str, Any]:
    """A fresh search in `folder`, its export (with `export`'s flags), then side by side the defaults,
    the recipes `pick` takes from the study's records and the exported winner."""
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    seed = ["--seed", str(args.seed)] if args.seed is not None else []
    search = common.autotune(folder, "search", *source, "--objective", objective, "--trials", str(args.trials),
                             *seed, *args.extra, log="search.log")
    exported = common.autotune(folder, "export", "best.env", *export, log="export.log")
    study = read_study(folder)
    contenders = [Contender("PyTorch defaults", "defaults", ()), *pick(study), winner(folder, exported, study)]
    order_seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    runs = side_by_side(args, folder, source, objective, contenders, order_seed)
    return {"objective": objective, "batch_size": BATCH[objective], "folder": str(folder),
            "order_seed": order_seed, "search_exit": search,
            "export_exit": exported, "study": study.get("name"),
            "verdict": study.get("verdict"), "contenders": [asdict(c) for c in contenders], "runs": runs,
            "summary": side_by_side_report.summarise(contenders, runs, objective)}


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


def backend_of(knobs: tuple[str, ...]) -> str:
    return next((k.partition("=")[2] for k in knobs if k.startswith("backend=")), "eager")


def winner(folder: Path, export_exit: int, study: dict[str, Any]) -> Contender:
    """What `autotune export` wrote, benched from the knobs it sets; a failed export is a contender
    whose every run fails with that reason."""
    label = "autotune's confirmed winner (exported)"
    if export_exit != 0:
        why = f"autotune export exited {export_exit} (see export.log)"
        return Contender(label, "winner", (), why, unavailable=why)
    env = read_env(folder / "best.env").env
    config = exported_config(env)
    return Contender(label, "winner", tuple(config.describe().split()) if config.values else (),
                     exported_trial(folder, study))


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
            common.say(f"{folder.name}: round {number + 1}/{args.rounds}: {contenders[position].label}: {shown}")
    return runs


def bench(args: argparse.Namespace, folder: Path, source: list[str], objective: str,
          contender: Contender) -> dict[str, Any]:
    if contender.unavailable:
        return {"ok": False, "value": None, "reason": contender.unavailable, "exit": None}
    sets = [arg for knob in contender.knobs for arg in ("--set", knob)]
    command = [sys.executable, "-m", "autotune", "bench", *source, *sets, "--duration", str(args.duration),
               "--warmup-time", str(args.warmup_time), "--min-iterations", str(MIN_ITERATIONS[objective]), "--json"]
    done = subprocess.run(command, cwd=folder, env=common.cli_env(folder), capture_output=True, text=True,
                          check=False, stdin=subprocess.DEVNULL)
    try:
        result = json.loads(done.stdout)["result"]
    except (json.JSONDecodeError, KeyError, TypeError):  # an `Error:` line (exit 2), a crash
        return {"ok": False, "value": None, "reason": common.last_line(done), "exit": done.returncode}
    metric = "latency_p50_ms" if objective == "latency" else "throughput_ips"
    ok = bool(result.get("ok"))
    return {"ok": ok, "value": result.get(metric) if ok else None,
            "reason": str(result.get("reason", ""))[:common.KEPT], "exit": done.returncode,
            "p90_ms": result.get("latency_p90_ms"), "peak_rss_mb": result.get("peak_rss_mb"),
            "buckets": bucket_p50s(result.get("instances", [])) if ok else {},
            "instances": len(result.get("instances", []))}
