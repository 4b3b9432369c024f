"""int4 weight-only Linear layers on ATen's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`): weights in
groups of `GROUP` along the input dimension, each group with its own scale and offset (asymmetric,
4 bits: 0..15 around a mid-point of 8, the tinygemm convention the kernel takes), activations in bf16.

torchao 0.18's Int4WeightOnlyConfig no longer packs for the CPU (its formats need other kernels
installed), so this is the layout its CPU path used, made directly on PyTorch's own kernel. A layer
whose input width is not a multiple of the group size stays as it was.

torch is imported inside functions.
"""

from __future__ import annotations

import functools
from typing import Any

from autotune.model.generate.layers import replace_linears

GROUP = 128  # inputs per quantization group: llama.cpp's Q4_0 uses 32, gpt-fast and torchao 32..256
INNER_TILES = 1  # the CPU kernel's packing takes inner_k_tiles but packs the same for any value


def quantize_weight(weight: Any, group: int = GROUP) -> tuple[Any, Any]:
    """An fp32 [out, in] weight as the kernel's packed uint8 weight and its [in/group, out, 2] bf16
    scales and offsets."""
    import torch

    out_features, in_features = weight.shape
    grouped = weight.detach().float().reshape(out_features, in_features // group, group)
    low, high = grouped.amin(-1, keepdim=True), grouped.amax(-1, keepdim=True)
    scale = (high - low).clamp(min=1e-8) / 15
    codes = ((grouped - low) / scale).round().clamp(0, 15).to(torch.int32).reshape(out_features, in_features)
    offset = low + 8 * scale  # the value of the mid-point code 8
    scales = torch.stack([scale.reshape(out_features, -1), offset.reshape(out_features, -1)], dim=-1)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INNER_TILES)
    return packed, scales.transpose(0, 1).contiguous().to(torch.bfloat16)


@functools.cache
def _layer_class() -> Any:
    import torch

    class Int4Linear(torch.nn.Module):
        """A Linear layer whose weight is 4-bit, computed by ATen's CPU int4 kernel in bf16."""

        def __init__(self, linear: Any, group: int) -> None:
            super().__init__()
            self.group, self.out_features = group, linear.out_features
            packed, scales = quantize_weight(linear.weight, group)
            self.register_buffer("packed", packed)
            self.register_buffer("scales", scales)
            self.bias = None if linear.bias is None else torch.nn.Parameter(
                linear.bias.detach().to(torch.bfloat16), requires_grad=False)

        def forward(self, x: Any) -> Any:
            flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group, self.scales)
            out = out if self.bias is None else out + self.bias
            return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    return Int4Linear


def quantize_model(model: Any, group: int = GROUP) -> int:
    """Replace every nn.Linear whose input width `group` divides (and whose output width is even, as the
    packing needs) by its int4 layer, in place; returns how many were replaced. The model is expected in
    bf16 (the kernel's activations)."""
    def make(linear: Any) -> Any:
        fits = linear.in_features % group == 0 and linear.out_features % 2 == 0
        return _layer_class()(linear, group) if fits else None

    return replace_linears(model, make)
