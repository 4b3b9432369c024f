"""Inside the benchmark child: the model from its source (a torchvision name, a factory, a saved
file, a transformers model) and the model knobs the plan gave the child (torch is imported inside
functions)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from autotune.model import hf
from autotune.model.batches import explain
from autotune.model.errors import LOAD_FAILED, ApplyError
from autotune.model.knobs import KNOBS, MODEL_KNOBS, ModelKnobs


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
