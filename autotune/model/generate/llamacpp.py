"""llama.cpp as a peer for text generation, through `llama-cpp-python`.

`build` converts the model folder that `save_pretrained` wrote (config.json and fp32 safetensors) to
a GGUF file of our own writing (the `gguf` package's writer and tensor name maps; no llama.cpp
converter script), quantizes it with llama.cpp's own quantizer when the precision asks for it, and
loads it into a llama.cpp context. The generator it returns feeds token ids straight to
`llama_decode` and takes the argmax of the last position's logits itself (`logits` hands back every
position's, for the guard), so the GGUF carries no real vocabulary: its tokenizer is llama.cpp's
"no_vocab" model with `vocab_size` placeholder tokens.

Converted files live in `PeerBuild.work`, named by a fingerprint of the model folder and the GGUF
type, written to a temporary name and renamed, and reused when the same model and precision come
again. The F32 GGUF is the source of every quantized one and is kept for the next precision.

llama_cpp, gguf, numpy and torch are imported inside functions: this module imports without them.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import time
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.model.errors import ApplyError
from autotune.model.generate.base import Generator, PeerBuild

# Our precision name -> the GGUF weight type llama.cpp runs it as.
GGUF_TYPES = {"fp32": "F32", "bf16": "BF16", "int8_weight_only": "Q8_0", "int4_weight_only": "Q4_0"}
# The Hugging Face model types this converter writes, and llama.cpp's architecture for each.
ARCHS = {"qwen2": "QWEN2", "llama": "LLAMA", "gpt2": "GPT2"}
MAX_CONTEXT = 4096  # the context a build sizes when none is asked for, at most
CONTEXT_STEP = 256  # llama.cpp rounds a context up to a multiple of this
CONVERTER_VERSION = "1"  # part of every fingerprint: bump when the GGUF this writes changes
INSTALL_HINT = "install it with `pip install llama-cpp-python gguf`"
PYTORCH_HINT = "run this model with the pytorch generator"

_LOG_TAIL: deque[str] = deque(maxlen=20)  # llama.cpp's latest warnings and errors, for messages
_LOG_CALLBACK: Any = None  # the ctypes callback; kept referenced so llama.cpp never calls a freed one
_BACKEND_READY = False


def _import_llama_cpp() -> Any:
    """llama_cpp, with its logging routed to `_LOG_TAIL` and its backend initialised once."""
    global _LOG_CALLBACK, _BACKEND_READY
    try:
        import llama_cpp
    except ImportError as error:
        raise ApplyError(f"the llama.cpp peer needs llama-cpp-python ({error}); {INSTALL_HINT}") from error
    if _LOG_CALLBACK is None:

        def keep_warnings(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
            """Keep llama.cpp's warnings and errors (levels 2 and 3) for error messages; print nothing."""
            if level in (2, 3) and text:
                _LOG_TAIL.append(text.decode("utf-8", "replace").rstrip())

        _LOG_CALLBACK = llama_cpp.llama_log_callback(keep_warnings)
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    if not _BACKEND_READY:
        llama_cpp.llama_backend_init()
        _BACKEND_READY = True
    return llama_cpp


def _llama_log() -> str:
    """llama.cpp's latest warnings and errors on one line, for an error message."""
    return " | ".join(line for line in _LOG_TAIL if line) or "no message from llama.cpp"


def _import_gguf() -> Any:
    """The `gguf` package (GGUF writer, reader and names)."""
    try:
        import gguf
    except ImportError as error:
        raise ApplyError(f"the llama.cpp peer writes GGUF with the gguf package ({error}); {INSTALL_HINT}") from None
    return gguf


def gguf_type(precision: str) -> str:
    """The GGUF weight type of `precision`, or ApplyError naming the precisions this peer runs."""
    if precision not in GGUF_TYPES:
        runs = ", ".join(f"{ours} as {theirs}" for ours, theirs in GGUF_TYPES.items())
        raise ApplyError(f"llama.cpp has no precision {precision!r}; it runs {runs}: pick one of those")
    return GGUF_TYPES[precision]


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


def fingerprint(folder: Path) -> str:
    """A short hash naming this model folder's weights: config.json, and every safetensors file's
    name, size, modification time, header and first MiB of data."""
    digest = hashlib.sha256(f"autotune-llamacpp-{CONVERTER_VERSION}".encode())
    digest.update((folder / "config.json").read_bytes())
    for path in safetensors_files(folder):
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        with path.open("rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            digest.update(handle.read(header_len))
            digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


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
    """Write the model's weights as an F32 GGUF at `target` (through a temporary file and a rename)."""
    gguf = _import_gguf()
    import torch
    from safetensors import safe_open

    arch = gguf.MODEL_ARCH[ARCHS[config["model_type"]]]
    blocks = int(config.get("num_hidden_layers") or config["n_layer"])
    names = gguf.get_tensor_name_map(arch, blocks)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[arch])
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
        writer.close()
        os.replace(tmp, target)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)


def quantize_gguf(source: Path, target: Path, kind: str, threads: int) -> None:
    """Quantize the F32 GGUF `source` to `kind` (BF16, F16, Q8_0, Q4_0) at `target` with llama.cpp's
    own quantizer and its default choices per tensor (through a temporary file and a rename)."""
    llama_cpp = _import_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    try:
        status = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params))
        if status != 0 or not tmp.is_file():
            raise ApplyError(f"llama.cpp could not quantize {source.name} to {kind} (status {status}): {_llama_log()}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def decode_bytes(path: Path) -> int:
    """The bytes of the GGUF's tensors a decode step reads: all but the token embedding table, of which
    it reads one row (unless the output layer is that table: a tied model has no output.weight)."""
    gguf = _import_gguf()
    tensors = {tensor.name: int(tensor.n_bytes) for tensor in gguf.GGUFReader(str(path)).tensors}
    tied = "output.weight" not in tensors
    return sum(size for name, size in tensors.items() if tied or name != "token_embd.weight")


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each GGML type the GGUF at `path` holds."""
    gguf = _import_gguf()
    reader = gguf.GGUFReader(str(path))
    return dict(Counter(tensor.tensor_type.name for tensor in reader.tensors))


def _resolve_kind(precision: str, llama_cpp: Any) -> str:
    """The GGUF type to write for `precision`: BF16 becomes F16 where this llama.cpp has no BF16."""
    kind = gguf_type(precision)
    if kind == "BF16" and not hasattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_BF16"):
        return "F16"
    return kind


def convert(spec: PeerBuild, config: dict[str, Any], kind: str, setup: dict[str, Any]) -> Path:
    """The GGUF of `kind` for the model in `spec.folder`, converted into `spec.work` unless a file
    of the same fingerprint is already there. Records what it did in `setup`."""
    spec.work.mkdir(parents=True, exist_ok=True)
    stem = f"{config['model_type']}-{fingerprint(spec.folder)}"
    f32 = spec.work / f"{stem}-F32.gguf"
    target = spec.work / f"{stem}-{kind}.gguf"
    setup["gguf_path"] = str(target)
    setup["gguf_reused"] = target.is_file()
    setup["convert_s"] = 0.0
    setup["quantize_s"] = 0.0
    if target.is_file():
        return target
    if not f32.is_file():
        start = time.perf_counter()
        write_f32_gguf(spec.folder, config, f32)
        setup["convert_s"] = round(time.perf_counter() - start, 3)
    if kind != "F32":
        setup["source_gguf_path"] = str(f32)  # kept: the next precision quantizes from it again
        start = time.perf_counter()
        quantize_gguf(f32, target, kind, spec.threads)
        setup["quantize_s"] = round(time.perf_counter() - start, 3)
    return target


def context_length(config: dict[str, Any], context: int | None) -> int:
    """The context to allocate: `context` when given, else the model's trained positions capped at
    MAX_CONTEXT."""
    if context is not None:
        if context < 1:
            raise ApplyError(f"context must be a positive number of tokens, not {context}")
        return int(context)
    trained = config.get("max_position_embeddings") or config.get("n_positions") or MAX_CONTEXT
    return min(int(trained), MAX_CONTEXT)


class LlamaCppGenerator:
    """A loaded llama.cpp model and context, generating greedily from token ids (batch 1)."""

    def __init__(self, path: Path, n_ctx: int, threads: int, f32_cache: bool) -> None:
        """Load the GGUF at `path` and make a context of `n_ctx` tokens whose batch holds a whole
        prompt (one decode call per prefill); `f32_cache` keeps the KV cache in F32 instead of F16."""
        self._llama_cpp = llama_cpp = _import_llama_cpp()
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        if not self._model:
            raise ApplyError(f"llama.cpp could not load {path}: {_llama_log()}; delete the file to convert it again")
        params = llama_cpp.llama_context_default_params()
        n_ctx = -(-n_ctx // CONTEXT_STEP) * CONTEXT_STEP  # llama.cpp pads it so; the batch then matches
        params.n_ctx = n_ctx
        params.n_batch = n_ctx
        params.n_ubatch = min(n_ctx, 512)
        params.n_seq_max = 1
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        if f32_cache:
            params.type_k = params.type_v = llama_cpp.GGML_TYPE_F32
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not self._ctx:
            self.close()
            raise ApplyError(f"llama.cpp could not make a context of {n_ctx} tokens for {path}: {_llama_log()}")
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(self._ctx))
        self.n_ubatch = int(llama_cpp.llama_n_ubatch(self._ctx))
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model)))
        self.kv_cache_type = "F32" if f32_cache else "F16"
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)

    def close(self) -> None:
        """Free the batch, context and model (idempotent)."""
        llama_cpp = self._llama_cpp
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
        self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
        self._model = None

    def __del__(self) -> None:
        """Free llama.cpp's memory when the generator goes away."""
        with contextlib.suppress(Exception):  # at interpreter shutdown llama_cpp may be half torn down
            self.close()

    def _prompt_ids(self, prompts: Any, new_tokens: int) -> list[int]:
        """The prompt's token ids, checked: one sequence, ids in the vocabulary, room in the context."""
        if self._ctx is None:
            raise ApplyError("this llama.cpp generator is closed: build a new one")
        if getattr(prompts, "ndim", None) != 2:
            shape = tuple(getattr(prompts, "shape", ()))
            raise ApplyError(f"prompts must be an int64 tensor [batch, prompt_len], not shape {shape}")
        batch, length = prompts.shape
        if batch != 1:
            raise ApplyError(
                f"the llama.cpp peer generates one sequence at a time, not a batch of {batch}: measure it with batch 1"
            )
        if length < 1:
            raise ApplyError("the prompt is empty: give at least one token")
        if length + new_tokens > self.n_ctx or length > self.n_batch:
            raise ApplyError(
                f"{length} prompt + {new_tokens} new tokens exceed the context of {self.n_ctx}: "
                "build with a larger context"
            )
        ids = [int(token) for token in prompts[0].tolist()]
        if min(ids) < 0 or max(ids) >= self.n_vocab:
            raise ApplyError(f"prompt token ids must lie in [0, {self.n_vocab}), got {min(ids)}..{max(ids)}")
        return ids

    def _run(self, ids: list[int], start: int, every_position: bool) -> None:
        """Decode `ids` at positions start.. in one llama_decode call, asking for the logits of every
        position or of the last one only."""
        llama_cpp, batch = self._llama_cpp, self._batch
        count = len(ids)
        for i, token in enumerate(ids):
            batch.token[i] = token
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if every_position else 0
        batch.logits[count - 1] = 1
        batch.n_tokens = count
        status = llama_cpp.llama_decode(self._ctx, batch)
        if status != 0:
            raise ApplyError(f"llama_decode failed with status {status} at position {start}: {_llama_log()}")

    def _next_token(self, ids: list[int], start: int) -> int:
        """Decode `ids` at positions start..; the argmax of the last position's logits."""
        import numpy as np

        self._run(ids, start, every_position=False)
        logits = np.ctypeslib.as_array(self._llama_cpp.llama_get_logits_ith(self._ctx, -1), shape=(self.n_vocab,))
        return int(logits.argmax())

    def _new_request(self) -> None:
        """Forget every earlier request: clear the KV cache."""
        self._llama_cpp.llama_memory_clear(self._llama_cpp.llama_get_memory(self._ctx), True)

    def logits(self, prompts: Any) -> Any:
        """The next-token logits at every position of `prompts` (one prefill, a fresh request): a
        float32 tensor [1, prompt_len, vocab]."""
        import numpy as np
        import torch

        ids = self._prompt_ids(prompts, 0)
        self._new_request()
        self._run(ids, 0, every_position=True)
        rows = np.ctypeslib.as_array(self._llama_cpp.llama_get_logits(self._ctx), shape=(len(ids), self.n_vocab))
        return torch.from_numpy(rows.copy())[None]

    def stream(self, prompts: Any, new_tokens: int) -> Iterator[Any]:
        """Yield `new_tokens` times the greedy next token as an int64 tensor [1]; the first after
        the prefill. Every call clears the KV cache first: a new request."""
        ids = self._prompt_ids(prompts, new_tokens)
        self._new_request()
        return self._tokens(ids, new_tokens)

    def _tokens(self, ids: list[int], new_tokens: int) -> Iterator[Any]:
        """The generation loop behind `stream`."""
        import torch

        if new_tokens < 1:
            return
        token = self._next_token(ids, 0)
        yield torch.tensor([token], dtype=torch.int64)
        for step in range(1, new_tokens):
            token = self._next_token([token], len(ids) + step - 1)
            yield torch.tensor([token], dtype=torch.int64)


def _versions(setup: dict[str, Any], llama_cpp: Any) -> None:
    """Record the versions of llama-cpp-python and gguf, and what llama.cpp's CPU backend uses."""
    from importlib.metadata import version

    setup["llama_cpp_version"] = getattr(llama_cpp, "__version__", version("llama_cpp_python"))
    setup["gguf_version"] = version("gguf")
    info = llama_cpp.llama_print_system_info()
    setup["llama_cpp_system_info"] = info.decode("utf-8", "replace").strip() if info else ""


def build(spec: PeerBuild, setup: dict[str, Any], context: int | None = None) -> Generator:
    """The llama.cpp generator of the model in `spec.folder` at `spec.precision`, converting its GGUF
    into `spec.work` (or reusing the one there) and recording what it did in `setup`. `context` is
    the tokens (prompt + new) the context holds; default: the model's positions, at most MAX_CONTEXT."""
    gguf_type(spec.precision)
    config = read_config(spec.folder)
    llama_cpp = _import_llama_cpp()
    kind = _resolve_kind(spec.precision, llama_cpp)
    setup["runtime"] = "llama.cpp"
    setup["gguf_type"] = kind
    if kind != GGUF_TYPES[spec.precision]:
        setup["gguf_type_note"] = f"{GGUF_TYPES[spec.precision]} is not in this llama.cpp; runs {kind}"
    _versions(setup, llama_cpp)
    setup["vocab"] = "no_vocab (token ids only, argmax of logits taken here)"
    path = convert(spec, config, kind, setup)
    setup["gguf_tensor_types"] = tensor_types(path)
    setup["weight_bytes"] = decode_bytes(path)
    start = time.perf_counter()
    generator = LlamaCppGenerator(path, context_length(config, context), spec.threads, f32_cache=kind == "F32")
    setup["load_s"] = round(time.perf_counter() - start, 3)
    setup.update(
        n_ctx=generator.n_ctx,
        n_batch=generator.n_batch,
        n_ubatch=generator.n_ubatch,
        n_threads=spec.threads,
        n_threads_batch=spec.threads,
        kv_cache_type=generator.kv_cache_type,
        flash_attn="auto (llama.cpp's default)",
        sampling="greedy: argmax of the last position's logits (numpy)",
    )
    return generator

