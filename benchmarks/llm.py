"""Text generation: a causal LM's search, its winner side by side with llama.cpp and OpenVINO GenAI,
and the winner served through `apply` (examples/serve_llm.py) against its measured decode.

1. `autotune search --task generate` (random weights, the model's prompt and new tokens, batch 1,
   objective latency: a request's prefill and decode), then `autotune export best.env`.
2. Side by side, each a fresh `autotune bench` process per round, rounds in a balanced random
   order: PyTorch's defaults, the exported winner, and the peers at their best documented settings
   (llama.cpp Q4_0 and Q8_0, OpenVINO GenAI int4 and int8, a thread per core), with PyTorch's own
   int4 (gpt-fast's recipe: the decode step compiled). These run under `--tolerance 1`: their speed
   is measured whatever their guard says (random weights fail int4: docs/generation.md), and the
   guard's figures (the next-token logits' mean cosine similarity with fp32 eager's, top-1
   agreement) are in their row.
   Per contender: time to first token, time per output token, decode tokens/s, the request, peak
   RSS, and the decode's share of this CPU's measured memory bandwidth (the weights a step reads
   over its time per token, against the probe's STREAM triad).
3. Served against measured: per round, `autotune run best.env -- python examples/serve_llm.py`
   and `autotune bench` of best.env, in a random order; the paired ratio of their time per output
   token (Hodges-Lehmann, the signed-rank interval with its real coverage), "within 10%" when the
   whole interval is.

    .venv/bin/python benchmarks/llm.py --out /tmp/llm --trials 50 --rounds 3 --seed 61
    .venv/bin/python benchmarks/llm.py --quick --out /tmp/llm-quick
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from autotune.search.rounds import schedule
from autotune.study import storage
from autotune.study.efficiency import bandwidth_fraction

from lib import common, side_by_side, side_by_side_report

SERVE = common.REPO / "examples" / "serve_llm.py"
TOLERANCE = 0.10  # the Done-when: served decode "within 10%" of the search's figure
# A request is seconds long: few of them per process, one untimed.
MEASURE = ("--warmup", "1", "--warmup-time", "0", "--min-iterations", "3", "--duration", "1")
# Measured whatever their guard says (`--tolerance 1`): the peers, and PyTorch's own int4 (gpt-fast's recipe)
UNGUARDED = (("PyTorch int4, decode compiled", ("backend=inductor", "precision=int4_weight_only")),
             ("llama.cpp Q4_0", ("backend=llamacpp", "precision=int4_weight_only")),
         ("llama.cpp Q8_0", ("backend=llamacpp", "precision=int8_weight_only")),
         ("OpenVINO GenAI int4", ("backend=openvino", "precision=int4_weight_only")),
         ("OpenVINO GenAI int8", ("backend=openvino", "precision=int8_weight_only")))
FULL = {"model": "hf:qwen2@0.5b", "prompt_len": 128, "new_tokens": 64, "trials": 50, "rounds": 3, "serve_rounds": 5,
        "requests": 5}
QUICK = {"model": "hf:qwen2@tiny", "prompt_len": 16, "new_tokens": 8, "trials": 4, "rounds": 2, "serve_rounds": 2,
         "requests": 3}


def main() -> int:
    p = common.parser(__doc__, "a tiny qwen2, 16 + 8 tokens, 4 trials, 2 rounds")
    p.add_argument("--model", help=f"a causal LM (default {FULL['model']})")
    p.add_argument("--prompt-len", type=int, help=f"default {FULL['prompt_len']}")
    p.add_argument("--new-tokens", type=int, help=f"default {FULL['new_tokens']}")
    p.add_argument("--trials", type=int, help=f"default {FULL['trials']}")
    p.add_argument("--rounds", type=int, help=f"side-by-side rounds (default {FULL['rounds']})")
    p.add_argument("--serve-rounds", type=int, help=f"served-against-measured rounds (default {FULL['serve_rounds']})")
    p.add_argument("--requests", type=int, help="requests the service times per round")
    p.add_argument("--seed", type=int, default=61, help="of the search and the rounds' order")
    p.add_argument("--served-only", action="store_true", help="in an --out folder of an earlier run: measure "
                   "step 3 again (its search, export and side-by-side kept)")
    p.add_argument("extra", nargs="*", help="more `autotune search` flags, after --")
    args = p.parse_args()
    common.fill(args, FULL, QUICK)
    out = common.out_folder(args.out, "autotune-llm-")
    (out / "tmp").mkdir(exist_ok=True)
    source = ["--model", args.model, "--task", "generate", "--prompt-len", str(args.prompt_len), "--new-tokens",
              str(args.new_tokens)]
    if args.served_only:
        return served_again(args, out, source)
    found: dict[str, Any] = {**common.provenance(out)}
    found["search_exit"] = common.autotune(out, "search", *source, "--trials", str(args.trials), "--seed",
                                           str(args.seed), *MEASURE, *args.extra, log="search.log")
    found["export_exit"] = common.autotune(out, "export", "best.env", log="export.log")
    study = side_by_side.read_study(out)
    found["study"], found["verdict"] = study.get("name"), study.get("verdict")
    found["bandwidth_gbs"] = bandwidth(out)
    winner = side_by_side.winner(out, found["export_exit"], study)
    contenders = [side_by_side.Contender("PyTorch defaults", "defaults", ()), winner,
                  *(side_by_side.Contender(label, "unguarded", knobs) for label, knobs in UNGUARDED)]
    found["contenders"] = [c.label for c in contenders]
    found["knobs"] = [list(c.knobs) for c in contenders]
    found["runs"] = side_by_side_rounds(args, out, source, contenders)
    found["served"] = served_rounds(args, out, source) if found["export_exit"] == 0 else []
    found["served_summary"] = side_by_side_report.paired(
        [r["bench_tpot"] / r["served_tpot"] for r in found["served"] if r.get("bench_tpot") and r.get("served_tpot")])
    common.write_json(out, "llm", found)
    common.write_table(out, "llm", markdown(args, found))
    return 0


def served_again(args: Any, out: Path, source: list[str]) -> int:
    """Step 3 again over an earlier run's export, its record and table rewritten with the new rounds."""
    found = json.loads((out / "llm.json").read_text())
    found["served"] = served_rounds(args, out, source)
    found["served_summary"] = side_by_side_report.paired(
        [r["bench_tpot"] / r["served_tpot"] for r in found["served"] if r.get("bench_tpot") and r.get("served_tpot")])
    found["served_provenance"] = common.provenance(out)
    common.write_json(out, "llm", found)
    common.write_table(out, "llm", markdown(args, found))
    return 0


def bandwidth(out: Path) -> float | None:
    """The memory bandwidth the study's probe measured (STREAM triad)."""
    try:
        study = storage.find_study(out / "studies", None, None)
    except storage.StudyError:
        return None
    return (study.user_attrs.get("probe") or {}).get("bandwidth_gbs")


def side_by_side_rounds(args: Any, out: Path, source: list[str],
                        contenders: list[side_by_side.Contender]) -> list[list[dict[str, Any]]]:
    runs: list[list[dict[str, Any]]] = [[] for _ in contenders]
    for number, order in enumerate(schedule(len(contenders), args.rounds, args.seed)):
        for position in order:
            contender = contenders[position]
            run: dict[str, Any] = {"ok": False, "reason": contender.unavailable} if contender.unavailable else \
                bench(out, source, contender.knobs, unguarded=contender.kind == "unguarded")
            runs[position].append({"round": number, **run})
            shown = f"TPOT {run['tpot_ms']:.2f} ms" if run["ok"] else f"FAILED {run['reason'][:120]}"
            common.say(f"round {number + 1}/{args.rounds}: {contender.label}: {shown}")
    return runs


def bench(out: Path, source: list[str], knobs: tuple[str, ...], unguarded: bool = False) -> dict[str, Any]:
    """One fresh `autotune bench` process: a request's figures, its guard's, its memory."""
    sets = [arg for knob in knobs for arg in ("--set", knob)]
    tolerance = ["--tolerance", "1"] if unguarded else []
    command = [sys.executable, "-m", "autotune", "bench", *source, *sets, *tolerance, *MEASURE, "--json"]
    done = subprocess.run(command, cwd=out, env=common.cli_env(out), capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    try:
        result = json.loads(done.stdout)["result"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return {"ok": False, "reason": common.last_line(done)}
    if not result.get("ok"):
        return {"ok": False, "reason": str(result.get("reason", ""))[:common.KEPT]}
    generation = result.get("generation", {})
    setup = result["instances"][0].get("setup", {})
    return {"ok": True, "ttft_ms": generation.get("ttft_p50_ms"), "tpot_ms": generation.get("tpot_p50_ms"),
            "request_ms": result["latency_p50_ms"], "peak_rss_mb": result["peak_rss_mb"],
            "weight_bytes": generation.get("weight_bytes"), "mean_cosine": setup.get("mean_cosine"),
            "top1_agreement": setup.get("top1_agreement"), "gguf_type": setup.get("gguf_type"),
            "route": setup.get("route")}


def served_rounds(args: Any, out: Path, source: list[str]) -> list[dict[str, Any]]:
    """Per round, in a random order: the exported configuration benched, and served by serve_llm.py under it."""
    order = random.Random(args.seed)
    env = read_knobs(out)
    rounds = []
    for number in range(args.serve_rounds):
        both: dict[str, Any] = {"round": number}
        for which in order.sample(["bench", "serve"], 2):
            if which == "bench":
                run = bench(out, source, env)
                both["bench_tpot"] = run.get("tpot_ms") if run["ok"] else None
                both["bench"] = run
            else:
                both["served_tpot"], both["serve"] = serve(args, out)
        common.say(f"served round {number + 1}/{args.serve_rounds}: bench TPOT {both.get('bench_tpot')}, served "
                   f"{both.get('served_tpot')}")
        rounds.append(both)
    return rounds


def read_knobs(out: Path) -> tuple[str, ...]:
    from autotune.measure.requests import exported_config
    from autotune.model.envfile import read as read_env

    config = exported_config(read_env(out / "best.env").env)
    return tuple(config.describe().split()) if config.values else ()


def serve(args: Any, out: Path) -> tuple[float | None, dict[str, Any]]:
    command = [sys.executable, "-m", "autotune", "run", "best.env", "--", sys.executable, str(SERVE), "--model",
               args.model, "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
               "--requests", str(args.requests), "--json"]
    done = subprocess.run(command, cwd=out, env=common.cli_env(out), capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return None, {"ok": False, "reason": common.last_line(done)}
    tpot = sorted(line["tpot_p50_ms"] for line in lines)[len(lines) // 2]  # the instances' median
    return tpot, {"ok": True, "instances": lines}


def median(values: list[float]) -> float:
    """The middle value (the upper of two): what a table row shows of a contender's rounds."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def markdown(args: Any, found: dict[str, Any]) -> str:
    band = found.get("bandwidth_gbs")
    lines = [common.provenance_line(found), "",
             f"{args.model}, prompt {args.prompt_len} tokens, {args.new_tokens} new, batch 1; {args.trials}-trial "
             f"search at most (seed {args.seed}); {args.rounds} side-by-side rounds; memory bandwidth "
             f"{'-' if band is None else f'{band:.1f}'} GB/s (the probe's triad)", "",
             "| contender | knobs | TTFT ms | TPOT ms | decode tokens/s | request ms | peak RSS MB | of bandwidth "
             "| guard: mean cosine, top-1 |", "|---|---|---|---|---|---|---|---|---|"]
    for label, knobs, runs in zip(found["contenders"], found["knobs"], found["runs"], strict=True):
        ok = [r for r in runs if r["ok"]]
        if not ok:
            lines.append(f"| {label} | {' '.join(knobs) or 'defaults'} | failed: {runs[0]['reason'][:160]} "
                         f"| | | | | | |")
            continue
        tpot = median([r["tpot_ms"] for r in ok])
        weights = ok[0].get("weight_bytes")
        limit = bandwidth_fraction(0, weights, tpot, band) if weights and tpot and band else None
        cosine, top1 = ok[0].get("mean_cosine"), ok[0].get("top1_agreement")
        guard = "-" if cosine is None else f"{cosine:.4f}, {top1:.0%}"
        lines.append(f"| {label} | {' '.join(knobs) or 'defaults'} | {median([r['ttft_ms'] for r in ok]):.1f} "
                     f"| {tpot:.2f} | {1e3 / tpot:.1f} | {median([r['request_ms'] for r in ok]):.0f} "
                     f"| {median([r['peak_rss_mb'] for r in ok]):.0f} "
                     f"| {share(limit)} | {guard} |")
    summary = found.get("served_summary")
    lines += ["", f"Served through `apply` (examples/serve_llm.py under `autotune run best.env`) against `autotune "
              f"bench` of best.env, {len(found['served'])} rounds: measured TPOT over served TPOT "
              f"{side_by_side_report.speedup_text(summary)}; within {TOLERANCE:.0%}: "
              f"{side_by_side_report.within(summary, TOLERANCE)}"]
    again = found.get("served_provenance")
    if again:
        lines.append(f"(these rounds: `{again['command']}` at {again['commit']}, {again['date']})")
    return "\n".join(lines) + "\n"


def share(limit: dict[str, Any] | None) -> str:
    return "-" if limit is None else f"{limit['fraction']:.0%}"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
