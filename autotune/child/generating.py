"""Inside the benchmark child, `--task generate`: the causal LM built as the knobs say (through
`autotune.model.generate.generator`, the call `apply` makes), checked against fp32 eager on
held-out prompts, and wrapped for the timed loop (`Generation`: a sample is one request)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.model import generate
from autotune.model.generate import measure
from autotune.model.generate.pytorch import TorchGenerator, weight_bytes

GUARD_LENGTH = 64  # tokens of each guard prompt at most: its logits at every position are kept


def build_generation(args: argparse.Namespace, model: Any, knobs: Any, guard_prompts: Any, setup: dict[str, Any],
                     on_phase: Callable[[str], None] | None = None) -> measure.Generation:
    """The generation the knobs ask for, guarded; `model` is the fp32 causal LM (converted in place)."""
    new_tokens = int(args.item_shape.split("x")[1])
    if knobs.is_default:  # PyTorch's defaults: transformers' model as it is, its dynamic cache
        setup["weight_bytes"] = weight_bytes(model)
        made = measure.Generation(TorchGenerator(model, False, False), new_tokens)
    else:
        reference = TorchGenerator(model, False, False).logits(guard_prompts)
        if on_phase and knobs.backend != "eager":
            on_phase("compiling" if knobs.backend == "inductor" else "converting")
        cache = Path(args.artifacts) if args.artifacts else Path(args.cache_dir, "artifacts")
        generator = generate.generator(model, knobs, setup, spec=args.model, cache=cache)
        del model
        figures = measure.logits_agreement(reference, measure.logits_of(generator, guard_prompts))
        measure.judge(figures, knobs.describe(), knobs.precision, args.tolerance, setup)
        made = measure.Generation(generator, new_tokens)
    return made


def first_request(made: measure.Generation, example: Any, setup: dict[str, Any]) -> None:
    """The first request, timed apart (a compiled decode step compiles in it), and its tokens' digest."""
    start = time.perf_counter()
    tokens = made(example)
    setup["first_request_s"] = time.perf_counter() - start
    setup["output_digest"] = [float(t) for t in tokens[0, :8]]
