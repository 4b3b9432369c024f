"""What the weight-only layers (`int4`, `int8`) share: replacing a model's nn.Linear layers in place.

torch is imported inside functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def replace_linears(model: Any, make: Callable[[Any], Any | None]) -> int:
    """Each nn.Linear of `model` replaced by `make(linear)` where that gives a layer (None keeps it);
    returns how many were replaced."""
    import torch

    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            made = make(child) if isinstance(child, torch.nn.Linear) else None
            if made is not None:
                setattr(parent, name, made)
                replaced += 1
    return replaced
