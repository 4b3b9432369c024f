"""Inside the benchmark child: the model built as the knobs say, through `autotune.apply`, from its
source (`sources`) and guarded on the inputs that feed it (`inputs`); int8's calibration, --task
generate's model (torch is imported inside functions)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.child.inputs import SavedInputs, batches, dataset_for, dataset_of
from autotune.child.sources import knobs_of, load_model
from autotune.model import apply, hf, quantize, references
from autotune.model.apply import Deployment
from autotune.model.artifacts import description
from autotune.model.batches import call, leaves
from autotune.model.buckets import Buckets
from autotune.model.knobs import ModelKnobs

CALIBRATION_SEED, GUARD_SEED = 1, 2  # random inputs that the timed ones (seed 0) and each other never repeat


def int8_batches(args: argparse.Namespace, knobs: ModelKnobs) -> tuple[list[Any], list[Any]]:
    """precision=int8's calibration batches and the guard's held-out ones of every int8 (none
    for the others; int8_dynamic and int8_weight_only calibrate nothing): random inputs of their
    own, or a user's `--example-inputs` (calibration from the first items, the guard from the next,
    cycling when the file holds fewer)."""
    if not knobs.quantized:
        return [], []
    size, count = args.batch_size, args.calibration_batches if knobs.precision == "int8" else 0
    guard_count = -(-quantize.GUARD_ITEMS // size)
    if getattr(args, "eval_data", ""):
        return eval_batches(args, count, guard_count)
    calibration = dataset_of(args, count * size, CALIBRATION_SEED)
    guard = dataset_of(args, guard_count * size, GUARD_SEED)
    offset = count * size if args.example_inputs else 0
    return batches(calibration, count, size, 0), batches(guard, guard_count, size, offset)


def eval_batches(args: argparse.Namespace, count: int, guard_count: int) -> tuple[list[Any], list[Any]]:
    """With `--eval-data`: int8 calibrates on its calibration items (`evaldata`), cycled to `count`
    batches, and the guard compares the first items of the search's part, never the same items."""
    from autotune.child import evaldata

    data = evaldata.load_labelled(args.eval_data, tuple(int(n) for n in args.item_shape.split("x")))
    size = args.batch_size
    calibration, search = SavedInputs.of(data.part("calibration").inputs), SavedInputs.of(data.part("search").inputs)
    return batches(calibration, count, size, 0), batches(search, guard_count, size, 0)


def build(args: argparse.Namespace, example: Any, setup: dict[str, Any],
          on_phase: Callable[[str], None] | None = None) -> Callable[[Any], Any]:
    """Load the model and apply the knobs through `autotune.apply`, the same call a user's program
    makes; every non-default configuration is checked against eager fp32 on the same input.
    `on_phase` hears when a compiled artifact is built or loaded. A compiled configuration of a
    torchvision model whose artifact and eager outputs are kept (`references`) loads the artifact
    without building the model."""
    setup["model"] = args.model
    knobs = knobs_of(args)
    if args.task == hf.GENERATE:
        return _generation(args, example, knobs, setup, on_phase)
    artifacts = Path(args.artifacts) if args.artifacts else Path(args.cache_dir, "artifacts")
    lengths = Buckets.parse(args.seq_lens).lengths if args.seq_lens and knobs.shapes == "dynamic" else ()
    deployment = Deployment(knobs, args.tolerance, artifacts, "the benchmark plan", lengths)
    if knobs.is_default:
        return _timed_first_call(_load_timed(args, setup), example, setup)
    calibration, guard = int8_batches(args, knobs)
    checked = apply.checked_batches(example, deployment, calibration, guard)
    entry = references.entry_path(Path(args.cache_dir), args.model, checked) \
        if knobs.compiled and references.applies(args.model) else None
    known = references.lookup(entry) if entry else None
    saved = apply.apply_saved(example, deployment, known.weights, known.outputs, setup=setup, on_phase=on_phase,
                               calibration=calibration, guard_inputs=guard) if known else None
    setup["eager_model"] = "kept outputs" if saved else "built"
    if saved:
        return saved.run
    model = _load_timed(args, setup)
    outputs = known.outputs if known else apply.eager_outputs(model, checked)  # 33 eager batches for int8
    applied = apply.apply_deployment(model, example, deployment, check=True, setup=setup, on_phase=on_phase,
                                      calibration=calibration, guard_inputs=guard, references=outputs)
    if entry and known is None and "artifact_file" in setup and "aot_fallback" not in setup:
        references.remember(entry, references.Known(artifacts_weights(setup["artifact_file"]), outputs))
    return applied.run


def _generation(args: argparse.Namespace, example: Any, knobs: ModelKnobs, setup: dict[str, Any],
                on_phase: Callable[[str], None] | None) -> Callable[[Any], Any]:
    """--task generate: the causal LM as the knobs say, guarded on held-out prompts, its first request timed."""
    import torch

    from autotune.child.generating import GUARD_LENGTH, build_generation, first_request
    from autotune.model.generate.measure import GUARD_PROMPTS, prompts_of

    shape = tuple(int(n) for n in args.item_shape.split("x"))
    tokens = hf.token_inputs(args.model, args.task)
    model = _load_timed(args, setup)
    if getattr(args, "eval_data", ""):  # the user's text: the first tokens of the search's first windows
        from autotune.child import evaldata, quality

        windows = evaldata.window_part(quality.generation_windows(args, model.config), "search")
        guard_prompts = torch.stack([w[:GUARD_LENGTH] for w in windows[:GUARD_PROMPTS]])
        setup["guard_inputs"] = "eval data"
    else:
        guard = dataset_for((min(shape[0], GUARD_LENGTH),), pool=GUARD_PROMPTS, seed=GUARD_SEED, tokens=tokens)
        guard_prompts = prompts_of(batches(guard, 1, GUARD_PROMPTS, 0)[0])
        setup["guard_inputs"] = "random tokens"
    made = build_generation(args, model, knobs, guard_prompts, setup, on_phase)
    first_request(made, example, setup)
    return made


def _load_timed(args: argparse.Namespace, setup: dict[str, Any]) -> Any:
    start = time.perf_counter()
    model = load_model(args.model, args.import_path, args.task)
    setup["build_s"] = time.perf_counter() - start
    return model


def artifacts_weights(artifact_file: str) -> str:
    """The weights' fingerprint an artifact was saved for, from its description."""
    return str(description(artifact_file)["weights"])


def _timed_first_call(model: Any, example: Any, setup: dict[str, Any]) -> Callable[[Any], Any]:
    """PyTorch's defaults: the model as it is, its first call timed like a converted one's."""
    import torch

    def forward(batch: Any) -> Any:
        with torch.no_grad():
            return call(model, batch)

    start = time.perf_counter()
    output = forward(example)
    setup["first_forward_s"] = time.perf_counter() - start
    setup["output_dtype"] = str(leaves(output)[0].dtype).replace("torch.", "")
    setup["output_digest"] = apply.digest(output)
    return forward
