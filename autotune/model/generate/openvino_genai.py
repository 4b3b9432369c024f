"""Generation in OpenVINO GenAI: the peer a user would run instead of PyTorch's loop, `LLMPipeline` on
the CPU over a stateful OpenVINO IR converted here from the `save_pretrained` folder.

Route (`setup["route"]`): "ov.convert_model+make_stateful+LLMPipeline". No optimum-intel: its
exporter wants an older transformers than the project's. The conversion does by hand what
optimum-intel's exporter does for a decoder:

- `openvino.convert_model` traces (TorchScript) a wrapper of the transformers model (attention
  `sdpa`, so the IR has the ScaledDotProductAttention ops GenAI's PagedAttention rewrite looks for)
  that takes input_ids, attention_mask, position_ids and the past keys and values flattened, and
  returns the logits and the present keys and values;
- the inputs and outputs get optimum-intel's names (past_key_values.{i}.key/value, present.{i}...),
  a `beam_idx` input gathers every past key/value along the batch, and
  `apply_make_stateful_transformation` turns each past/present pair into an internal state, its
  initial value zeros of the batch of input_ids (optimum-intel's `patch_stateful`);
- int8_weight_only / int4_weight_only: NNCF `compress_weights` on that IR, without data.

The weights' precisions (`spec.precision`):
- fp32: fp32 weights, INFERENCE_PRECISION_HINT f32;
- bf16: the same fp32 IR, INFERENCE_PRECISION_HINT bf16 (the CPU plugin converts the weights and
  computes in bf16; no fp16 weights on disk);
- int8_weight_only: NNCF INT8_ASYM, per output channel;
- int4_weight_only: NNCF INT4_ASYM (optimum-intel's default 4-bit mode), group size 128, ratio 1.0,
  no dataset; NNCF keeps the embedding and the last layer in its INT8_ASYM backup precision, and
  a layer whose channels 128 does not divide gets the largest power-of-two group that does.

Runtime: the KV cache in u8 (KV_CACHE_PRECISION: OpenVINO's documented CPU default, set explicitly
so a version that changes it changes nothing here); ATTENTION_BACKEND SDPA: the stateful IR run as
it is, its KV cache the IR's states, reset per request. GenAI's CPU default, PA (the IR rewritten
to PagedAttention, continuous batching's block cache), gave on a random 0.5B qwen2 in bf16 a
different greedy token from one request to the next after ~165 positions (same prompt; SDPA
never did); the latency hint, `spec.threads` as INFERENCE_NUM_THREADS. No tokenizer IR: token ids in,
token ids out. Greedy with `ignore_eos` (not min_new_tokens, which would mask the eos logit), so a
request yields exactly the tokens asked for. `generate` runs in a thread; its streamer hands each
token to `stream` and waits until the consumer asks for the next one, so a yield's time is the
step's time, as in PyTorch's loop.

The IR is kept in `spec.work/openvino-genai/<fingerprint>` (the folder's files, the weights'
format and the versions), written to a temporary folder then renamed, reused when present.

openvino, openvino_genai, nncf, torch and transformers are imported inside functions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import queue
import shutil
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.model.errors import ApplyError
from autotune.model.generate.base import PeerBuild

ROUTE = "ov.convert_model+make_stateful+LLMPipeline"
IR_FORMAT = 1  # bump when the conversion changes: older IRs in `work` are then not reused
IR_NAME = "openvino_model.xml"  # the name LLMPipeline looks for in its folder
META_NAME = "autotune_ir.json"
KV_CACHE_PRECISION = "u8"
ATTENTION_BACKEND = "SDPA"  # see the module docstring: PA gave requests that differed
INT4_GROUP = 128
INT4_RATIO = 1.0
INSTALL = "pip install 'openvino-genai==<your openvino version>' (openvino-genai and openvino must match)"

# spec.precision -> (the IR's weights, the CPU plugin's INFERENCE_PRECISION_HINT)
PRECISIONS: dict[str, tuple[str, str]] = {
    "fp32": ("fp32", "f32"),
    "bf16": ("fp32", "bf16"),
    "int8_weight_only": ("int8_asym", "f32"),
    "int4_weight_only": ("int4_asym_g128", "f32"),
}


def build(spec: PeerBuild, setup: dict[str, Any]) -> OpenVINOGenerator:
    """An OpenVINO GenAI generator for the causal LM in `spec.folder` at `spec.precision` with
    `spec.threads` threads; the IR converted (or reused) under `spec.work`; what it did goes to `setup`."""
    if spec.precision not in PRECISIONS:
        raise ApplyError(f"precision={spec.precision}: the openvino_genai peer runs {', '.join(PRECISIONS)}; "
                         f"pick one of those")
    genai = _import_genai()
    weights, inference = PRECISIONS[spec.precision]
    setup.update(route=ROUTE, versions=versions(), weights=weights, inference_precision=inference,
                 kv_cache_precision=KV_CACHE_PRECISION, attention_backend=ATTENTION_BACKEND,
                 performance_hint="LATENCY", threads=spec.threads, tokenizer="none (token ids in and out)")
    ir = ensure_ir(spec.folder, weights, Path(spec.work), setup)
    properties = runtime_properties(spec.threads, inference)
    start = time.perf_counter()
    try:
        pipe = genai.LLMPipeline(str(ir), "CPU", **properties)
    except Exception as exc:
        raise ApplyError(f"openvino_genai cannot load the IR in {ir}: {one_line(exc)}; delete that folder "
                         f"to convert again") from None
    setup["load_s"] = time.perf_counter() - start
    setup["ov_properties"] = {key: str(value) for key, value in properties.items()}
    setup["weight_bytes"] = decode_bytes(ir / IR_NAME)
    return OpenVINOGenerator(pipe, eos_token(spec.folder), ir / IR_NAME, properties)


class OpenVINOGenerator:
    """An LLMPipeline that streams greedy tokens (`base.Generator`), one request per call."""

    def __init__(self, pipe: Any, eos: int, ir: Path | None = None, properties: dict[str, Any] | None = None) -> None:
        self.pipe, self.eos, self.ir, self.properties = pipe, eos, ir, properties or {}

    def logits(self, prompts: Any) -> Any:
        """The IR's next-token logits at every position of `prompts` (one prefill each, a fresh
        state), by the CPU plugin with the pipeline's precision and threads: the same graph
        LLMPipeline runs, compiled for this call alone (kept, it would count as serving memory)."""
        import numpy as np
        import openvino as ov
        import torch

        if self.ir is None:
            raise ApplyError("this OpenVINO GenAI generator was made without its IR; build it with build()")
        plugin = {key: value for key, value in self.properties.items() if key != "ATTENTION_BACKEND"}
        compiled = ov.Core().compile_model(str(self.ir), "CPU", plugin)
        rows = []
        for row in prompts.to(torch.int64).numpy():
            request = compiled.create_infer_request()
            length = row.shape[0]
            feeds = {"input_ids": row[None], "attention_mask": np.ones((1, length), dtype=np.int64),
                     "position_ids": np.arange(length, dtype=np.int64)[None], "beam_idx": np.zeros(1, dtype=np.int32)}
            request.infer({name: feeds[name] for name in (p.get_any_name() for p in compiled.inputs)})
            rows.append(torch.from_numpy(np.array(request.get_tensor("logits").data, dtype=np.float32)))
        del compiled
        return torch.cat(rows)

    def stream(self, prompts: Any, new_tokens: int) -> Iterator[Any]:
        import openvino as ov
        import torch

        if prompts.dim() != 2 or prompts.shape[0] != 1:
            raise ApplyError(f"openvino_genai generates one sequence at a time, not prompts of shape "
                             f"{tuple(prompts.shape)}; use batch=1")
        if new_tokens < 1:
            return
        ids = ov.Tensor(prompts.to(torch.int64).contiguous().numpy())
        streamer = _streamer()
        worker = threading.Thread(target=self._generate, args=(ids, new_tokens, streamer), daemon=True)
        worker.start()
        done = 0
        try:
            while done < new_tokens:
                token = streamer.next_token()
                done += 1
                yield torch.tensor([token], dtype=torch.int64)
        finally:
            streamer.finish(cancel=done < new_tokens)
            worker.join()

    def _generate(self, ids: Any, new_tokens: int, streamer: Any) -> None:
        """One greedy request of exactly `new_tokens` tokens, its tokens to `streamer`; a failure too."""
        try:
            self.pipe.generate(ids, generation_config(new_tokens, self.eos), streamer)
        except Exception as exc:
            streamer.ended(exc)
        else:
            streamer.ended(None)


def generation_config(new_tokens: int, eos: int) -> Any:
    """Greedy, exactly `new_tokens` tokens: eos ignored rather than masked (masking it with
    min_new_tokens would change the greedy choice where eos is the argmax)."""
    import openvino_genai as genai

    config = genai.GenerationConfig()
    config.max_new_tokens = new_tokens
    config.do_sample = False
    config.num_beams = 1
    config.ignore_eos = True
    config.eos_token_id = eos  # GenAI wants one; ignored
    return config


def _streamer() -> Any:
    """A GenAI streamer that hands each token to the consumer and waits for it to ask for the next."""
    return _streamer_class()()


@functools.cache
def _streamer_class() -> Any:
    """The streamer's class, a subclass of GenAI's StreamerBase (made once, on first use)."""
    import openvino_genai as genai

    class LockstepStreamer(genai.StreamerBase):  # type: ignore[misc]
        """Tokens from GenAI's thread to `stream`, one at a time: `write` blocks until the consumer
        asks for the next token (or stops), so GenAI computes a step only when it is wanted."""

        def __init__(self) -> None:
            super().__init__()
            self.tokens: queue.Queue[tuple[str, Any]] = queue.Queue()
            self.resume = threading.Semaphore(0)
            self.started = False
            self.cancelled = False

        def write(self, token: Any) -> Any:
            for one in (token if isinstance(token, list) else [token]):
                self.tokens.put(("token", int(one)))
                self.resume.acquire()
                if self.cancelled:
                    return genai.StreamingStatus.CANCEL
            return genai.StreamingStatus.RUNNING

        def end(self) -> None:
            """Nothing to flush: tokens go out as they come."""

        def next_token(self) -> int:
            """The next token; the generation's failure raised as an ApplyError, as is an early end."""
            if self.started:
                self.resume.release()  # the writer of the previous token may go on
            self.started = True
            kind, value = self.tokens.get()
            if kind == "token":
                return int(value)
            if value is not None:
                raise ApplyError(f"openvino_genai failed to generate: {one_line(value)}")
            raise ApplyError("openvino_genai stopped before the tokens asked for; check the model's "
                             "max_position_embeddings against the prompt and new tokens")

        def ended(self, exc: BaseException | None) -> None:
            """The generation ended (with `exc` if it failed)."""
            self.tokens.put(("end", exc))

        def finish(self, cancel: bool) -> None:
            """The consumer is done: let a waiting `write` return, cancelling the rest if `cancel`."""
            self.cancelled = cancel
            self.resume.release()

    return LockstepStreamer


def decode_bytes(ir: Path) -> int:
    """The bytes of the IR's weights a decode step reads: every constant but those of the token
    embedding (the Gather that reads input_ids reads one row of them)."""
    import openvino as ov

    model = ov.Core().read_model(str(ir))
    total = sum(int(op.get_byte_size()) for op in model.get_ops() if op.get_type_name() == "Constant")
    return total - sum(_embedding_bytes(op) for op in model.get_ops() if op.get_type_name() == "Gather"
                       and _reads_input_ids(op))


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


def ensure_ir(folder: Path, weights: str, work: Path, setup: dict[str, Any]) -> Path:
    """The folder of the stateful IR of `folder` with `weights`: reused from `work` when there,
    else converted into a temporary folder and renamed into place."""
    key = fingerprint(folder, weights)
    target = work / "openvino-genai" / key
    setup["ir"] = str(target)
    if (target / IR_NAME).is_file() and (target / META_NAME).is_file():
        meta = json.loads((target / META_NAME).read_text())
        setup.update(ir_reused=True, convert_s=0.0, original_convert_s=meta.get("convert_s"))
        setup.update(meta.get("compression", {}))
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{key}-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        start = time.perf_counter()
        compression = convert(folder, weights, tmp)
        convert_s = time.perf_counter() - start
        meta = {"source": str(folder), "weights": weights, "route": ROUTE, "convert_s": convert_s,
                "compression": compression, "versions": versions()}
        (tmp / META_NAME).write_text(json.dumps(meta, indent=1))
        try:
            tmp.rename(target)
        except OSError:  # another build renamed its copy first: keep that one
            if not (target / IR_NAME).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    setup.update(ir_reused=False, convert_s=convert_s, **compression)
    return target


def fingerprint(folder: Path, weights: str) -> str:
    """A key for the IR of `folder` at `weights`: every file's name, size and mtime, the contents of
    the small ones (config.json...), the conversion's format and the versions that made it."""
    digest = hashlib.sha256(json.dumps({"weights": weights, "format": IR_FORMAT, "versions": versions()},
                                       sort_keys=True).encode())
    files = sorted(path for path in Path(folder).rglob("*") if path.is_file())
    if not any(path.name == "config.json" for path in files):
        raise ApplyError(f"{folder} has no config.json; save the model with save_pretrained")
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        if stat.st_size < 1 << 20:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


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


def eos_token(folder: Path) -> int:
    """The model's eos id (GenAI wants one even when it is ignored), 0 when config.json names none."""
    config = json.loads((Path(folder) / "config.json").read_text())
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) and eos >= 0 else 0


def versions() -> dict[str, str]:
    """The versions of what converts and runs the IR."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("openvino", "openvino-genai", "nncf", "transformers", "torch"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "absent"
    return found


def _import_genai() -> Any:
    """openvino_genai, or an ApplyError saying how to install it."""
    try:
        import openvino_genai
    except ImportError as exc:
        raise ApplyError(f"the openvino_genai peer needs openvino-genai ({one_line(exc)}); {INSTALL}") from None
    return openvino_genai


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (OpenVINO's first line is often only a source location),
    cut at 300 characters, with its type."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
