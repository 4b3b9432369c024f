"""Inside the benchmark child: the model as the knobs say, and the guard on its answers.

torch is imported inside functions, so the parent may read TOLERANCE without loading it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autotune.child.names import safe_name

# Relative error allowed against eager fp32 on the same input, per precision (`--tolerance`).
TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}


class BenchError(Exception):
    """A configuration that cannot run or answers wrongly, with the reason."""


class SyntheticImages:
    """Fixed-size uint8 images through the usual preprocessing: resize, center crop, normalize."""

    def __init__(self, item_shape: tuple[int, ...], pool: int = 8) -> None:
        import torch

        channels, height, width = item_shape
        generator = torch.Generator().manual_seed(0)
        raw_h, raw_w = height * 375 // 224, width * 500 // 224
        self.images = [torch.randint(0, 256, (channels, raw_h, raw_w), dtype=torch.uint8,
                                     generator=generator) for _ in range(pool)]
        self.resize = height * 256 // 224
        self.crop = (height, width)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        import torch
        from torchvision.transforms.v2 import functional as F

        image = F.resize(self.images[index % len(self.images)], [self.resize], antialias=True)
        image = F.center_crop(image, list(self.crop))
        image = F.to_dtype(image, torch.float32, scale=True)
        return F.normalize(image, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])


class SyntheticTensors:
    """Non-image inputs: a pool of standard-normal float tensors of the item shape."""

    def __init__(self, item_shape: tuple[int, ...], pool: int = 8) -> None:
        import torch

        generator = torch.Generator().manual_seed(0)
        self.items = [torch.randn(item_shape, generator=generator) for _ in range(pool)]

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        return self.items[index % len(self.items)]


def dataset_for(item_shape: tuple[int, ...]) -> Any:
    image = len(item_shape) == 3 and item_shape[0] == 3 and item_shape[1] >= 32
    return SyntheticImages(item_shape) if image else SyntheticTensors(item_shape)


def load_model(spec: str, import_path: str) -> Any:
    """A torchvision name, `pkg.module:factory`, a TorchScript `.pt` or an exported `.pt2`.

    Random initialisation is seeded: every process builds the same weights, so a weight cache
    written by one process matches the reference another computes (the guard would catch it).
    """
    import torch

    torch.manual_seed(0)
    if spec.endswith(".pt2"):
        return torch.export.load(spec).module()
    if spec.endswith(".pt"):
        return torch.jit.load(spec)
    if ":" in spec:
        module_name, _, factory = spec.partition(":")
        if import_path and import_path not in sys.path:
            sys.path.insert(0, import_path)
        try:
            made = getattr(importlib.import_module(module_name), factory)()
        except Exception as exc:
            raise BenchError(f"model factory {spec} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(made, torch.nn.Module):
            raise BenchError(f"model factory {spec} returned {type(made).__name__}, not a torch.nn.Module")
        return made.eval()
    import torchvision

    return torchvision.models.get_model(spec, weights=None).eval()


def build(args: argparse.Namespace, example: Any, setup: dict[str, Any]) -> Callable[[Any], Any]:
    """Load, convert as the knobs say, check the answers, and return forward(batch)."""
    import torch

    start = time.perf_counter()
    model = load_model(args.model, args.import_path)
    setup["build_s"] = time.perf_counter() - start
    guarded = (args.mkldnn == "on" or args.precision != "fp32" or args.backend != "eager"
               or args.memory_format != "contiguous" or args.weight_cache == "on")
    with torch.no_grad():
        reference = leaves(model(example)) if guarded else None
    forward = convert(model, args, example, setup)
    with torch.no_grad():
        start = time.perf_counter()
        output = forward(example)
        setup["first_forward_s"] = time.perf_counter() - start  # compile time for inductor
    setup["output_dtype"] = str(leaves(output)[0].dtype).replace("torch.", "")
    if reference is not None:
        check(reference, leaves(output), args, setup)
    return forward


def convert(model: Any, args: argparse.Namespace, example: Any, setup: dict[str, Any]) -> Callable[[Any], Any]:
    import torch

    mkldnn = args.mkldnn == "on"
    channels_last = args.memory_format == "channels_last"
    if mkldnn:
        from torch.utils import mkldnn as mkldnn_utils

        start = time.perf_counter()
        model = mkldnn_utils.to_mkldnn(model)
        setup["mkldnn_convert_s"] = time.perf_counter() - start
        probe_mkldnn(model, example)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        example = example.contiguous(memory_format=torch.channels_last)
    if args.backend == "torchscript" or args.weight_cache == "on":
        model = cached_model(model, args, example, setup)
    elif args.backend == "inductor":
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        model = torch.compile(model, backend="inductor")

    def forward(batch: Any) -> Any:
        if channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        if mkldnn:
            return model(batch.to_mkldnn()).to_dense()
        with autocast(args.precision):
            return model(batch)

    return forward


@contextlib.contextmanager
def autocast(precision: str) -> Iterator[None]:
    if precision == "bf16":
        import torch

        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield
    else:
        yield


def leaves(output: Any) -> list[Any]:
    """The tensors of a model output (a tensor, a tuple, a dict, a namedtuple ...)."""
    import torch
    from torch.utils import _pytree

    found = [x for x in _pytree.tree_leaves(output) if isinstance(x, torch.Tensor)]
    if not found:
        raise BenchError(f"the model returned {type(output).__name__} with no tensor in it")
    return found


def check(reference: list[Any], output: list[Any], args: argparse.Namespace, setup: dict[str, Any]) -> None:
    """The correctness guard: max abs and relative error against eager fp32 on the same input."""
    import torch

    ref = torch.cat([r.float().flatten() for r in reference])
    out = torch.cat([o.float().flatten() for o in output])
    if ref.shape != out.shape:
        raise BenchError(f"output shape changed: {tuple(out.shape)} instead of eager fp32's {tuple(ref.shape)}")
    abs_err = float((out - ref).abs().max())
    rel_err = abs_err / max(float(ref.abs().max()), 1e-12)
    tolerance = args.tolerance if args.tolerance >= 0 else TOLERANCE[args.precision]
    setup.update(max_abs_err=abs_err, max_rel_err=rel_err, tolerance=tolerance)
    if not rel_err <= tolerance:
        raise BenchError(f"wrong answers: output differs from eager fp32 by max relative error {rel_err:.3g} "
                         f"(max abs {abs_err:.3g}) > tolerance {tolerance:g}; raise --tolerance to accept it")


def probe_mkldnn(model: Any, example: Any) -> None:
    """Run once with a module stack, so an op without an mkldnn kernel is named with its module."""
    import torch

    stack: list[str] = []
    names = {id(m): f"{n or 'model'} ({type(m).__name__})" for n, m in model.named_modules()}

    def enter(module: Any, inputs: Any) -> None:
        stack.append(names[id(module)])

    def leave(module: Any, inputs: Any, output: Any) -> None:
        stack.pop()

    handles = []
    for module in model.modules():
        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        with torch.no_grad():
            model(example.to_mkldnn()).to_dense()
    except Exception as exc:
        text = str(exc)
        op = re.search(r"aten::\w+", text)
        where = f" in module {stack[-1]}" if stack else ""
        detail = (text.strip().splitlines() or [""])[0][:160]
        raise BenchError(
            f"mkldnn: {op.group(0) if op else 'an operator'}{where} has no mkldnn (oneDNN layout) "
            f"kernel ({detail}); use mkldnn=off for this model"
        ) from exc
    finally:
        for handle in handles:
            handle.remove()


def cached_model(model: Any, args: argparse.Namespace, example: Any, setup: dict[str, Any]) -> Any:
    """A saved TorchScript file, loaded back so weights are laid out once (seed recipe 2.c).

    Dense models: trace + freeze (under autocast for bf16). mkldnn models: script, because a
    frozen or traced mkldnn module cannot be saved (opaque weights); a scripted one saves dense
    weights and reorders them once at load. backend=torchscript also runs optimize_for_inference
    on the loaded module (its result cannot be saved, so it is redone per process).
    """
    import torch

    path = weight_cache_path(args, torch.__version__)
    setup["weight_cache_file"] = str(path)
    setup["weight_cache_hit"] = path.exists()
    if not path.exists():
        start = time.perf_counter()
        with torch.no_grad(), autocast(args.precision):
            if args.mkldnn == "on":
                scripted = torch.jit.script(model)
            else:
                scripted = torch.jit.freeze(torch.jit.trace(model, example, check_trace=False))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.jit.save(scripted, str(tmp))
        os.replace(tmp, path)
        setup["trace_s"] = time.perf_counter() - start
    start = time.perf_counter()
    loaded = torch.jit.load(str(path))
    if args.backend == "torchscript":
        loaded = torch.jit.optimize_for_inference(loaded)
    setup["weight_cache_load_s"] = time.perf_counter() - start
    return loaded


def _factory_file(spec: str) -> str | None:
    if ":" not in spec:
        return None
    module = sys.modules.get(spec.partition(":")[0])
    return getattr(module, "__file__", None)


def weight_cache_path(args: argparse.Namespace, torch_version: str) -> Path:
    """Keyed by everything that changes the saved file."""
    model_id = args.model
    source = args.model if args.model.endswith((".pt", ".pt2")) else _factory_file(args.model)
    if source:  # a user's file: an edit must not reuse the old trace
        stat = os.stat(source)
        model_id = f"{args.model}:{os.path.abspath(source)}:{stat.st_size}:{stat.st_mtime_ns}"
    key = json.dumps(["seeded-v2", model_id, args.item_shape, args.batch_size, "float32", args.mkldnn,
                      args.memory_format, args.precision, torch_version])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    stem = safe_name(Path(args.model).stem if "/" in args.model else args.model)
    return Path(args.cache_dir, "weights", f"{stem}-{digest}.pt")
