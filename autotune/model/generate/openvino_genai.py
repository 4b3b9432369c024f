"""Generation in OpenVINO GenAI: backend=openvino's generation concern (`Backend.generation`), the
peer a user would run instead of PyTorch's loop: `LLMPipeline` on the CPU over a stateful OpenVINO
IR converted from the `save_pretrained` folder (`openvino_convert`), streamed by `openvino_run`.

Route (`setup["route"]`): "ov.convert_model+make_stateful+LLMPipeline".

The weights' precisions (`spec.precision`):
- fp32: fp32 weights, INFERENCE_PRECISION_HINT f32;
- bf16: the same fp32 IR, INFERENCE_PRECISION_HINT bf16 (the CPU plugin converts the weights and
  computes in bf16; no fp16 weights on disk);
- int8_weight_only: NNCF INT8_ASYM, per output channel;
- int4_weight_only: NNCF INT4_ASYM, group size 128, ratio 1.0, no dataset (`openvino_convert`).

Runtime: the KV cache in u8 (KV_CACHE_PRECISION: OpenVINO's documented CPU default, set explicitly
so a version that changes it changes nothing here); ATTENTION_BACKEND SDPA: the stateful IR run as
it is, its KV cache the IR's states, reset per request. GenAI's CPU default, PA (the IR rewritten
to PagedAttention, continuous batching's block cache), gave on a random 0.5B qwen2 in bf16 a
different greedy token from one request to the next after ~165 positions (same prompt; SDPA
never did); the latency hint, `spec.threads` as INFERENCE_NUM_THREADS. No tokenizer IR: token ids in,
token ids out.

The IR is an artifact of the one cache (`converted.cached`): a folder named by the model folder's
key, the weights' format, the conversion's format and the versions that made it, reused when
present, listed and pruned by `autotune cache`.

openvino, openvino_genai, nncf, torch and transformers are imported inside functions.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from autotune.model.artifacts import description, installed_torch_version
from autotune.model.errors import ApplyError
from autotune.model.generate import converted
from autotune.model.generate.base import Build
from autotune.model.generate.converted import one_line
from autotune.model.generate.openvino_convert import IR_NAME, convert
from autotune.model.generate.openvino_run import OpenVINOGenerator

NAME = "openvino"  # the backend, and its IR folders' name prefix in the cache
SUFFIX = ".genai"
ROUTE = "ov.convert_model+make_stateful+LLMPipeline"
IR_FORMAT = 1  # bump when the conversion changes: older IRs are then not reused
KV_CACHE_PRECISION = "u8"
ATTENTION_BACKEND = "SDPA"  # see the module docstring: PA gave requests that differed
INSTALL = "pip install 'openvino-genai==<your openvino version>' (openvino-genai and openvino must match)"
DISTRIBUTIONS = ("openvino-genai", "openvino", "nncf", "transformers", "torch")  # what converts and runs the IR

# spec.precision -> (the IR's weights, the CPU plugin's INFERENCE_PRECISION_HINT)
PRECISIONS: dict[str, tuple[str, str]] = {
    "fp32": ("fp32", "f32"),
    "bf16": ("fp32", "bf16"),
    "int8_weight_only": ("int8_asym", "f32"),
    "int4_weight_only": ("int4_asym_g128", "f32"),
}
WEIGHTS_PRECISION = {"fp32": "fp32", "int8_asym": "int8_weight_only", "int4_asym_g128": "int4_weight_only"}


def build(spec: Build, setup: dict[str, Any]) -> OpenVINOGenerator:
    """An OpenVINO GenAI generator for the causal LM in `spec.folder` at `spec.precision` with
    `spec.threads` threads; the IR from the cache (`spec.cache`) or converted into it; what it did goes to
    `setup`."""
    if spec.precision not in PRECISIONS:
        raise ApplyError(f"precision={spec.precision}: the openvino_genai peer runs {', '.join(PRECISIONS)}; "
                         f"pick one of those")
    if spec.folder is None:
        raise ApplyError("the openvino_genai peer converts a save_pretrained folder; give Build one")
    genai = converted.import_runtime("openvino_genai", "openvino_genai", INSTALL)
    weights, inference = PRECISIONS[spec.precision]
    setup.update(route=ROUTE, versions=versions(), weights=weights, inference_precision=inference,
                 kv_cache_precision=KV_CACHE_PRECISION, attention_backend=ATTENTION_BACKEND,
                 performance_hint="LATENCY", threads=spec.threads, tokenizer="none (token ids in and out)")
    ir = ir_folder(spec.folder, weights, spec.cache, setup)
    properties = runtime_properties(spec.threads, inference)
    start = time.perf_counter()
    try:
        pipe = genai.LLMPipeline(str(ir), "CPU", **properties)
    except Exception as exc:
        raise ApplyError(f"openvino_genai cannot load the IR in {ir}: {one_line(exc)}; delete that folder "
                         f"(autotune cache --prune) to convert again") from None
    setup["load_s"] = time.perf_counter() - start
    setup["ov_properties"] = {key: str(value) for key, value in properties.items()}
    setup["weight_bytes"] = decode_bytes(ir / IR_NAME)
    return OpenVINOGenerator(pipe, eos_token(spec.folder), ir / IR_NAME, properties)


def ir_folder(folder: Path, weights: str, cache: Path, setup: dict[str, Any]) -> Path:
    """The folder of the stateful IR of `folder` with `weights`: reused from the cache when there,
    else converted into it."""
    found = versions()
    key = {"knobs": {"backend": NAME, "precision": WEIGHTS_PRECISION[weights]}, "ir_weights": weights,
           "model": converted.model_type(folder), "weights": converted.source_key(folder), "route": ROUTE,
           "ir_format": IR_FORMAT, "runtime": found[DISTRIBUTIONS[0]], "torch": installed_torch_version(),
           "versions": found}

    def make(out: Path, described: dict[str, Any]) -> None:
        out.mkdir()
        start = time.perf_counter()
        described["compression"] = convert(folder, weights, out)
        described["convert_s"] = time.perf_counter() - start

    path, reused = converted.cached(cache, NAME, SUFFIX, key, make)
    made = description(path)
    setup.update(ir=str(path), ir_reused=reused, convert_s=0.0 if reused else made.get("convert_s"),
                 **made.get("compression", {}))
    if reused:
        setup["original_convert_s"] = made.get("convert_s")
    return path


def decode_bytes(ir: Path) -> int:
    """The bytes of the IR's weights a decode step reads: every constant but those of the token
    embedding (the Gather that reads input_ids reads one row of them)."""
    import openvino as ov

    model = ov.Core().read_model(str(ir))
    total = sum(int(op.get_byte_size()) for op in model.get_ops() if op.get_type_name() == "Constant")
    embedding = sum(_embedding_bytes(op) for op in model.get_ops()
                    if op.get_type_name() == "Gather" and _reads_input_ids(op))
    return converted.decode_bytes(total, embedding, tied=False)


def _reads_input_ids(gather: Any) -> bool:
    node = gather.input_value(1).get_node()
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    return bool(node.get_type_name() == "Parameter" and node.get_friendly_name() == "input_ids")


def _embedding_bytes(gather: Any) -> int:
    """The constants behind a Gather's table (through NNCF's decompression: Convert, Subtract, Multiply, Reshape)."""
    found, todo, seen = 0, [gather.input_value(0).get_node()], set()
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.get_type_name() == "Constant":
            found += int(node.get_byte_size())
        elif node.get_type_name() in ("Convert", "Subtract", "Multiply", "Reshape"):
            todo += [value.get_node() for value in node.input_values()]
    return found


def runtime_properties(threads: int, inference: str) -> dict[str, Any]:
    """The CPU plugin's and GenAI's properties for a latency-bound single stream."""
    return {
        "INFERENCE_NUM_THREADS": int(threads),
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": inference,
        "KV_CACHE_PRECISION": KV_CACHE_PRECISION,
        "ATTENTION_BACKEND": ATTENTION_BACKEND,
    }


def eos_token(folder: Path) -> int:
    """The model's eos id (GenAI wants one even when it is ignored), 0 when config.json names none."""
    config = json.loads((Path(folder) / "config.json").read_text())
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) and eos >= 0 else 0


def versions() -> dict[str, str]:
    """The versions of what converts and runs the IR."""
    return converted.versions(DISTRIBUTIONS)
