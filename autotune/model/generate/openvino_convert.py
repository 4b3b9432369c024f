"""The OpenVINO GenAI peer's conversion: a causal LM's `save_pretrained` folder to the stateful
OpenVINO IR that `LLMPipeline` runs. No optimum-intel: its exporter wants an older transformers
than the project's. The conversion does by hand what optimum-intel's exporter does for a decoder:

- `openvino.convert_model` traces (TorchScript) a wrapper of the transformers model (attention
  `sdpa`, so the IR has the ScaledDotProductAttention ops GenAI's PagedAttention rewrite looks for)
  that takes input_ids, attention_mask, position_ids and the past keys and values flattened, and
  returns the logits and the present keys and values;
- the inputs and outputs get optimum-intel's names (past_key_values.{i}.key/value, present.{i}...),
  a `beam_idx` input gathers every past key/value along the batch, and
  `apply_make_stateful_transformation` turns each past/present pair into an internal state, its
  initial value zeros of the batch of input_ids (optimum-intel's `patch_stateful`);
- int8_asym / int4_asym_g128 weights: NNCF `compress_weights` on that IR, without data (int4:
  INT4_ASYM, optimum-intel's default 4-bit mode, group size 128, ratio 1.0; NNCF keeps the embedding
  and the last layer in its INT8_ASYM backup precision, and a layer whose channels 128 does not
  divide gets the largest power-of-two group that does).

`convert` writes into the folder it is given (`openvino_genai` names it in the artifact cache).

openvino, nncf, torch and transformers are imported inside functions.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from autotune.model.errors import ApplyError
from autotune.model.generate.converted import one_line

IR_NAME = "openvino_model.xml"  # the name LLMPipeline looks for in its folder
INT4_GROUP = 128
INT4_RATIO = 1.0


def convert(folder: Path, weights: str, out: Path) -> dict[str, Any]:
    """Convert the causal LM in `folder` to a stateful IR in `out` with `weights`; returns how the
    weights were compressed."""
    import openvino as ov

    model = load_model(folder)
    ov_model = trace(model)
    del model
    make_stateful(ov_model)
    compression = compress(ov_model, weights)
    ov.save_model(ov_model, str(out / IR_NAME), compress_to_fp16=False)
    return compression


def load_model(folder: Path) -> Any:
    """The transformers causal LM in `folder`, fp32, eval, with sdpa attention."""
    import torch
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                                  attn_implementation="sdpa")
    except Exception as exc:
        raise ApplyError(f"transformers cannot load a causal LM with sdpa attention from {folder}: "
                         f"{one_line(exc)}") from None
    return model.eval()


class _FlatCacheLM:
    """Builds the torch wrapper that `openvino.convert_model` traces (a factory, so that torch is
    imported only when converting)."""

    @staticmethod
    def make(model: Any) -> Any:
        """(input_ids, attention_mask, position_ids, k0, v0, k1, v1, ...) -> (logits, k0', v0', ...)."""
        import inspect

        import torch
        import transformers

        cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

        class FlatCacheLM(torch.nn.Module):
            """The causal LM with its KV cache as flat tensors in and out."""

            def __init__(self, lm: Any) -> None:
                super().__init__()
                self.lm = lm

            def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, *past: Any) -> Any:
                cache = transformers.DynamicCache(config=self.lm.config)
                layer: Any
                for index, layer in enumerate(cache.layers):
                    # filled directly: DynamicCache's own first update concatenates onto an empty
                    # tensor, which the OpenVINO frontend cannot convert
                    layer.device = past[2 * index].device
                    layer.keys, layer.values = past[2 * index], past[2 * index + 1]
                    layer.is_initialized = True
                out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=True, return_dict=True, **{cache_arg: cache})
                present = getattr(out, "cache", None) or out.past_key_values
                flat = [tensor for layer in present.layers for tensor in (layer.keys, layer.values)]
                return (out.logits, *flat)

        return FlatCacheLM(model)


def kv_shape(config: Any) -> tuple[int, int, int]:
    """(layers, key/value heads, head size) of a decoder's config."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers, kv_heads, head_dim


def trace(model: Any) -> Any:
    """The ov.Model of `model` with the KV cache as explicit inputs and outputs, optimum-intel's names,
    every sequence and batch dimension dynamic."""
    import openvino as ov
    import torch
    import transformers

    layers, kv_heads, head_dim = kv_shape(model.config)
    if any(getattr(layer, "is_sliding", False) for layer in transformers.DynamicCache(config=model.config).layers):
        raise ApplyError(f"{model.config.model_type}: a sliding-window KV cache; the openvino_genai peer "
                         f"converts full-attention decoders only")
    past_len, new_len = 2, 3  # both > 1: the trace keeps the general (not the single-token) paths
    vocab = model.config.get_text_config(decoder=True).vocab_size
    example = (torch.randint(0, vocab, (1, new_len)),
               torch.ones(1, past_len + new_len, dtype=torch.int64),
               torch.arange(past_len, past_len + new_len).unsqueeze(0),
               *[torch.zeros(1, kv_heads, past_len, head_dim) for _ in range(2 * layers)])
    try:
        # the tracer's warnings (python branches on shapes, constants) are expected: the example's
        # shapes take the general path, which holds for every prompt and step
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ov_model = ov.convert_model(_FlatCacheLM.make(model), example_input=example)
    except Exception as exc:
        raise ApplyError(f"openvino.convert_model cannot convert {model.config.model_type}: {one_line(exc)}; "
                         f"this peer converts transformers' decoders such as qwen2 and llama") from None
    kv_names = [f"past_key_values.{i}.{part}" for i in range(layers) for part in ("key", "value")]
    in_names = ["input_ids", "attention_mask", "position_ids", *kv_names]
    out_names = ["logits", *(name.replace("past_key_values", "present") for name in kv_names)]
    if len(ov_model.inputs) != len(in_names) or len(ov_model.outputs) != len(out_names):
        raise ApplyError(f"{model.config.model_type}: the converted model has {len(ov_model.inputs)} inputs and "
                         f"{len(ov_model.outputs)} outputs, not {len(in_names)} and {len(out_names)}")
    for port, name in zip(ov_model.inputs, in_names, strict=True):
        port.get_tensor().set_names({name})
        dynamic = [-1, -1] if name in in_names[:3] else [-1, kv_heads, -1, head_dim]
        port.get_node().set_partial_shape(ov.PartialShape(dynamic))
    for port, name in zip(ov_model.outputs, out_names, strict=True):
        port.get_tensor().set_names({name})
    ov_model.validate_nodes_and_infer_types()
    return ov_model


def make_stateful(ov_model: Any) -> None:
    """Hide the KV cache inside `ov_model` as states, as optimum-intel's `patch_stateful` does: a
    `beam_idx` input that reorders the past along the batch, then each past/present pair made a
    ReadValue/Assign whose initial value is zeros for the batch of input_ids."""
    import numpy as np
    import openvino as ov
    from openvino import opset13
    from openvino._offline_transformations import apply_make_stateful_transformation

    kv_inputs = [port.get_any_name() for port in ov_model.inputs if port.get_any_name().startswith("past_key_values.")]
    kv_outputs = [port.get_any_name() for port in ov_model.outputs if port.get_any_name().startswith("present.")]
    beam_idx = opset13.parameter(name="beam_idx", dtype=ov.Type.i32, shape=ov.PartialShape([-1]))
    beam_idx.output(0).get_tensor().add_names({"beam_idx"})
    ov_model.add_parameters([beam_idx])
    for name in kv_inputs:
        port = ov_model.input(name)
        consumers = port.get_target_inputs()
        gathered = opset13.gather(port, beam_idx, opset13.constant(0))
        for consumer in consumers:
            consumer.replace_source_output(gathered.output(0))
    ov_model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(ov_model, dict(zip(kv_inputs, kv_outputs, strict=True)))
    ids = ov_model.input("input_ids")
    batch = opset13.gather(opset13.shape_of(ids, output_type="i64"), opset13.constant([0]), opset13.constant(0))
    for op in ov_model.get_ops():
        if op.get_type_name() != "ReadValue":
            continue
        dims: list[Any] = [dim.min_length for dim in op.get_output_partial_shape(0)]
        dims[0] = batch
        parts = [opset13.constant(np.array([dim], dtype=np.int64)) if isinstance(dim, int) else dim for dim in dims]
        zeros = opset13.broadcast(opset13.constant(0.0, dtype=op.get_output_element_type(0)),
                                  opset13.concat(parts, axis=0))
        op.set_arguments([zeros])
    ov_model.validate_nodes_and_infer_types()


def compress(ov_model: Any, weights: str) -> dict[str, Any]:
    """NNCF weight compression of `ov_model` in place for `weights`; what it used, for `setup`."""
    if weights == "fp32":
        return {"compression": "none"}
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

    try:
        if weights == "int8_asym":
            nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT8_ASYM)
            return {"compression": "nncf INT8_ASYM per channel"}
        advanced = AdvancedCompressionParameters(group_size_fallback_mode=GroupSizeFallbackMode.ADJUST)
        nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT4_ASYM, group_size=INT4_GROUP,
                              ratio=INT4_RATIO, advanced_parameters=advanced)
    except Exception as exc:
        raise ApplyError(f"NNCF cannot compress the weights to {weights}: {one_line(exc)}") from None
    return {"compression": f"nncf INT4_ASYM group {INT4_GROUP} ratio {INT4_RATIO}, no dataset; embedding and "
                           f"last layer INT8_ASYM (NNCF's backup); indivisible channels: adjusted group"}
