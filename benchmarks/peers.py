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

All four parts at the defaults were estimated at 3-4 h on 2 cores (the runs in RESULTS.md, 20 trials
and 5 rounds, did not record their time); --quick about 10 min.

    .venv/bin/python benchmarks/peers.py --trials 20 --rounds 5 --out /tmp/peers   # the RESULTS.md tables
    .venv/bin/python benchmarks/peers.py --models bert --objectives latency
    .venv/bin/python benchmarks/peers.py --quick --out /tmp/peers-quick
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from lib import common, side_by_side, side_by_side_report
from lib.side_by_side import Contender

MODELS = {  # --models name: (what --model gets, whether it takes BERT's example inputs)
    "resnext101": ("resnext101", False),
    "bert": ("benchmarks.models.bert:bert_base", True),
    "resnet18": ("resnet18", False),  # for a short check of the script itself
}
# The issue's peer recipes: measured when the study ran no peer recipe (an autotune without them, a
# runtime not installed, a space without it), so the table says so instead of leaving them out.
ISSUE_PEERS = {
    "OpenVINO defaults (LATENCY hint)": ["backend=openvino"],
    "OpenVINO int8 (NNCF)": ["backend=openvino", "precision=int8"],
    "ONNX Runtime defaults": ["backend=onnxruntime"],
}
BERT_INPUTS = "bert_inputs.pt"


def main() -> int:
    args = parse()
    common.say(f"peers: {args.models} x {args.objectives}, {args.trials} trials, {args.rounds} rounds")
    found: dict[str, Any] = {**common.provenance(args.out), "args": {k: str(v) for k, v in vars(args).items()},
                             "parts": []}
    for model in args.models:
        for objective in args.objectives:
            part = run_part(args, model, objective)
            found["parts"].append(part)
            common.write_json(args.out, "peers", found)
            common.write_table(args.out, f"{model}-{objective}", side_by_side_report.markdown(found, part))
    return 0


def parse() -> argparse.Namespace:
    p = common.parser(__doc__, "resnet18, 3-trial searches in the quick space, 2 rounds of 0.5 s windows")
    p.add_argument("--models", type=side_by_side.names(MODELS), help="resnext101,bert (default; resnet18 with --quick)")
    side_by_side.add_options(p)
    args = p.parse_args()
    common.fill(args, {"models": ["resnext101", "bert"], **side_by_side.FULL},
                {"models": [common.QUICK_MODEL], **side_by_side.QUICK})
    args.extra = [*(common.QUICK_SEARCH if args.quick else ()), *args.extra]
    args.out = common.out_folder(args.out, "autotune-peers-")
    return args


def run_part(args: argparse.Namespace, model: str, objective: str) -> dict[str, Any]:
    """One (model, objective): search, export, then every contender side by side."""
    source = [*model_flags(args.out, model), "--batch-size", str(side_by_side.BATCH[objective])]
    part = side_by_side.search_and_compare(args, args.out / f"{model}-{objective}", source, objective,
                                           peer_contenders)
    return {"model": model, **part}


def peer_contenders(study: dict[str, Any]) -> list[Contender]:
    """Every recipe the study ran, and the issue's peers where it ran none."""
    recipes = side_by_side.recipes_of(study)
    return [*recipes, *missing_peers(recipes)]


def missing_peers(recipes: list[Contender]) -> list[Contender]:
    """The issue's peers, only when the study ran no peer recipe at all: where it ran some, the
    project's own list (names and knobs) is the one measured."""
    if any(r.kind == "peer" for r in recipes):
        return []
    return [Contender(name, "peer", tuple(knobs), "the issue's peer; the study ran no peer recipe")
            for name, knobs in ISSUE_PEERS.items()]


def model_flags(out: Path, model: str) -> list[str]:
    name, needs_inputs = MODELS[model]
    if not needs_inputs:
        return ["--model", name]
    inputs = out / BERT_INPUTS
    if not inputs.exists():
        subprocess.run([sys.executable, "-m", "benchmarks.models.bert", str(inputs)], env=common.cli_env(out),
                       check=True)
    return ["--model", name, "--example-inputs", str(inputs)]


if __name__ == "__main__":
    sys.exit(main())
