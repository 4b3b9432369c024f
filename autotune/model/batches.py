"""Batches and what a model makes of them: calling a model on one, converting its inputs as the knobs
say, the output's tensors, its layout, and one exception said in a line. torch is imported inside functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from autotune.model.errors import ApplyError
from autotune.model.knobdefs import ModelSettings, Precision


def call(model: Any, batch: Any) -> Any:
    """A batch is one tensor, a list/tuple of positional inputs, or a dict of keyword inputs."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (list, tuple)):
        return model(*batch)
    return model(batch)


def inputs(batch: Any, knobs: ModelSettings) -> Any:
    """Floating-point inputs in the layout the knobs chose; integer inputs (token ids) untouched."""
    import torch
    from torch.utils import _pytree

    def convert(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if not x.is_floating_point():
            return x.contiguous()
        if knobs.mkldnn:
            return x.to_mkldnn()
        if knobs.memory_format == "channels_last" and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x.contiguous()

    return _pytree.tree_map(convert, batch)


def dense(output: Any) -> Any:
    import torch
    from torch.utils import _pytree

    return _pytree.tree_map(lambda x: x.to_dense() if isinstance(x, torch.Tensor) and x.is_mkldnn else x, output)


@contextlib.contextmanager
def autocast(precision: Precision) -> Iterator[None]:
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
        raise ApplyError(f"the model returned {type(output).__name__} with no tensor in it")
    return found


def rows(batch: Sequence[Any]) -> Any:
    """One row per input item of a batch: its output tensors (`leaves`) flattened after dim 0, side by side."""
    import torch

    return torch.cat([t.float().reshape(t.shape[0], -1) for t in batch], dim=1)


def batch_size(batch: Any) -> int:
    """Items in a batch: dim 0 of its first tensor."""
    return int(leaves(batch)[0].shape[0])


def layout(batch: Any, any_length: bool = False) -> list[str]:
    """Shape, dtype and layout of each input tensor (dict inputs by name): what a compiled model
    was made for. `any_length`: a token tensor's length (dim 1) written as `L`, for a model exported
    with a dynamic sequence dimension."""
    if isinstance(batch, dict):
        return [f"{name}={entry}" for name in sorted(batch) for entry in layout(batch[name], any_length)]
    return [f"{'x'.join(_dims(t, any_length))}:{str(t.dtype).replace('torch.', '')}:{_format(t)}"
            for t in leaves(batch)]


def _dims(tensor: Any, any_length: bool) -> list[str]:
    dims = [str(n) for n in tensor.shape]
    return [dims[0], "L"] if any_length and is_tokens(tensor) else dims


def is_tokens(x: Any) -> bool:
    """A token tensor of a text model: 2-D integer [batch, sequence] (input ids, attention mask)."""
    import torch

    return isinstance(x, torch.Tensor) and x.dim() == 2 and not x.is_floating_point() and not x.is_complex()


def _format(tensor: Any) -> str:
    import torch

    if tensor.is_mkldnn:
        return "mkldnn"
    return "channels_last" if tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last) \
        and not tensor.is_contiguous() else "contiguous"


def split(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A batch as torch.export takes it: positional inputs, keyword inputs."""
    if isinstance(batch, dict):
        return (), batch
    return (tuple(batch) if isinstance(batch, (list, tuple)) else (batch,)), {}


EXPLAINED = 300  # characters of an exception's first line that an error line quotes


def explain(exc: BaseException) -> str:
    """One line for a failure inside torch or the model: its type and the first line of its
    message, a long one cut after its last whole sentence (or word) that fits."""
    first = (str(exc).strip().splitlines() or [""])[0]
    if len(first) > EXPLAINED:
        cut = first[:EXPLAINED]
        end = cut.rfind(". ")
        first = cut[:end + 1] if end >= EXPLAINED // 3 else cut.rsplit(" ", 1)[0] + " ..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
