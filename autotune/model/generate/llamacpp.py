"""llama.cpp as a peer for text generation, through `llama-cpp-python`: backend=llamacpp's generation
concern (`Backend.generation`).

`build` converts the model folder that `save_pretrained` wrote to a GGUF file of our own writing
(`llamacpp_convert`), quantizes it with llama.cpp's own quantizer when the precision asks for it,
and loads it into a llama.cpp context (`llamacpp_context`), whose generator decodes token ids.

Each GGUF is an artifact of the one cache (`converted.cached`): named by the model folder's key, its
GGUF type, the converter's version and the versions of llama-cpp-python and gguf, reused when the
same model and precision come again, listed and pruned by `autotune cache`. The F32 GGUF is the
source of every quantized one and is kept for the next precision.

llama_cpp, gguf, numpy and torch are imported inside functions: this module imports without them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from autotune.model.errors import ApplyError
from autotune.model.generate import converted
from autotune.model.generate.base import Build, Generator
from autotune.model.generate.llamacpp_context import LlamaCppGenerator, context_length, import_llama_cpp
from autotune.model.generate.llamacpp_convert import (
    CONVERTER_VERSION,
    decode_bytes,
    quantize_gguf,
    read_config,
    tensor_types,
    write_f32_gguf,
)

NAME = "llamacpp"  # the backend, and its artifacts' name prefix in the cache
SUFFIX = ".gguf"
# Our precision name -> the GGUF weight type llama.cpp runs it as.
GGUF_TYPES = {"fp32": "F32", "bf16": "BF16", "int8_weight_only": "Q8_0", "int4_weight_only": "Q4_0"}
PRECISION_OF = {**{kind: precision for precision, kind in GGUF_TYPES.items()}, "F16": "bf16"}
DISTRIBUTIONS = ("llama-cpp-python", "gguf")  # the versions that key its GGUFs


def gguf_type(precision: str) -> str:
    """The GGUF weight type of `precision`, or ApplyError naming the precisions this peer runs."""
    if precision not in GGUF_TYPES:
        runs = ", ".join(f"{ours} as {theirs}" for ours, theirs in GGUF_TYPES.items())
        raise ApplyError(f"llama.cpp has no precision {precision!r}; it runs {runs}: pick one of those")
    return GGUF_TYPES[precision]


def _resolve_kind(precision: str, llama_cpp: Any) -> str:
    """The GGUF type to write for `precision`: BF16 becomes F16 where this llama.cpp has no BF16."""
    kind = gguf_type(precision)
    if kind == "BF16" and not hasattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_BF16"):
        return "F16"
    return kind


def gguf_file(spec: Build, config: dict[str, Any], kind: str, setup: dict[str, Any]) -> tuple[Path, bool]:
    """The GGUF of `kind` for the model in `spec.folder`, from the cache or converted into it (a
    quantized one from the F32 one, itself cached), and whether it was reused. Records the times in
    `setup`."""
    folder = spec.folder
    assert folder is not None
    versions = converted.versions(DISTRIBUTIONS)
    key = {"knobs": {"backend": NAME, "precision": PRECISION_OF[kind]}, "gguf_type": kind,
           "model": config["model_type"], "weights": converted.source_key(folder),
           "converter": CONVERTER_VERSION, "runtime": versions[DISTRIBUTIONS[0]], "versions": versions}

    def write_f32(path: Path, described: dict[str, Any]) -> None:
        start = time.perf_counter()
        write_f32_gguf(folder, config, path)
        setup["convert_s"] = described["convert_s"] = round(time.perf_counter() - start, 3)

    def quantize(path: Path, described: dict[str, Any]) -> None:
        source = gguf_file(spec, config, "F32", setup)[0]  # kept: the next precision quantizes from it again
        setup["source_gguf_path"] = str(source)
        start = time.perf_counter()
        quantize_gguf(source, path, kind, spec.threads)
        setup["quantize_s"] = described["quantize_s"] = round(time.perf_counter() - start, 3)

    return converted.cached(spec.cache, NAME, SUFFIX, key, write_f32 if kind == "F32" else quantize)


def _versions(setup: dict[str, Any], llama_cpp: Any) -> None:
    """Record the versions of llama-cpp-python and gguf, and what llama.cpp's CPU backend uses."""
    found = converted.versions(DISTRIBUTIONS)
    setup["llama_cpp_version"] = getattr(llama_cpp, "__version__", found["llama-cpp-python"])
    setup["gguf_version"] = found["gguf"]
    info = llama_cpp.llama_print_system_info()
    setup["llama_cpp_system_info"] = info.decode("utf-8", "replace").strip() if info else ""


def build(spec: Build, setup: dict[str, Any], context: int | None = None) -> Generator:
    """The llama.cpp generator of the model in `spec.folder` at `spec.precision`, its GGUF from the
    cache (`spec.cache`) or converted into it, recording what it did in `setup`. `context` is the
    tokens (prompt + new) the context holds; default: the model's positions, at most MAX_CONTEXT."""
    gguf_type(spec.precision)
    if spec.folder is None:
        raise ApplyError("the llama.cpp peer converts a save_pretrained folder; give Build one")
    config = read_config(spec.folder)
    llama_cpp = import_llama_cpp()
    kind = _resolve_kind(spec.precision, llama_cpp)
    setup["runtime"] = "llama.cpp"
    setup["gguf_type"] = kind
    if kind != GGUF_TYPES[spec.precision]:
        setup["gguf_type_note"] = f"{GGUF_TYPES[spec.precision]} is not in this llama.cpp; runs {kind}"
    _versions(setup, llama_cpp)
    setup["vocab"] = "no_vocab (token ids only, argmax of logits taken here)"
    setup.update(convert_s=0.0, quantize_s=0.0)
    path, reused = gguf_file(spec, config, kind, setup)
    setup.update(gguf_path=str(path), gguf_reused=reused)
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
        repacked_weights=generator.repacked,
        sampling="greedy: argmax of the last position's logits (numpy)",
    )
    return generator
