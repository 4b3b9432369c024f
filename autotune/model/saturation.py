"""Whether a runtime's int8 kernels lose sums on this CPU, measured, and the remedy its int8
conversion then applies (`Backend.int8_remedy`). A CPU without VNNI multiplies u8 x s8 pairs into
16-bit sums, which saturate when the integers fill their ranges; the check runs the kernel probe's
conv and matmul at the full uint8 range against exact integer arithmetic, in well under a second.

It takes the backend itself, not its name, so that the backends (which ask it about themselves) sit
below the registry: the registry, the knob table and conversion import upward from here.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from autotune.model.kernels import EXACT, Kernel, quantized, rel_error, threads_kept

if TYPE_CHECKING:
    from autotune.model.backends.base import Backend


@functools.cache
def exact_error(backend: Backend, op: str) -> float:
    """How far `backend`'s runtime's int8 `op` at the full uint8 range lands from exact integer
    arithmetic on the same integers (0 up to float rounding, unless 16-bit sums saturate)."""
    import torch

    at, _ = backend.probe_kernel(Kernel(backend.runtime, "int8", op), False)
    with torch.no_grad(), threads_kept():
        return rel_error(at(1)(), quantized(op).exact(op))


@functools.cache
def saturates(backend: Backend) -> bool:
    """Whether `backend`'s runtime's int8 kernels lose sums on this CPU (on the probe's conv and matmul)."""
    return any(exact_error(backend, op) > EXACT for op in backend.probe_ops("int8"))


def remedy(backend: Backend) -> str:
    """How `backend`'s int8 conversion must quantize on this CPU (its `int8_remedy`), "" where
    nothing saturates."""
    return backend.int8_remedy if backend.int8_remedy and saturates(backend) else ""


def forget() -> None:
    """Measure again on the next ask (tests that fake a runtime's kernels)."""
    exact_error.cache_clear()
    saturates.cache_clear()
