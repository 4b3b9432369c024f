"""Generation in PyTorch: transformers' causal LM called step by step (a prefill over the prompt, then
one decode step per token with the KV cache), greedy, with the model knobs applied:

- precision: fp32; bf16 (the weights themselves in bf16: a decode step reads every weight once, so
  half the bytes); int8_weight_only (`int8`: ATen's CPU int8 weight-only kernel, bf16 activations);
  int4_weight_only (`int4`: ATen's CPU int4 kernel, bf16 activations); int8_dynamic (torchao's, as
  for encoders);
- kv_cache: dynamic (transformers' default: grows with every token) or static (allocated once for
  the prompt and the new tokens, reset per request): a decode step of fixed shapes;
- backend=inductor: the decode step compiled by torch.compile (over a static cache, always), the
  prefill eager;
- attention: sdpa (PyTorch's scaled_dot_product_attention) or eager (transformers' matmuls).

torch is imported inside functions.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from typing import Any

from autotune.model.batches import explain
from autotune.model.errors import ApplyError
from autotune.model.generate import int4, int8
from autotune.model.generate.base import Build
from autotune.model.knobdefs import ModelSettings


def build(spec: Build, setup: dict[str, Any]) -> TorchGenerator:
    """The PyTorch generator of `spec.model`, converted in place as `spec.knobs` say (inductor: the
    decode step compiled); it keeps nothing in the cache (inductor's kernels are torch's own cache)."""
    convert(spec.model, spec.knobs, setup)
    setup["weight_bytes"] = weight_bytes(spec.model)
    return TorchGenerator(spec.model, spec.knobs.kv_cache == "static", spec.knobs.backend == "inductor")


def convert(model: Any, knobs: ModelSettings, setup: dict[str, Any]) -> Any:
    """`model` (fp32, eval) with the knobs' attention and precision, in place; what it did goes to `setup`."""
    import torch

    from autotune.model.linear_int8 import quantize_linears

    try:
        model.set_attn_implementation(knobs.attention)
    except Exception as exc:  # a type without that implementation
        raise ApplyError(f"attention={knobs.attention}: {model.config.model_type} cannot use it ({explain(exc)}); "
                         f"use attention=eager") from None
    start = time.perf_counter()
    if knobs.precision in ("bf16", "int8_weight_only", "int4_weight_only"):
        model.to(torch.bfloat16)
    if knobs.precision == "int4_weight_only":
        setup["int4_linears"] = int4.quantize_model(model)
        setup["int4_group"] = int4.GROUP
        if not setup["int4_linears"]:
            raise ApplyError(f"precision=int4_weight_only: no nn.Linear of this model takes a multiple of "
                             f"{int4.GROUP} inputs (its quantization groups); use int8_weight_only")
    elif knobs.precision == "int8_weight_only":
        setup["int8_linears"] = int8.quantize_model(model)
    elif knobs.precision == "int8_dynamic":
        quantize_linears(model, knobs, setup)
    setup["convert_s"] = time.perf_counter() - start
    return model


class TorchGenerator:
    """A converted causal LM that streams greedy tokens (`base.Generator`)."""

    def __init__(self, model: Any, static_cache: bool, compiled: bool) -> None:
        import torch

        self.model, self.static_cache = model, static_cache or compiled
        self.cache: Any = None
        self.cache_shape: tuple[int, int] = (0, 0)
        self.decode = torch.compile(model.forward, dynamic=False, fullgraph=True) if compiled else model.forward
        # transformers 5.25 renamed the forward's past_key_values to cache (the old name warns)
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def _cache(self, batch: int, length: int) -> Any:
        """A static cache for `batch` sequences of `length` tokens: the one kept, reset, where it fits."""
        import transformers

        if not self.static_cache:
            return transformers.DynamicCache(config=self.model.config)
        if self.cache is None or self.cache_shape != (batch, length):
            self.cache = transformers.StaticCache(config=self.model.config, max_cache_len=length)
            self.cache_shape = (batch, length)
        else:
            self.cache.reset()
        return self.cache

    def logits(self, prompts: Any) -> Any:
        import torch

        with torch.no_grad():
            return self.model(input_ids=prompts, use_cache=False).logits.float()

    def stream(self, prompts: Any, new_tokens: int) -> Iterator[Any]:
        import torch

        batch, length = prompts.shape
        with torch.no_grad():
            cache = self._cache(batch, length + new_tokens)
            logits = self.model(input_ids=prompts, use_cache=True, cache_position=torch.arange(length),
                                logits_to_keep=1, **{self.cache_arg: cache}).logits
            token = logits[:, -1].argmax(-1)
            yield token
            for step in range(1, new_tokens):
                position = torch.tensor([length + step - 1])
                logits = self.decode(input_ids=token[:, None], use_cache=True, cache_position=position,
                                     **{self.cache_arg: cache}).logits
                token = logits[:, -1].argmax(-1)
                yield token


def weight_bytes(model: Any) -> int:
    """The bytes a decode step reads of the model's weights: every parameter and buffer but the
    input embedding table, of which a step reads one row (unless the output layer shares it)."""
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and getattr(output, "weight", None) is embedding
    seen: set[int] = set()
    total = 0
    for tensor in (*model.parameters(), *model.buffers()):
        if id(tensor) in seen or (tensor is embedding and not tied):
            continue
        seen.add(id(tensor))
        total += stored_bytes(tensor)
    return total


def stored_bytes(tensor: Any) -> int:
    """The bytes a tensor holds: a tensor subclass (torchao's quantized weights) counted by the
    tensors it is made of, not by the dtype it stands for."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None:
        return int(tensor.numel() * tensor.element_size())
    names, _ = flatten()
    return sum(stored_bytes(getattr(tensor, name)) for name in names)
