"""The digits part of benchmarks/quality.py: two vision classifiers trained here in seconds on
scikit-learn's bundled digits (benchmarks/models/digits.py), judged by `autotune bench --eval-data`
on the held-out images, and int8_fallback on the one whose int8 loses accuracy.

- The CNN: fp32 and int8 (inductor, and OpenVINO where installed), from the tensor file and the image
  folder; int8 moves none of its answers.
- The depthwise-separable net (`DigitsMobile`'s doc says what makes its int8 lose): fp32 eager and
  inductor, int8 with `int8_fallback` at each value the search samples (search_spaces/default.yaml),
  each with ms per batch, accuracy and its drop with their 95% intervals, and the layers kept in fp32;
  then `autotune search --max-quality-drop LIMIT` over int8_fallback alone (backend=inductor
  precision=int8 pinned), each trial's drop and whether it keeps the limit, and the confirmation's
  re-check of its winner on the items the search never read.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import Any

from lib import common
from lib.judged import bench, interval, number, recorded

BATCH = 16  # the digits' batch: ms per batch
LIMIT = 0.5  # accuracy points: the --max-quality-drop asked of DigitsMobile (its plain int8 dropped 0.7 in a trial run)
FALLBACK_SPACE = "int8_fallback"  # the search's space file: this one knob of search_spaces/default.yaml
SEARCH_SEED = 67
INT8 = ("--set", "backend=inductor", "--set", "precision=int8")
FACTORY = '''"""Written by benchmarks/quality.py: the digits nets it trained, for `--model digits_model:digits_cnn`
and `--model digits_model:digits_mobile`."""
from pathlib import Path

from benchmarks.models.digits import DigitsCNN, DigitsMobile, load


def digits_cnn():
    return load(Path(__file__).with_name("digits_cnn.pt"), DigitsCNN)


def digits_mobile():
    return load(Path(__file__).with_name("digits_mobile.pt"), DigitsMobile)
'''


def digits_module() -> Any:
    """benchmarks/models/digits.py by name, as the factory autotune imports it (mypy knows the file as
    the script-like module `digits`)."""
    if str(common.REPO) not in sys.path:
        sys.path.insert(0, str(common.REPO))
    return importlib.import_module("benchmarks.models.digits")


def prepare(out: Path, epochs: int) -> dict[str, Any]:
    """Both nets trained and saved with their factory; the held-out images as a tensor file and a folder."""
    import torch

    digits = digits_module()
    data = digits.digits()
    (out / "digits_model.py").write_text(FACTORY)
    torch.save({"inputs": data.held_x, "labels": data.held_y}, out / "digits_eval.pt")
    found = trained(out, digits, data, "digits_cnn", digits.DigitsCNN, epochs)
    found["mobile"] = trained(out, digits, data, "digits_mobile", digits.DigitsMobile, digits.MOBILE_EPOCHS)
    found |= {"images": write_image_folder(out / "digits_images", data.held_x, data.held_y),
              "eval_data": str(out / "digits_eval.pt"), "image_folder": str(out / "digits_images")}
    return found


def trained(out: Path, digits: Any, data: Any, name: str, make: Any, epochs: int) -> dict[str, Any]:
    """`make` trained, saved as OUT/NAME.pt, and judged in this process on every held-out image."""
    import torch

    model, seconds = digits.train(data, epochs=epochs, make=make)
    torch.save(model.state_dict(), out / f"{name}.pt")
    reloaded = digits.load(out / f"{name}.pt", make)  # what the factory gives autotune
    found = {"model": name, "train_items": len(data.train_y), "held_out": len(data.held_y), "epochs": epochs,
             "train_s": seconds, "parameters": digits.parameters(model),
             "accuracy": digits.accuracy(reloaded, data.held_x, data.held_y),
             "train_accuracy": digits.accuracy(model, data.train_x, data.train_y)}
    common.say(f"{name}: {found['parameters']} parameters, {epochs} epochs in {seconds:.1f} s, accuracy "
               f"{found['accuracy']:.2f}% on {found['held_out']} held-out images "
               f"({found['train_accuracy']:.2f}% on its {found['train_items']} training images)")
    return found


def write_image_folder(folder: Path, x: Any, y: Any) -> int:
    """Each image as an 8-bit grey PNG under folder/DIGIT/N.png (the 0-16 levels scaled to 0-255)."""
    import torch
    from torchvision.io import write_png

    for number_, (image, label) in enumerate(zip(x, y, strict=True)):
        (folder / str(int(label))).mkdir(parents=True, exist_ok=True)
        write_png((image * 255).round().clamp(0, 255).to(torch.uint8), str(folder / str(int(label)) / f"{number_}.png"))
    return len(y)


def measure(out: Path, name: str, model: str, *argv: str) -> dict[str, Any]:
    """One `autotune bench` of a digits net, its output in OUT/NAME.log."""
    return bench(out, name, "--model", f"digits_model:{model}", "--input-shape", "1x8x8", "--batch-size", str(BATCH),
                 *argv, "--duration", "1")


def cnn_runs(out: Path, openvino: bool) -> list[dict[str, Any]]:
    rows = [("tensors", "eager", "fp32"), ("tensors", "inductor", "fp32"), ("tensors", "inductor", "int8"),
            ("images", "eager", "fp32")]
    if openvino:
        rows.insert(3, ("tensors", "openvino", "int8"))
    runs = []
    for data, backend, precision in rows:
        where = "digits_eval.pt" if data == "tensors" else "digits_images"
        run = measure(out, f"digits-{data}-{backend}-{precision}", "digits_cnn", "--eval-data", where,
                      "--set", f"backend={backend}", "--set", f"precision={precision}")
        runs.append({"eval_data": data, "backend": backend, "precision": precision, **run})
    return runs


def fallback_counts() -> tuple[int, ...]:
    """The values the search samples for int8_fallback (one definition: search_spaces/default.yaml)."""
    from autotune.config import space

    knob = space.load(space.find("default")).get(FALLBACK_SPACE)
    assert knob is not None, "search_spaces/default.yaml lost int8_fallback"
    return tuple(int(value) for value in knob.choices)


def mobile_runs(out: Path) -> list[dict[str, Any]]:
    """fp32 eager and inductor, and int8 keeping each count of layers in fp32."""
    rows: list[tuple[str, tuple[str, ...]]] = [("eager fp32", ("--set", "backend=eager")),
                                                ("inductor fp32", ("--set", "backend=inductor"))]
    rows += [(f"inductor int8, int8_fallback={k}", (*INT8, "--set", f"int8_fallback={k}")) for k in fallback_counts()]
    runs = []
    for label, sets in rows:
        name = "mobile-" + label.replace(", ", "-").replace(" ", "-").replace("=", "")
        run = measure(out, name, "digits_mobile", "--eval-data", "digits_eval.pt", *sets)
        runs.append({"label": label, **run})
    return runs


def fallback_search(out: Path, trials: int) -> dict[str, Any]:
    """`autotune search --max-quality-drop LIMIT` over int8_fallback alone, in a folder of its own."""
    folder = out / "fallback_search"
    folder.mkdir(exist_ok=True)
    for name in ("digits_model.py", "digits_mobile.pt", "digits_eval.pt"):
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(out / name)
    # backend and precision written in the space as well as pinned (`--set`), as this run recorded them
    (folder / "fallback.yaml").write_text(f"description: int8_fallback alone (benchmarks/quality.py)\nknobs:\n"
                                          f"  backend: [inductor]\n  precision: [int8]\n"
                                          f"  {FALLBACK_SPACE}: {list(fallback_counts())}\n")
    started = time.monotonic()
    code = common.autotune(folder, "search", "--model", "digits_model:digits_mobile", "--input-shape", "1x8x8",
                           "--batch-size", str(BATCH), "--eval-data", "digits_eval.pt", "--max-quality-drop",
                           f"{LIMIT:g}", *INT8, "--space", "fallback.yaml", "--trials", str(trials), "--seed",
                           str(SEARCH_SEED), "--replicates", "1", "--confirm-top", "1", "--duration", "1",
                           log="search.log")
    return {"exit": code, "wall_s": time.monotonic() - started, **(recorded(folder) if code == 0 else {"trials": []})}


def markdown(digits: dict[str, Any]) -> list[str]:
    lines = ["", f"Digits CNN: {digits['parameters']} parameters, trained {digits['epochs']} epochs "
             f"({digits['train_s']:.1f} s) on {digits['train_items']} images; {digits['accuracy']:.2f}% on the "
             f"{digits['held_out']} held out (all of them, in this process). autotune judges its search part; "
             f"batch {BATCH}.", "",
             "| eval data | backend | precision | ms/batch | accuracy % (95%) | drop points (95%) | top-1 agreement |",
             "|---|---|---|---|---|---|---|"]
    lines += [cnn_row(run) for run in digits.get("runs", [])]
    return lines + mobile_lines(digits["mobile"]) if "runs" in digits["mobile"] else lines


def quality_cells(run: dict[str, Any]) -> str:
    q = run.get("quality") or {}
    return (f"| {number(run.get('latency_p50_ms'), '.3f')} | {q['value']:.2f} {interval(q.get('interval'))} "
            f"| {number(q.get('drop'), '+.2f')} {interval(q.get('drop_interval'))} "
            f"| {number(q.get('top1_agreement'), '.1%')} |")


def failed(run: dict[str, Any], cells: int) -> str | None:
    if run["ok"] and run.get("quality"):
        return None
    return f"| failed: {run.get('reason', 'no quality in its JSON')[:160]} " + "| " * (cells - 1) + "|"


def cnn_row(run: dict[str, Any]) -> str:
    head = f"| {run['eval_data']} | {run['backend']} | {run['precision']} "
    return head + (failed(run, 4) or quality_cells(run))


def mobile_lines(mobile: dict[str, Any]) -> list[str]:
    lines = ["", f"Depthwise-separable net (benchmarks/models/digits.py's `DigitsMobile`): {mobile['parameters']} "
             f"parameters, trained {mobile['epochs']} epochs ({mobile['train_s']:.1f} s) on {mobile['train_items']} "
             f"images; {mobile['accuracy']:.2f}% on the {mobile['held_out']} held out (in this process). Each row one "
             f"`autotune bench --eval-data digits_eval.pt --batch-size {BATCH}`; the drop limit below is "
             f"{LIMIT:g} point(s).", "",
             "| configuration | ms/batch | accuracy % (95%) | drop points (95%) | top-1 agreement | kept in fp32 "
             f"| within {LIMIT:g} pt |", "|---|---|---|---|---|---|---|"]
    for run in mobile["runs"]:
        q = run.get("quality") or {}
        kept = ", ".join(run.get("kept_fp32") or []) or "-"
        within = "-" if q.get("drop") is None else ("yes" if q["drop"] <= LIMIT else "**no**")
        lines.append(f"| {run['label']} " + (failed(run, 6) or f"{quality_cells(run)} {kept} | {within} |"))
    return lines + search_lines(mobile.get("search"))


def search_lines(search: dict[str, Any] | None) -> list[str]:
    if not search:
        return []
    if search["exit"] != 0:
        return ["", f"The search (`--max-quality-drop {LIMIT:g}`) exited {search['exit']}: see "
                f"fallback_search/search.log."]
    lines = ["", f"`autotune search --max-quality-drop {LIMIT:g}` over int8_fallback alone (backend=inductor "
             f"precision=int8 pinned; the baseline is PyTorch's defaults, eager fp32): {len(search['trials'])} trials "
             f"in {search['wall_s'] / 60:.1f} min with its confirmation. {search.get('message') or ''}"]
    rechecked = search.get("rechecked")
    if rechecked and "drop" in rechecked:
        lines += ["", f"Its recommended trial {rechecked['trial']} re-checked on the confirmation's own "
                  f"{rechecked.get('items', '')} items: accuracy {rechecked['value']:.2f}%, a drop of "
                  f"{rechecked['drop']:+.2f} points {interval(rechecked['drop_interval'])} against fp32's "
                  f"{rechecked['reference_value']:.2f}%: {'within' if rechecked['within_limit'] else 'NOT within'} "
                  f"{LIMIT:g}."]
    lines += ["", "| trial | knobs | ms/batch | accuracy % | drop points (95%) | feasible |",
              "|---|---|---|---|---|---|"]
    for trial in search["trials"]:
        q = trial.get("quality") or {}
        lines.append(f"| {trial['number']} | {trial['knobs'] or trial['state']} "
                     f"| {number(trial.get('latency_p50_ms'), '.3f')} | {number(q.get('value'), '.2f')} "
                     f"| {number(q.get('drop'), '+.2f')} {interval(q.get('drop_interval'))} "
                     f"| {trial.get('feasible')} |")
    return lines
