"""precision=int8_dynamic and int8_weight_only: torchao's `quantize_` on every nn.Linear of the model,
with no calibration (the bulk of a transformer encoder's time is in its Linear layers).

int8_dynamic (`Int8DynamicActivationInt8WeightConfig`): int8 weights per output channel, each
activation row quantized as the model runs, int8 x int8 matmuls. int8_weight_only
(`Int8WeightOnlyConfig`): int8 weights scaled back to fp32 for an fp32 matmul; it saves memory
and bandwidth, not arithmetic, so it pays where a batch is small and the weights large.

Both run in eager, and torch.export captures torchao's tensor subclasses, so backend=inductor
compiles them into an AOTInductor package that loads without torchao. How each is exported was
measured (a 768-wide Linear block, 128 tokens, 2 threads of a Xeon with VNNI; fp32 AOTInductor
7.2 ms): int8_dynamic as it is, 2.5 ms (unwrapped into plain tensors, 63 ms: inductor no longer
sees an int8 matmul); int8_weight_only unwrapped (`unwrap_tensor_subclass`), 8.2 ms (as it is,
50 ms: the weights are dequantized on every call rather than frozen).

torchao is imported inside functions. Its configs are asked not to change inductor's settings
(`set_inductor_config=False`): those would hold for the whole process, a user's program included.
"""

from __future__ import annotations

import time
from typing import Any

from autotune.model.batches import explain
from autotune.model.errors import ApplyError
from autotune.model.knobdefs import ModelSettings

TORCHAO_INSTALL = "pip install torchao==0.18.0"


def quantize_linears(model: Any, knobs: ModelSettings, setup: dict[str, Any]) -> Any:
    """`model` with its nn.Linear layers quantized as `knobs.precision` says, in place (`apply`
    passes a copy: `ModelKnobs.converts_in_place`); the count and the time go to `setup`."""
    import torch

    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    if not linears:
        raise ApplyError(f"precision={knobs.precision} quantizes nn.Linear layers and this model has none; "
                         f"use precision=int8 (backend=inductor) or fp32")
    quantize_, config, unwrap = _torchao(knobs.precision)
    start = time.perf_counter()
    try:
        quantize_(model, config)
    except Exception as exc:
        raise ApplyError(f"precision={knobs.precision}: torchao could not quantize the model ({explain(exc)}); "
                         f"use precision=fp32 or int8") from exc
    if knobs.precision == "int8_weight_only" and knobs.backend == "inductor":
        unwrap(model)  # measured above: freezing then folds the dequantized weights once
    setup["quantize_s"], setup["quantized_linears"] = time.perf_counter() - start, linears
    return model


def _torchao(precision: str) -> tuple[Any, Any, Any]:
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_
        from torchao.utils import unwrap_tensor_subclass
    except ImportError as exc:
        raise ApplyError(f"precision={precision} needs torchao ({exc}); install it with `{TORCHAO_INSTALL}`") from None
    config_cls = Int8DynamicActivationInt8WeightConfig if precision == "int8_dynamic" else Int8WeightOnlyConfig
    return quantize_, config_cls(set_inductor_config=False), unwrap_tensor_subclass
