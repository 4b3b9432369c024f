"""Inside the benchmark child: the model from its source, the synthetic inputs that feed it, and
the knobs applied through `autotune.apply` (torch is imported inside functions)."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.model import apply, hf, quantize, references
from autotune.model.apply import Deployment
from autotune.model.artifacts import description
from autotune.model.batches import call, explain, leaves
from autotune.model.buckets import Buckets
from autotune.model.errors import LOAD_FAILED, ApplyError
from autotune.model.knobs import KNOBS, MODEL_KNOBS, ModelKnobs


class SyntheticImages:
    """Fixed-size uint8 images through the usual preprocessing: resize, center crop, normalize."""

    def __init__(self, item_shape: tuple[int, ...], pool: int = 8, seed: int = 0) -> None:
        import torch

        channels, height, width = item_shape
        generator = torch.Generator().manual_seed(seed)
        raw_h, raw_w = height * 375 // 224, width * 500 // 224
        self.images = [torch.randint(0, 256, (channels, raw_h, raw_w), dtype=torch.uint8,
                                     generator=generator) for _ in range(pool)]
        self.resize = height * 256 // 224
        self.crop = (height, width)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        return preprocess(self.images[index % len(self.images)], self.resize, self.crop)


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, as torchvision's models expect


def preprocess(image: Any, short_side: int, crop: tuple[int, int]) -> Any:
    """torchvision's `Resize(short_side, antialias=True)`, `CenterCrop`, `ToDtype(float32, scale=True)`
    and `Normalize` on a uint8 CHW image, the same torch calls in the same order (a test holds them
    equal), without importing torchvision: a process that loads a compiled model needs nothing else
    from it, and importing it costs ~2 s (it imports torch._dynamo)."""
    import torch

    height, width = image.shape[-2:]
    size = [short_side, int(short_side * width / height)] if height <= width else \
        [int(short_side * height / width), short_side]
    native = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")  # torchvision resizes uint8 natively then
    resized = image[None] if native else image[None].float()
    resized = torch.nn.functional.interpolate(resized, size=size, mode="bilinear", align_corners=False,
                                              antialias=True)
    resized = resized[0] if native else resized[0].round_().to(torch.uint8)
    top, left = round((size[0] - crop[0]) / 2.0), round((size[1] - crop[1]) / 2.0)
    cropped = resized[..., top:top + crop[0], left:left + crop[1]]
    scaled = cropped.to(torch.float32).mul_(1.0 / 255)
    mean, std = torch.as_tensor(MEAN).view(-1, 1, 1), torch.as_tensor(STD).view(-1, 1, 1)
    return scaled.sub(mean).div_(std)


class SyntheticTensors:
    """Non-image inputs: a pool of standard-normal float tensors of the item shape."""

    def __init__(self, item_shape: tuple[int, ...], pool: int = 8, seed: int = 0) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        self.items = [torch.randn(item_shape, generator=generator) for _ in range(pool)]

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        return self.items[index % len(self.items)]


class SyntheticTokens:
    """Text inputs: a pool of token id sequences drawn uniformly from the model's vocabulary, with a
    full attention mask and token type ids (zeros) where the model takes them; each item a dict of
    1-D int64 tensors, which DataLoader's collate stacks into [batch, length]."""

    def __init__(self, length: int, tokens: hf.Tokens, pool: int = 8, seed: int = 0) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        made = {"attention_mask": torch.ones, "token_type_ids": torch.zeros}
        self.items = [{name: ids if name == "input_ids" else made[name](length, dtype=torch.int64)
                       for name in tokens.names}
                      for ids in (torch.randint(0, tokens.vocab_size, (length,), generator=generator)
                                  for _ in range(pool))]

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        return self.items[index % len(self.items)]


class SpreadTokens:
    """Text inputs for a model that takes any length, standing for a bucket's requests: the first
    batch `longest` tokens long (the example a dynamic model is exported and guarded at), then batches
    cycling through `lengths` (`buckets.spread`), so that a round's sweep holds one of each."""

    def __init__(self, longest: int, lengths: tuple[int, ...], tokens: hf.Tokens, batch_size: int, pool: int = 8,
                 seed: int = 0) -> None:
        self.batch_size, self.lengths = batch_size, lengths
        self.first = SyntheticTokens(longest, tokens, pool, seed)
        self.pools = {length: SyntheticTokens(length, tokens, pool, seed) for length in lengths}

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        if index < self.batch_size:
            return self.first[index]
        return self.pools[self.lengths[(index // self.batch_size - 1) % len(self.lengths)]][index]


class SavedInputs:
    """A user's own inputs (`--example-inputs FILE`): items are slices along dim 0 of a saved
    tensor, tuple/list of tensors, or dict of tensors, cycled; integer token ids stay integers."""

    def __init__(self, path: str) -> None:
        self.items = load_examples(path)
        self.count = example_count(self.items)

    @classmethod
    def of(cls, items: Any) -> SavedInputs:
        """Inputs already in memory (a tensor, tuple or dict of tensors, items along dim 0)."""
        made = cls.__new__(cls)
        made.items, made.count = items, example_count(items)
        return made

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        from torch.utils import _pytree

        return _pytree.tree_map(lambda t: t[index % self.count], self.items)


def load_examples(path: str) -> Any:
    """What `torch.save` put in the file, tensors only (no code is unpickled), or why not."""
    import torch

    try:
        loaded = torch.load(path, weights_only=True)
    except Exception as exc:  # any file that is not a torch.save of tensors; nothing else is unpickled
        raise ApplyError(f"cannot load example inputs {path}: {explain(exc)}; save a tensor, a tuple of "
                         f"tensors or a dict of tensors with torch.save") from None
    example_count(loaded, path)
    return tuple(loaded) if isinstance(loaded, list) else loaded


def example_count(loaded: Any, path: str = "the example inputs") -> int:
    """How many items the saved inputs hold along dim 0 (the same for every tensor)."""
    import torch

    tensors = (list(loaded.values()) if isinstance(loaded, dict) else
               list(loaded) if isinstance(loaded, (list, tuple)) else [loaded])
    if not tensors or not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in tensors):
        raise ApplyError(f"{path} must hold a tensor, a tuple of tensors or a dict of tensors, each with the "
                         f"items along dim 0")
    counts = {int(t.shape[0]) for t in tensors}
    if len(counts) != 1 or 0 in counts:
        raise ApplyError(f"{path}: every tensor needs the same number of items (dim 0), at least 1; found "
                         f"{sorted(counts)}")
    return counts.pop()


def dataset_of(args: argparse.Namespace, pool: int = 8, seed: int = 0) -> Any:
    """The inputs that feed the child's model (`dataset_for`): token ids for an `hf:` model, after the
    first batch cycling over the lengths spread across its bucket where `rounds.per_length` says so
    (`lengths`)."""
    shape = tuple(int(n) for n in args.item_shape.split("x"))
    text = hf.is_source(args.model) and not args.example_inputs
    tokens = hf.token_inputs(args.model, args.task) if text else None
    lengths = tuple(getattr(args, "lengths", shape[:1]))
    if tokens is not None and lengths != shape[:1]:
        return SpreadTokens(shape[0], lengths, tokens, args.batch_size, pool, seed)
    return dataset_for(shape, args.example_inputs, pool, seed, tokens)


def dataset_for(item_shape: tuple[int, ...], example_inputs: str = "", pool: int = 8, seed: int = 0,
                tokens: hf.Tokens | None = None) -> Any:
    """The inputs that feed the model; `pool` distinct random items from `seed` (a user's own
    inputs are what they are); with `tokens`, token ids of the length `item_shape` says."""
    if example_inputs:
        return SavedInputs(example_inputs)
    if tokens is not None:
        return SyntheticTokens(item_shape[0], tokens, pool, seed)
    image = len(item_shape) == 3 and item_shape[0] == 3 and item_shape[1] >= 32
    return SyntheticImages(item_shape, pool, seed) if image else SyntheticTensors(item_shape, pool, seed)


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


def batches(dataset: Any, count: int, size: int, start: int) -> list[Any]:
    from torch.utils.data import default_collate

    return [default_collate([dataset[start + b * size + i] for i in range(size)]) for b in range(count)]


def load_model(spec: str, import_path: str, task: str = "") -> Any:
    """A torchvision name, `pkg.module:factory`, a TorchScript `.pt`, an exported `.pt2`, or a
    transformers model (`hf:`) with the head of `task`, its output the head's tensor (`hf.wrap`).

    Random initialisation is seeded: every process builds the same weights, so a weight cache
    written by one process matches the reference another computes (the guard would catch it).
    """
    import torch

    torch.manual_seed(0)
    if hf.is_source(spec):
        return hf.load(spec, task)
    if spec.endswith((".pt", ".pt2")):
        return _load_file(spec)
    if ":" in spec:
        module_name, _, factory = spec.partition(":")
        if import_path and import_path not in sys.path:
            sys.path.insert(0, import_path)
        try:
            made = getattr(importlib.import_module(module_name), factory)()
        except Exception as exc:
            raise ApplyError(f"model factory {spec} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(made, torch.nn.Module):
            raise ApplyError(f"model factory {spec} returned {type(made).__name__}, not a torch.nn.Module")
        return made.eval()
    import torchvision

    return torchvision.models.get_model(spec, weights=None).eval()


def _load_file(spec: str) -> Any:
    """A TorchScript `.pt` or an exported `.pt2`; one that torch cannot load is the user's file to
    fix, said as such (not as a model that fails on its inputs)."""
    import torch

    exported = spec.endswith(".pt2")
    try:
        # A TorchScript module saved in train mode could not be frozen (weight_cache, torchscript).
        return torch.export.load(spec).module() if exported else torch.jit.load(spec).eval()
    except Exception as exc:
        saver = "torch.export.save" if exported else "torch.jit.save"
        raise ApplyError(f"{LOAD_FAILED} {spec} ({explain(exc)}); save the model with {saver}") from exc


def knobs_of(args: argparse.Namespace) -> ModelKnobs:
    """The model knobs the plan gave this child, as `autotune.apply` takes them."""
    return ModelKnobs.from_values({name: KNOBS[name].parse(getattr(args, name)) for name in MODEL_KNOBS})


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
