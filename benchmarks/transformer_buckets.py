"""BERT-base at sequence-length buckets: PyTorch's defaults, the expert recipes and autotune's
confirmed winner, then a mixed-length request stream served through `apply` (issue 40).

For each objective (batch 1 latency, batch 8 throughput): a fresh `autotune search --seq-lens
32,128,384` in a folder of its own (each configuration measured at every length, one compiled model
per length, its figure the weighted mean over the lengths), `autotune export best.env --artifacts`,
then side by side as benchmarks/peers.py does it (each contender a fresh `autotune bench` process
per round, in a balanced random order): the defaults, every expert recipe the study ran, and the
exported winner. Then the replay: examples/serve_text.py serving requests of lengths spread evenly
up to the largest bucket in a random order, once as eager PyTorch (its times grouped by the same buckets)
and once under `autotune run best.env` (the one `apply` line: the exported artifacts, each request
padded to the smallest bucket that holds it). Each bucket's served mean is set against the figure
the search measured for the exported trial (the median of its p50s over the confirmation's rounds,
each a fresh process; the search trial's own p50 where the confirmation did not run it; a bucket's
time the mean over the lengths that stand for it): within 10% or not (the issue's Done-when). One
replay against one figure cannot show 10% on a machine whose speed drifts more than that; for the
served speed paired with the measured one over rounds, run benchmarks/served_vs_measured.py on OUT's
export folder (OUT/latency, OUT/throughput).

Everything goes to OUT/transformer_buckets.json after each part; each objective's markdown, ready for
benchmarks/RESULTS.md, goes to OUT/<objective>.md and stdout.

Time and disk, batch 1 latency on the 2-core AVX-512 EPYC (two runs, 2026-12-05): the 50-trial search
31-35 min, its confirmation 12-21, the export 2, the side by side (six contenders, five rounds) 14-16,
the replay 2: 1 h to 1 h 15. Batch 8 (3 rounds, 8-round confirmation of 2): 2 h 51 min. The compiled
models the search keeps (studies/cache under OUT) took 23-26 GB for one objective: give it 30 GB free
per objective. --quick (a tiny BERT of random weights, lengths 8, 16, 32): about 12 min.

    .venv/bin/python benchmarks/transformer_buckets.py --objectives latency --rounds 5 --out /tmp/bert-buckets
    .venv/bin/python benchmarks/transformer_buckets.py --objectives throughput --rounds 3 --requests 100 \\
        -- --confirm-top 2 --confirm-rounds 8
    .venv/bin/python benchmarks/transformer_buckets.py --quick --out /tmp/bert-buckets-quick
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from autotune.measure import stats
from autotune.measure.results import bucket_p50s
from autotune.model.buckets import BucketError, Buckets
from autotune.study import confirmations, storage

from lib import buckets_report, common, side_by_side
from lib.side_by_side import Contender

SERVE = common.REPO / "examples" / "serve_text.py"
ARTIFACTS = "artifacts"  # the export's compiled models, one per bucket, which the replay's `apply` loads
TINY_BERT = '''import sys
from pathlib import Path
from tests.support.hf import save_tiny_bert
save_tiny_bert(Path(sys.argv[1]))
'''
QUICK = {"seq_lens": "8,16,32", "requests": 30}  # and a tiny BERT of random weights


def main() -> int:
    args = parse()
    common.say(f"transformer_buckets: {args.model} at {args.buckets.text()} x {args.objectives}, {args.trials} "
               f"trials, {args.rounds} rounds, {args.requests} requests")
    found: dict[str, Any] = {**common.provenance(args.out), "model": args.model, "lengths": list(args.buckets.lengths),
                             "weights": list(args.buckets.weights), "args": {k: str(v) for k, v in vars(args).items()},
                             "parts": []}
    for objective in args.objectives:
        part = run_part(args, objective)
        found["parts"].append(part)
        common.write_json(args.out, "transformer_buckets", found)
        part["replay"] = replay(args, part)
        common.write_json(args.out, "transformer_buckets", found)
        common.write_table(args.out, objective, buckets_report.markdown(found, part))
    return 0


def parse() -> argparse.Namespace:
    p = common.parser(__doc__, "a tiny BERT of random weights at lengths 8,16,32, 3-trial searches in the quick "
                      "space, 2 rounds of 0.5 s windows, 30 requests")
    p.add_argument("--model", help="hf:TYPE (default hf:bert: BERT-base's default configuration) "
                   "or hf:FOLDER (written by save_pretrained)")
    p.add_argument("--seq-lens", help="the buckets, increasing (default 32,128,384)")
    p.add_argument("--seq-len-weights", default="", help="their shares of the requests (default: equal)")
    p.add_argument("--requests", type=int, help="requests of the replay, per server (default 200)")
    p.add_argument("--lengths", default="", help="the replay's request lengths LOW-HIGH (default 1 to the largest "
                   "bucket)")
    side_by_side.add_options(p)
    args = p.parse_args()
    common.fill(args, {"seq_lens": "32,128,384", "requests": 200, **side_by_side.FULL},
                {**QUICK, **side_by_side.QUICK})
    args.extra = [*(common.QUICK_SEARCH if args.quick else ()), *args.extra]
    try:
        args.buckets = Buckets.parse(args.seq_lens, args.seq_len_weights)
    except BucketError as exc:
        p.error(str(exc))
    args.out = common.out_folder(args.out, "autotune-transformer-buckets-")
    args.model = model(args.model, args.quick, args.out)
    args.lengths = args.lengths or f"1-{args.buckets.lengths[-1]}"
    return args


def model(given: str | None, quick: bool, out: Path) -> str:
    """--model as the processes take it, which run in folders of their own: a folder made absolute;
    with --quick and no --model, a tiny BERT written to OUT/tiny-bert."""
    if given is None and quick:
        folder = out / "tiny-bert"
        subprocess.run([sys.executable, "-c", TINY_BERT, str(folder)], cwd=out, env=common.cli_env(out), check=True)
        return f"hf:{folder}"
    given = given or "hf:bert"
    source = given.removeprefix("hf:")
    return f"hf:{Path(source).expanduser().resolve()}" if "/" in source else given


def run_part(args: argparse.Namespace, objective: str) -> dict[str, Any]:
    """One objective: search, export with artifacts, the defaults, expert recipes and winner side by
    side, and what the search recorded at each bucket for the exported trial."""
    source = ["--model", args.model, "--seq-lens", args.buckets.text(), "--seq-len-weights",
              args.buckets.weights_text(), "--batch-size", str(side_by_side.BATCH[objective])]
    part = side_by_side.search_and_compare(args, args.out / objective, source, objective, experts,
                                           "--artifacts", ARTIFACTS)
    return {**part, "measured": measured(Path(part["folder"]), part["export_exit"])}


def experts(study: dict[str, Any]) -> list[Contender]:
    """The expert recipes the study ran (its peer recipes are benchmarks/peers.py's)."""
    return [c for c in side_by_side.recipes_of(study) if c.kind == "expert"]


def measured(folder: Path, export_exit: int) -> dict[str, Any]:
    """The exported trial's p50 at each bucket: the median over its confirmation's rounds (each a
    fresh process, interleaved with the baseline and the references), or the search trial's one
    process where the confirmation did not run it."""
    number = side_by_side.exported_number(folder) if export_exit == 0 else None
    if number is None:
        return {"trial": None, "buckets": {}, "source": ""}
    study = storage.find_study(folder / "studies", None, None)
    verdict = study.user_attrs.get("confirmation") or {}
    confirmed = confirmations.buckets_of(verdict, number) if verdict else {}
    if confirmed:
        return {"trial": number, "buckets": confirmed, "source": f"its {verdict['rounds']} confirmation rounds"}
    record = next((t.user_attrs for t in study.get_trials(deepcopy=False) if t.number == number), {})
    return {"trial": number, "buckets": bucket_p50s(record.get("instances", [])),
            "source": "its search trial"}


def replay(args: argparse.Namespace, part: dict[str, Any]) -> dict[str, Any]:
    """The same request stream served as eager PyTorch and through `apply` under the exported env file."""
    folder = Path(part["folder"])
    serve = [sys.executable, str(SERVE), "--model", args.model, "--lengths", args.lengths, "--batch-size",
             str(part["batch_size"]), "--requests", str(args.requests), "--json"]
    eager = served(folder, [*serve, "--group", args.buckets.text()], "serve-eager.log")
    applied = (served(folder, [sys.executable, "-m", "autotune", "run", "best.env", "--", *serve], "serve-apply.log")
               if part["export_exit"] == 0 else {"ok": False, "reason": "no best.env: the export failed"})
    return {"lengths": args.lengths, "requests": args.requests, "eager": eager, "apply": applied}


def served(folder: Path, command: list[str], log: str) -> dict[str, Any]:
    """serve_text.py's summaries (one per instance under `autotune run`), each bucket's p50 and mean
    the median over the instances."""
    common.say(f"{folder.name}: $ {shlex.join(command)} (log: {folder / log})")
    done = subprocess.run(command, cwd=folder, env=common.cli_env(folder), capture_output=True, text=True,
                          check=False, stdin=subprocess.DEVNULL)
    (folder / log).write_text(done.stdout + done.stderr)
    summaries = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not summaries:
        return {"ok": False, "reason": common.last_line(done), "exit": done.returncode}
    seen: dict[str, list[dict[str, Any]]] = {}
    for summary in summaries:
        for bucket, found in summary["buckets"].items():
            seen.setdefault(bucket, []).append(found)
    buckets = {b: {"p50_ms": stats.median([f["p50_ms"] for f in each]),
                   "mean_ms": stats.median([f["mean_ms"] for f in each]), "requests": sum(f["requests"] for f in each)}
               for b, each in seen.items()}
    return {"ok": True, "exit": 0, "configuration": summaries[0]["configuration"], "instances": len(summaries),
            "ready_s": max(s["ready_s"] for s in summaries), "buckets": buckets, "summaries": summaries}


if __name__ == "__main__":
    sys.exit(main())
