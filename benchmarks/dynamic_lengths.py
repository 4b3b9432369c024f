"""Does a model that runs each request at its own length (shapes=dynamic) serve a stream of every
length faster with the oneDNN primitive cache its export sets (ONEDNN_PRIMITIVE_CACHE_CAPACITY,
autotune/measure/plan.py) than with oneDNN's default of 1024 primitives?

oneDNN compiles a primitive per matmul shape: a dynamic BERT-base int8 has 4 per sequence length, so
a service that sees every length up to 384 tokens needs about 1540; in 1024 it compiles them again
as they are evicted. In a folder holding an export (`best.env` written by this checkout, its
artifacts), each round runs examples/serve_text.py under `autotune run` twice, in a random order
(seeded, recorded): with best.env, and with a copy of it whose capacity is the default. Each serves
every length from 1 to the largest bucket once, shuffled, after an untimed pass. Per bucket and round
the ratio is the default's mean ms over the export's (above 1: the export's cache serves faster); over
the rounds, its Hodges-Lehmann estimate with the signed-rank interval labelled with its coverage.

    PYTHONPATH=. .venv/bin/python benchmarks/dynamic_lengths.py --folder /tmp/bert-search --rounds 6
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import peers
import peers_report
import served_vs_measured

from autotune.child.envfile import read as read_env
from autotune.measure.plan import PRIMITIVE_CACHE_DEFAULT, PRIMITIVE_CACHE_VAR

SERVE = peers.REPO / "examples" / "serve_text.py"
ARMS = {"export": "best.env", "default": "default-cache.env"}


def main() -> int:
    args = parse()
    env = read_env(args.folder / "best.env").env
    write_default(args.folder)
    rng = random.Random(args.seed)
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        order = rng.sample(sorted(ARMS), 2)
        rounds.append({"order": order, **{arm: serve(args, env, arm, number) for arm in order}})
    command = shlex.join(["PYTHONPATH=.", ".venv/bin/python", "benchmarks/dynamic_lengths.py", *sys.argv[1:]])
    found: dict[str, Any] = {"command": command, **peers_report.provenance(peers.cli_env(args.folder)),
                             "seed": args.seed, "capacity": env[PRIMITIVE_CACHE_VAR], "rounds": rounds,
                             "buckets": summarise(rounds)}
    (args.folder / "dynamic-lengths.json").write_text(json.dumps(found, indent=2) + "\n")
    print(markdown(args, found))
    for reason in sorted({r[arm]["reason"] for r in rounds for arm in ARMS if not r[arm]["ok"]}):
        print(f"failed: {reason}", file=sys.stderr)
    return 0 if found["buckets"] else 1


def parse() -> argparse.Namespace:
    p = served_vs_measured.export_rounds_parser(__doc__, "where `autotune export best.env --artifacts artifacts` "
                                                "of a shapes=dynamic configuration ran", "rounds of one process "
                                                "per cache")
    args = served_vs_measured.checked(p, p.parse_args())
    if PRIMITIVE_CACHE_VAR not in read_env(args.folder / "best.env").env:
        p.error(f"{args.folder / 'best.env'} sets no {PRIMITIVE_CACHE_VAR}: export a shapes=dynamic configuration "
                "with this checkout")
    return args


def write_default(folder: Path) -> None:
    """best.env with oneDNN's default capacity: only that line differs."""
    lines = [f"export {PRIMITIVE_CACHE_VAR}='{PRIMITIVE_CACHE_DEFAULT}'" if line.startswith(f"export "
             f"{PRIMITIVE_CACHE_VAR}=") else line for line in (folder / "best.env").read_text().splitlines()]
    (folder / ARMS["default"]).write_text("\n".join(lines) + "\n")


def serve(args: argparse.Namespace, env: dict[str, str], arm: str, number: int) -> dict[str, Any]:
    """serve_text.py under `autotune run` of the arm's file: each bucket's mean ms over every length."""
    longest = env["AUTOTUNE_SEQ_LENS"].split(",")[-1]
    command = [sys.executable, "-m", "autotune", "run", ARMS[arm], "--", sys.executable, str(SERVE), "--model",
               env["AUTOTUNE_MODEL"], "--lengths", f"1-{longest}", "--requests", longest, "--batch-size",
               env["AUTOTUNE_BATCH_SIZE"], "--json"]
    peers.say(f"{args.folder.name}: {arm}-{number}")
    done = subprocess.run(command, cwd=args.folder, env=peers.cli_env(args.folder), capture_output=True, text=True,
                          check=False, stdin=subprocess.DEVNULL)
    (args.folder / "dynamic-lengths").mkdir(exist_ok=True)
    (args.folder / "dynamic-lengths" / f"{arm}-{number}.log").write_text(done.stdout + done.stderr)
    summaries = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(summaries) != 1:
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}, no output"])[-1][:peers.KEPT]
        return {"ok": False, "reason": reason}
    return {"ok": True, "ready_s": summaries[0]["ready_s"], "peak_rss_mb": summaries[0]["peak_rss_mb"],
            "buckets": {b: found["mean_ms"] for b, found in summaries[0]["buckets"].items()}}


def summarise(rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    both = [r for r in rounds if all(r[arm]["ok"] for arm in ARMS)]
    lengths = sorted({b for r in both for b in r["export"]["buckets"]}, key=int)
    return {length: {arm: [r[arm]["buckets"][length] for r in both] for arm in ARMS}
            | {"paired": peers_report.paired([r["default"]["buckets"][length] / r["export"]["buckets"][length]
                                              for r in both])}
            for length in lengths}


def markdown(args: argparse.Namespace, found: dict[str, Any]) -> str:
    done = [r for r in found["rounds"] if all(r[arm]["ok"] for arm in ARMS)]
    rss = {arm: max(r[arm]["peak_rss_mb"] for r in done) for arm in ARMS} if done else {}
    lines = [peers_report.provenance_line(found), "",
             f"{args.rounds} rounds (seed {args.seed}), {len(done)} with both processes done; peak RSS "
             + ", ".join(f"{arm} {mb:.0f} MB" for arm, mb in rss.items()), "",
             f"| bucket | capacity {PRIMITIVE_CACHE_DEFAULT}: mean ms per round | capacity {found['capacity']} "
             "(the export): mean ms per round | default over export (paired) |", "|---|---|---|---|"]
    for length, each in found["buckets"].items():
        lines.append(f"| {length} | {' '.join(f'{v:.1f}' for v in each['default'])} "
                     f"| {' '.join(f'{v:.1f}' for v in each['export'])} "
                     f"| {peers_report.speedup_text(each['paired'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
