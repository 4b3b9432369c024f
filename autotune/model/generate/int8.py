"""int8 weight-only Linear layers on ATen's CPU kernel (`_weight_int8pack_mm`): each output channel's
weights in 8 bits with one symmetric scale, activations in bf16.

Measured on the AVX-512 host (a 4864x896 layer, one token, 2 threads): 128 us, reading its 4.4 MB of
weights at 34 GB/s, the machine's bandwidth; torchao's Int8WeightOnlyConfig ran the same layer's
model at 350 ms per token in eager and 216 compiled (a random 0.5B qwen2, against 49 for bf16
weights compiled), and the kernel with fp32 activations read 2.4 GB/s. A decode step reads every
weight once, so this is the layer for it.

torch is imported inside functions.
"""

from __future__ import annotations

import functools
from typing import Any

from autotune.model.generate.layers import replace_linears


def quantize_weight(weight: Any) -> tuple[Any, Any]:
    """An fp32 [out, in] weight as int8 codes and one bf16 scale per output channel."""
    import torch

    full = weight.detach().float()
    scale = full.abs().amax(dim=1).clamp(min=1e-8) / 127
    codes = (full / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return codes.contiguous(), scale.to(torch.bfloat16)


@functools.cache
def _layer_class() -> Any:
    import torch

    class Int8Linear(torch.nn.Module):
        """A Linear layer whose weight is 8-bit per output channel, computed by ATen's CPU kernel in bf16."""

        def __init__(self, linear: Any) -> None:
            super().__init__()
            self.out_features = linear.out_features
            codes, scales = quantize_weight(linear.weight)
            self.register_buffer("codes", codes)
            self.register_buffer("scales", scales)
            self.bias = None if linear.bias is None else torch.nn.Parameter(
                linear.bias.detach().to(torch.bfloat16), requires_grad=False)

        def forward(self, x: Any) -> Any:
            flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
            out = torch.ops.aten._weight_int8pack_mm(flat, self.codes, self.scales)
            out = out if self.bias is None else out + self.bias
            return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    return Int8Linear


def quantize_model(model: Any) -> int:
    """Replace every nn.Linear by its int8 layer, in place; returns how many. The model is expected in
    bf16 (the kernel's activations)."""
    return replace_linears(model, _layer_class())
