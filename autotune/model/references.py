"""What a process that only loads a compiled artifact needs of the eager model, kept from the
process that built it: the weights' fingerprint (half of the artifact's key) and eager fp32's
outputs on the checked inputs (what the guard compares with). With both at hand and the artifact
saved, the benchmark child never builds the eager model and never imports torchvision (which
imports torch._dynamo): ~3 s of every such process on this project's 2-core machine.

Only torchvision models by name qualify: their weights come from a seeded initialisation of the
installed torchvision's code, so the name, the torchvision and torch versions and the CPU name them.
A factory or a model file may change under the same name; they are built every time. Entries live
in `<cache dir>/references/<torch version>/`, one file per model and inputs, written atomically;
an unreadable one counts as absent (the model is built, and the entry written again).

torch is imported inside functions.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.model import cpu
from autotune.model.artifacts import hash_tensor, installed_torch_version
from autotune.model.files import replacing

FOLDER = "references"  # under the cache folder, then one folder per torch version


@dataclass(frozen=True)
class Known:
    """The eager model as the guard and the artifact key see it."""

    weights: str  # artifacts.fingerprint of the eager model
    outputs: list[list[Any]]  # eager fp32's output tensors, per checked batch


def applies(spec: str) -> bool:
    """A torchvision model name, as `sources.load_model` takes it (not `pkg:factory`, not a file)."""
    return ":" not in spec and not spec.endswith((".pt", ".pt2"))


def entry_path(cache_dir: Path, spec: str, batches: Sequence[Any]) -> Path:
    """Where the entry for this model on these inputs lives, for this torch, torchvision and CPU."""
    import torch
    from torch.utils import _pytree

    inputs = hashlib.sha256()
    for batch in batches:
        for tensor in (t for t in _pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)):
            hash_tensor(inputs, "input", tensor)
    named = {"model": spec, "torchvision": _torchvision_version(), "isa": list(cpu.isa()),
             "batches": len(batches), "inputs": inputs.hexdigest()}
    key = hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir / FOLDER / installed_torch_version() / f"{key}.pt"


def lookup(path: Path) -> Known | None:
    """The entry at `path`, or None when there is none or it cannot be read."""
    import torch

    if not path.exists():
        return None
    try:
        saved = torch.load(path, weights_only=True)
        known = Known(str(saved["weights"]), [list(outputs) for outputs in saved["outputs"]])
    except Exception:  # a damaged or foreign file: the slow path rebuilds and rewrites it
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # last used, for `autotune cache --prune --older-than`
    return known


def remember(path: Path, known: Known) -> None:
    """Keep `known` at `path`, atomically; a cache that cannot be written costs only time."""
    import torch

    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:
            torch.save({"weights": known.weights, "outputs": known.outputs}, tmp)


def _torchvision_version() -> str:
    try:
        return importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        return "none"
