"""The llama.cpp peer's conversion: a model folder that `save_pretrained` wrote (config.json and
fp32 safetensors) to a GGUF file of our own writing (the `gguf` package's writer and tensor name
maps; no llama.cpp converter script), F32, and quantized from it by llama.cpp's own quantizer with
its default choices per tensor. The GGUF carries no real vocabulary: its tokenizer is llama.cpp's
"no_vocab" model with `vocab_size` placeholder tokens (the generator feeds token ids).

Each function writes where it is told (`llamacpp` names the files in the artifact cache).

gguf, llama_cpp, safetensors and torch are imported inside functions: this module imports without them.
"""

from __future__ import annotations

import ctypes
import json
from collections import Counter
from pathlib import Path
from typing import Any

from autotune.model.errors import ApplyError
from autotune.model.generate import converted
from autotune.model.generate.llamacpp_context import INSTALL, import_llama_cpp, llama_log

# The Hugging Face model types this converter writes, and llama.cpp's architecture for each.
ARCHS = {"qwen2": "QWEN2", "llama": "LLAMA", "gpt2": "GPT2"}
CONVERTER_VERSION = "1"  # part of every GGUF's key: bump when the GGUF this writes changes
PYTORCH_HINT = "run this model with the pytorch generator"


def import_gguf() -> Any:
    """The `gguf` package (GGUF writer, reader and names)."""
    return converted.import_runtime("gguf", "llama.cpp", INSTALL)


def read_config(folder: Path) -> dict[str, Any]:
    """config.json of the model folder, checked to be a model type this converter writes."""
    path = folder / "config.json"
    if not path.is_file():
        raise ApplyError(f"{folder} has no config.json: save the model with save_pretrained")
    config: dict[str, Any] = json.loads(path.read_text())
    model_type = config.get("model_type")
    if model_type not in ARCHS:
        raise ApplyError(
            f"the llama.cpp peer converts model types {', '.join(ARCHS)}, not {model_type!r}: {PYTORCH_HINT}"
        )
    return config


def safetensors_files(folder: Path) -> list[Path]:
    """The model's safetensors files, in name order (one file, or the shards of an index)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ApplyError(f"{folder} has no .safetensors file: save the model with save_pretrained")
    return files


def _rope_theta(config: dict[str, Any]) -> float:
    """The RoPE base frequency, refusing RoPE scalings the converter does not write."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ApplyError(f"the llama.cpp peer converts only default RoPE, not {kind!r}: {PYTORCH_HINT}")
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise ApplyError(f"the llama.cpp peer converts only full-head RoPE (partial_rotary_factor 1): {PYTORCH_HINT}")
    return float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0)


def _head_dim(config: dict[str, Any]) -> int:
    """The attention head size of a qwen2/llama config."""
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def write_metadata(writer: Any, config: dict[str, Any], gguf: Any) -> None:
    """The architecture's hyperparameters and a placeholder vocabulary ("no_vocab", vocab_size tokens)."""
    model_type = config["model_type"]
    writer.add_name(f"autotune {model_type}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_tokenizer_model("no_vocab")
    if model_type == "gpt2":
        if config.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            act = config["activation_function"]
            raise ApplyError(f"llama.cpp's gpt2 runs the tanh GELU, not {act!r}: {PYTORCH_HINT}")
        if config.get("scale_attn_by_inverse_layer_idx") or config.get("reorder_and_upcast_attn"):
            raise ApplyError(f"llama.cpp's gpt2 has no per-layer attention scaling: {PYTORCH_HINT}")
        writer.add_context_length(int(config["n_positions"]))
        writer.add_embedding_length(int(config["n_embd"]))
        writer.add_feed_forward_length(int(config.get("n_inner") or 4 * config["n_embd"]))
        writer.add_block_count(int(config["n_layer"]))
        writer.add_head_count(int(config["n_head"]))
        writer.add_layer_norm_eps(float(config.get("layer_norm_epsilon", 1e-5)))
        return
    if config.get("hidden_act", "silu") != "silu":
        raise ApplyError(f"llama.cpp's {model_type} runs SiLU, not {config['hidden_act']!r}: {PYTORCH_HINT}")
    if config.get("use_sliding_window"):
        raise ApplyError(f"llama.cpp's qwen2 has no sliding-window attention: {PYTORCH_HINT}")
    head_dim = _head_dim(config)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_head_count_kv(int(config.get("num_key_value_heads") or config["num_attention_heads"]))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))


def interleave_rope_rows(weight: Any, n_heads: int) -> Any:
    """Reorder a llama q/k projection's output rows from Hugging Face's rotate-half RoPE layout
    (each head: first halves, then second halves) to the interleaved pairs llama.cpp's llama
    architecture rotates (each head: x0, x_half, x1, x_half+1, ...). Works on weights and biases."""
    rows = weight.shape[0]
    return weight.reshape(n_heads, 2, rows // n_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _is_skipped(name: str, config: dict[str, Any]) -> bool:
    """Tensors the GGUF leaves out: a tied lm_head (llama.cpp reuses token_embd) and gpt2's attention
    mask buffers."""
    tied = config.get("tie_word_embeddings", config["model_type"] == "gpt2")
    if name == "lm_head.weight" and tied:
        return True
    return name.endswith((".attn.bias", ".attn.masked_bias"))


def transform_tensor(name: str, tensor: Any, config: dict[str, Any]) -> Any:
    """The tensor as llama.cpp's architecture wants it: llama's q/k rows interleaved for its RoPE,
    gpt2's Conv1D weights ([in, out]) transposed to Linear's [out, in]."""
    model_type = config["model_type"]
    if model_type == "llama":
        heads = int(config["num_attention_heads"])
        if ".self_attn.q_proj." in name:
            return interleave_rope_rows(tensor, heads)
        if ".self_attn.k_proj." in name:
            return interleave_rope_rows(tensor, int(config.get("num_key_value_heads") or heads))
    conv1d = (".c_attn.", ".c_proj.", ".c_fc.")
    if model_type == "gpt2" and name.endswith(".weight") and any(part in name for part in conv1d):
        return tensor.t()
    return tensor


def write_f32_gguf(folder: Path, config: dict[str, Any], target: Path) -> None:
    """Write the model's weights as an F32 GGUF at `target` (the cache's temporary name for it)."""
    gguf = import_gguf()
    import torch
    from safetensors import safe_open

    arch = gguf.MODEL_ARCH[ARCHS[config["model_type"]]]
    blocks = int(config.get("num_hidden_layers") or config["n_layer"])
    names = gguf.get_tensor_name_map(arch, blocks)
    writer = gguf.GGUFWriter(str(target), gguf.MODEL_ARCH_NAMES[arch])
    try:
        write_metadata(writer, config, gguf)
        written: set[str] = set()
        for path in safetensors_files(folder):
            with safe_open(str(path), framework="pt") as weights:
                for name in weights.keys():  # noqa: SIM118 (safe_open is no dict)
                    if _is_skipped(name, config):
                        continue
                    new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
                    if new_name is None:
                        kind = config["model_type"]
                        raise ApplyError(f"llama.cpp's {kind} has no GGUF name for tensor {name!r}: {PYTORCH_HINT}")
                    tensor = transform_tensor(name, weights.get_tensor(name).to(torch.float32), config)
                    writer.add_tensor(new_name, tensor.contiguous().numpy())
                    written.add(new_name)
        untied = config["model_type"] != "gpt2" and not config.get("tie_word_embeddings")
        if untied and "output.weight" not in written:
            raise ApplyError(f"{folder} has no lm_head.weight and its config ties no embeddings: save the whole model")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


def quantize_gguf(source: Path, target: Path, kind: str, threads: int) -> None:
    """Quantize the F32 GGUF `source` to `kind` (BF16, F16, Q8_0, Q4_0) at `target` with llama.cpp's
    own quantizer and its default choices per tensor (the cache's temporary name for it)."""
    llama_cpp = import_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params))
    if status != 0 or not target.is_file():
        raise ApplyError(f"llama.cpp could not quantize {source.name} to {kind} (status {status}): {llama_log()}")


def decode_bytes(path: Path) -> int:
    """The bytes of the GGUF's tensors a decode step reads: all but the token embedding table, of which
    it reads one row (unless the output layer is that table: a tied model has no output.weight)."""
    gguf = import_gguf()
    tensors = {tensor.name: int(tensor.n_bytes) for tensor in gguf.GGUFReader(str(path)).tensors}
    return converted.decode_bytes(sum(tensors.values()), tensors.get("token_embd.weight", 0),
                                  tied="output.weight" not in tensors)


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each GGML type the GGUF at `path` holds."""
    gguf = import_gguf()
    reader = gguf.GGUFReader(str(path))
    return dict(Counter(tensor.tensor_type.name for tensor in reader.tensors))
