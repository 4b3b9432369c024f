"""The flags several commands share, each declared once: names, defaults, ranges and help.

Typed at the edge: click checks ranges, and values that need the package's own rules (the
tolerance) are checked here too, so that a command's body only sees valid values.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from autotune.base.errors import AutotuneError
from autotune.base.thresholds import CONFIRM_ROUNDS, CONFIRM_SHARE, MIN_EFFECT
from autotune.child.settings import CACHE_DIR, MeasureSettings
from autotune.measure import requests, sequential
from autotune.measure.objectives import MIN_ROUNDS, min_rounds
from autotune.model import hf
from autotune.model.convert import TOLERANCE
from autotune.model.quantize import CALIBRATION_BATCHES

MEASURE = MeasureSettings()  # the protocol's defaults, shown in --help

MODEL_HELP = ("torchvision classification model (resnext101, resnet50, ...), pkg.module:factory "
              "(importable from here), a TorchScript .pt or an exported .pt2 file, or a transformers model: "
              "hf:TYPE (bert, roberta, ...: random weights) or hf:FOLDER (written by save_pretrained).")
SHAPE_HELP = "One input item's shape, e.g. 3x224x224 (default for image models) or 128."
INPUTS_HELP = ("Your own inputs instead of random ones: a torch.save file of a tensor, a tuple or a dict of "
               "tensors, items along dim 0 (integer token ids work).")

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]
EVAL_DATA_HELP = ("Your data to judge quality on, beside the speed: labelled inputs (a torch.save file of "
                  "{'inputs': X, 'labels': Y}, or a folder of class folders of images), or for --task generate a "
                  "text file (perplexity, KL divergence). int8 calibrates on a part of it; the rest is held out "
                  "(docs/quality.md).")


def eval_data_option(func: Any) -> Any:
    func = click.option("--eval-direction", type=click.Choice(["higher", "lower"]),
                        help="With --eval: whether a higher or a lower value of the metric is better.")(func)
    func = click.option("--eval", "eval_metric", metavar="MODULE:FUNCTION",
                        help="Your own quality metric: FUNCTION(model, batches) returns a float, called with each "
                             "configuration (as autotune.apply returns it) and with fp32 eager, on --eval-data's "
                             "held-out batches (or none).")(func)
    return click.option("--eval-data", type=click.Path(), help=EVAL_DATA_HELP)(func)


class Finite(click.FloatRange):
    """click's FloatRange, refusing nan and inf too (its comparisons let nan through, and inf
    through a range open above): every float flag is one of these."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def study_options(study_help: str = "Study name (default: the newest in studies/).",
                   storage_help: str = "Optuna storage URL, if not a study under studies/.") -> Decorator:
    def add(func: Any) -> Any:
        func = click.option("--storage", help=storage_help)(func)
        return click.option("--study", "study_name", help=study_help)(func)

    return add


def timeout_option(func: Any) -> Any:
    return click.option("--timeout", default=900.0, show_default=True, type=Finite(min=1),
                        help="Seconds before one run is killed and recorded as failed.")(func)


def min_effect_option(func: Any) -> Any:
    return click.option("--min-effect", default=MIN_EFFECT, show_default=True, type=Finite(min=0, max=10),
                        help="Smallest gain over the baseline worth recommending (0.03 = 3%).")(func)


def rounds_option(name: str, help_text: str) -> Decorator:
    return click.option(name, default=10, show_default=True, type=click.IntRange(min=MIN_ROUNDS),
                        help=f"{help_text} ({MIN_ROUNDS} at least for one candidate, {min_rounds(3)} for three: "
                             f"fewer can never be significant after Holm's correction).")


def confirm_rounds_option(name: str, noun: str) -> Decorator:
    """The cap on a confirmation's rounds: it stops as soon as its verdict is decided."""
    first = sequential.design(CONFIRM_ROUNDS, 3).looks[0].rounds
    return click.option(name, default=CONFIRM_ROUNDS, show_default=True, type=click.IntRange(min=MIN_ROUNDS),
                        help=f"The most interleaved rounds {noun} runs, each contender once per round in a fresh "
                             f"process: it looks at them a few times and stops as soon as every decision is made "
                             f"(a clear winner at the first look, after {first} rounds for three candidates), and "
                             f"says what is still undecided at this cap. With --time-budget, it also stops before "
                             f"a look that would take it past {CONFIRM_SHARE:.0%} of the budget. {MIN_ROUNDS} at "
                             f"least for one candidate, {min_rounds(3)} for three.")


def order_seed_option(func: Any) -> Any:
    return click.option("--seed", type=int, help="Seed of the rounds' random balanced order (default: a random "
                                                  "one, recorded with the verdict).")(func)


def json_option(func: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document on stdout instead of tables (progress stays on stderr).")(func)


def no_wait_option(func: Any) -> Any:
    return click.option("--no-wait", is_flag=True,
                        help="Fail at once (exit 2) if another autotune is measuring on this machine, "
                             "instead of waiting for it.")(func)


def cache_dir_option(func: Any) -> Any:
    return click.option("--cache-dir", default=Path(CACHE_DIR), show_default=True,
                        type=click.Path(path_type=Path, file_okay=False),
                        help="Where compiled artifacts (TorchScript, AOTInductor) and inductor kernels live.")(func)


def measure_options(func: Any) -> Any:
    """The in-process protocol, shared by bench and search."""
    func = click.option("--tolerance", type=float, callback=check_tolerance,
                        help="Relative error allowed against eager fp32 (default: "
                             f"{TOLERANCE['fp32']:g} fp32, {TOLERANCE['bf16']:g} bf16); for every int8 the share of "
                             f"inputs whose top-1 answer may change and 1 - the lowest cosine similarity allowed "
                             f"(default {TOLERANCE['int8']:g}).")(func)
    func = calibration_option(func)
    func = click.option("--min-iterations", default=MEASURE.min_iterations, show_default=True,
                        type=click.IntRange(min=1),
                        help="Timed samples at least, per process.")(func)
    func = click.option("--duration", default=MEASURE.duration_s, show_default=True, type=Finite(min=0.1),
                        help="Seconds of timed samples at least, per process (a common window).")(func)
    func = click.option("--warmup-time", default=MEASURE.warmup_s, show_default=True, type=Finite(min=0),
                        help="Seconds of untimed warmup at least.")(func)
    func = click.option("--warmup", default=MEASURE.warmup, show_default=True, type=click.IntRange(min=0),
                        help="Untimed warmup iterations at least.")(func)
    return cache_dir_option(timeout_option(func))


def calibration_option(func: Any) -> Any:
    return click.option("--calibration-batches", type=click.IntRange(min=1),
                        help=f"precision=int8: batches of the inputs (random, or --example-inputs) the "
                             f"quantizer observes (default {CALIBRATION_BATCHES}).")(func)


def check_tolerance(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    return None if value is None else requests.check_tolerance(value, "--tolerance ")


DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, flag: str, zero: bool = False) -> float:
    """Seconds from `90s`, `20m`, `1.5h` or `7d` (and `0d` where `zero`: `cache --older-than 0d`,
    everything). A bare number is refused: `--time-budget 15` read as seconds stopped a search a
    user meant to last 15 minutes."""
    number, unit = text[:-1], text[-1:].lower()
    try:
        seconds = float(number) * DURATION_UNITS[unit]
    except (ValueError, KeyError):
        seconds = float("nan")
    if not (seconds >= 0 if zero else seconds > 0) or seconds == float("inf"):
        what = "a number" if zero else "a positive number"
        raise AutotuneError(f"{flag} {text!r} is not a duration; give {what} with s, m, h or d, like 20m or 7d")
    return seconds


def duration_option(name: str, help_text: str, zero: bool = False) -> Decorator:
    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
        return None if value is None else parse_duration(value, name, zero)

    return click.option(name, callback=check, help=help_text)


def settings(warmup: int, warmup_time: float, duration: float, min_iterations: int) -> MeasureSettings:
    return MeasureSettings(warmup=warmup, warmup_s=warmup_time, duration_s=duration, min_iterations=min_iterations)


def text_options(func: Any) -> Any:
    """The inputs and head of a transformers model (`--model hf:...`)."""
    func = _sized(func)
    func = click.option("--task", type=click.Choice(list(hf.TASKS)),
                        help=f"The head of an hf: model (default {hf.DEFAULT_TASK}); its output is what is "
                             f"timed and checked. generate: a causal LM's requests, a prefill over the prompt "
                             f"and one decode step per new token.")(func)
    func = click.option("--new-tokens", type=click.IntRange(min=1),
                        help=f"--task generate: tokens generated per request (default {hf.DEFAULT_NEW_TOKENS}).")(func)
    func = click.option("--model-size", metavar="SIZE",
                        help="An hf:TYPE model's configuration scaled to about SIZE parameters (0.5b, 125m, ...; "
                             "random weights), the same as --model hf:TYPE@SIZE.")(func)
    func = click.option("--seq-len-weights", metavar="W,W,...",
                        help="The share of requests at each length of --seq-lens (default: equal), e.g. 5,3,1.")(func)
    func = click.option("--seq-lens", metavar="N,N,...",
                        help="Sequence-length buckets of an hf: text model, increasing, e.g. 32,128,384: each "
                             "configuration is measured at every length (one compiled model each) and their "
                             "weighted mean is optimised; apply serves any length up to the largest.")(func)
    return click.option("--seq-len", "--prompt-len", "seq_len", type=click.IntRange(min=1),
                        help=f"Tokens per item of an hf: text model's random inputs, a prompt's with --task "
                             f"generate (default {hf.DEFAULT_SEQ_LEN}).")(func)


def _sized(func: Any) -> Any:
    """The command with `--model-size` folded into `--model` (hf:TYPE@SIZE), the one form the rest reads."""

    @functools.wraps(func)
    def folded(*args: Any, model_size: str | None = None, **kwargs: Any) -> Any:
        if model_size is not None:
            model = kwargs.get("model") or ""
            if not hf.is_source(model) or hf.SIZE_MARK in model:
                raise click.UsageError("--model-size scales an hf:TYPE model (e.g. --model hf:qwen2 --model-size "
                                       "0.5b); give --model hf:TYPE without a size")
            kwargs["model"] = f"{model}{hf.SIZE_MARK}{model_size}"
        return func(*args, **kwargs)

    return folded


def model_options(func: Any) -> Any:
    func = click.option("--batch-size", default=1, show_default=True, type=int,
                        help="Items per forward call.")(func)
    func = click.option("--set", "assignments", multiple=True, metavar="KNOB=VALUE",
                        help="Set a knob (repeatable); `autotune knobs` lists them.")(func)
    func = click.option("--model", required=True, help=MODEL_HELP)(func)
    func = click.option("--input-shape", help=SHAPE_HELP)(func)
    func = click.option("--example-inputs", type=click.Path(dir_okay=False), help=INPUTS_HELP)(func)
    return text_options(func)
