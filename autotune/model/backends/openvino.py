"""backend=openvino: `openvino.convert_model(model, example_input=...)` with the example's shapes
fixed, saved as IR (an .xml beside its .bin, weights kept in fp32), compiled for the CPU plugin with
the knobs' hint, streams, pinning, the process's thread count and the inference precision (bf16
where precision=bf16). precision=int8: NNCF post-training quantization on the calibration batches,
with its overflow fix (7-bit weights) where this CPU's int8 sums saturate (measured: `saturation.remedy`).
With int8_fallback=N, the N quantized Convolution/MatMul nodes that move the output most are left out
of the quantization (NNCF's `IgnoredScope`), ranked once per model and calibration as PT2E's layers
are (`autotune.model.fallback`): NNCF quantizes without each candidate alone, and the closer to eager
fp32 on the calibration batches, the more sensitive the node.

The probe runs its operations as OpenVINO models (int8 with FakeQuantize, the form NNCF writes) and
reads back which precision the CPU plugin really ran them in.

OpenVINO's runtime frees memory a preloaded malloc did not allocate ("free(): invalid pointer",
SIGABRT; SIGBUS once): every such run crashed, resnet18 and BERT alike (OpenVINO 2026.4.1), so it
never runs under jemalloc or tcmalloc.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.model import fallback, saturation
from autotune.model.backends.base import Generation, Packages, Ready
from autotune.model.backends.converted import CONVERT_FAILED, Converter, Run, failed_at, flat, flat_numpy
from autotune.model.batches import explain, split
from autotune.model.errors import ApplyError
from autotune.model.kernels import CONV, Kernel, inputs, quantized
from autotune.model.knobdefs import INT8_FALLBACK, Knob, KnobValue, ModelSettings, Precision

OV_PRECISION = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}  # int8: the quantized layers run int8 anyway


class OpenVINO(Converter):
    name = "openvino"
    runtime = "openvino"
    label = "OpenVINO"
    summary = "openvino.convert_model, saved as IR, compiled for the CPU plugin"
    precisions: tuple[Precision, ...] = ("fp32", "bf16", "int8")
    # NNCF quantizes for OpenVINO.
    packages = Packages("OpenVINO", "openvino", ("openvino", "nncf"), ("openvino", "nncf"))
    # --task generate: OpenVINO GenAI's LLMPipeline on an IR converted by openvino and compressed by NNCF
    generates: tuple[Precision, ...] = ("fp32", "bf16", "int8_weight_only", "int4_weight_only")
    generation = Generation("autotune.model.generate.openvino_genai", Packages(
        "OpenVINO GenAI", "openvino-genai", ("openvino-genai", "openvino", "nncf"),
        ("openvino_genai", "openvino", "nncf")))
    suffix = ".xml"
    int8_remedy = "overflow_fix"

    def __init__(self) -> None:
        self.knobs = (
            self.own(Knob("ov_hint", "choice", "OpenVINO's performance hint: latency (one stream, all threads) or "
                          "throughput (several streams)", choices=("latency", "throughput"), default="latency",
                          places=True)),
            self.own(Knob("ov_streams", "int", "OpenVINO's number of streams (NUM_STREAMS); 0 = as the hint decides",
                          low=0, high=4096, default=0, places=True, core_bound=True, shrinks_with="omp_threads")),
            self.own(Knob("ov_pinning", "bool", "OpenVINO pins its threads to CPUs (ENABLE_CPU_PINNING)",
                          default=True, places=True)),
            self.own(INT8_FALLBACK),
        )

    def files(self, path: Path) -> tuple[Path, ...]:
        return path, weights_file(path)

    def recipes(self, cores: int) -> tuple[tuple[str, dict[str, KnobValue]], ...]:
        """At its defaults (the LATENCY hint), then its bf16 inference precision (it does not always pick
        it by itself: on an AVX-512 EPYC without AMX its defaults ran fp32) and its int8 through NNCF,
        each where the probe runs it well."""
        return (("OpenVINO defaults (LATENCY hint)", {"backend": self.name}),
                ("OpenVINO bf16", {"backend": self.name, "precision": "bf16"}),
                ("OpenVINO int8 (NNCF)", {"backend": self.name, "precision": "int8"}))

    def generation_recipes(self, cores: int) -> tuple[tuple[str, dict[str, KnobValue]], ...]:
        """OpenVINO GenAI with NNCF's weight compression, int4 (optimum-intel's default) and int8."""
        return (("OpenVINO GenAI int4", {"backend": self.name, "precision": "int4_weight_only", "omp_threads": cores}),
                ("OpenVINO GenAI int8", {"backend": self.name, "precision": "int8_weight_only", "omp_threads": cores}))

    def save(self, model: Any, example: Any, knobs: ModelSettings, tmp: Path, path: Path,
             calibration: Sequence[Any], setup: dict[str, Any], described: dict[str, Any]) -> None:
        """The IR's weights go straight to their final place first, so that no process finds an .xml
        without its .bin."""
        import openvino as ov

        args, kwargs = split(example)
        if args and kwargs:
            raise ApplyError("backend=openvino converts a model called with positional or keyword inputs, not both")
        try:
            converted = _converted(model, args, kwargs)
            shapes = [ov.PartialShape(list(t.shape)) for t in flat(example)]  # fixed, as the other backends compile
            converted.reshape(dict(zip(converted.inputs, shapes, strict=True)))
        except Exception as exc:
            raise ApplyError(f"backend=openvino: openvino.convert_model {CONVERT_FAILED} at "
                             f"{failed_at(exc)} ({explain(exc)}); use another backend for it") from exc
        if knobs.precision == "int8":
            converted = _int8(model, converted, calibration, knobs.int8_fallback, path.parent, described, setup)
        bin_tmp = weights_file(tmp)
        try:
            ov.save_model(converted, str(tmp), compress_to_fp16=False)
            os.replace(bin_tmp, weights_file(path))
        finally:
            bin_tmp.unlink(missing_ok=True)

    def runner(self, path: Path, knobs: ModelSettings, threads: int) -> Run:
        import openvino as ov

        config: dict[str, Any] = {"PERFORMANCE_HINT": knobs.ov_hint.upper(), "INFERENCE_NUM_THREADS": threads,
                                  "ENABLE_CPU_PINNING": knobs.ov_pinning,
                                  "INFERENCE_PRECISION_HINT": OV_PRECISION[knobs.precision]}
        if knobs.ov_streams:
            config["NUM_STREAMS"] = knobs.ov_streams
        core = ov.Core()
        try:
            compiled = core.compile_model(core.read_model(str(path), str(weights_file(path))), "CPU", config)
        except Exception as exc:
            raise ApplyError(f"OpenVINO could not load {path.name} ({explain(exc)}); delete it and its .bin to "
                             f"convert the model anew") from exc
        request = compiled.create_infer_request()

        def run(arrays: list[Any]) -> list[Any]:
            return [array.copy() for array in request.infer(arrays).to_tuple()]

        return run

    def probe_kernel(self, kernel: Kernel, remedy: bool) -> Ready:
        import openvino as ov

        model = _probe_model(kernel, remedy)
        core = ov.Core()

        def compiled(threads: int) -> Any:
            return core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                                     "INFERENCE_PRECISION_HINT": OV_PRECISION[kernel.precision]})

        def at(threads: int) -> Callable[[], Any]:
            request = compiled(threads).create_infer_request()
            x = inputs(kernel.op)[0].numpy()
            return lambda: request.infer([x])[0]

        return at, _ran_as(compiled(1), kernel.op)


def weights_file(path: Path) -> Path:
    """OpenVINO IR's weights, beside its .xml."""
    return path.with_suffix(".bin")


def _converted(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """OpenVINO's model from the module, as its TorchScript tracing sees it; where tracing fails (a
    dict or nested output, say), from torch.export's graph, which convert_model also takes. The
    tracing's failure is the one told when both fail."""
    import openvino as ov
    import torch

    try:
        return ov.convert_model(model, example_input=kwargs or (args[0] if len(args) == 1 else args))
    except Exception as traced:
        try:
            with torch.no_grad():
                return ov.convert_model(torch.export.export(model, args, kwargs))
        except Exception:
            raise traced from None


def _int8(model: Any, converted: Any, calibration: Sequence[Any], keep: int, folder: Path,
          described: dict[str, Any], setup: dict[str, Any]) -> Any:
    """NNCF's int8 of `converted`; with `keep` (int8_fallback), the `keep` most sensitive nodes left in
    fp32, ranked once and kept in `folder` beside the artifact `described`, which records them."""
    import time

    start = time.perf_counter()
    if not keep:
        quantized = _nncf_quantized(model, converted, calibration)
    else:
        reference = fallback.outputs(model, calibration)
        ranking = fallback.ranked(fallback.ranking_path(folder, described), described,
                                  lambda: _ranking(model, converted, calibration, reference), setup)
        kept = ranking.order[:keep]
        quantized = _nncf_quantized(model, converted, calibration, kept)
        setup.update(int8_kept_fp32=list(kept), int8_divergence_full=ranking.divergence_full,
                     int8_divergence=fallback.divergence(reference, fallback.outputs(Compiled(quantized), calibration)))
        described["int8_fallback"] = fallback.recorded(setup)
    setup["quantize_s"] = time.perf_counter() - start
    return quantized


LAYER_TYPES = ("Convolution", "GroupConvolution", "MatMul")  # the nodes whose int8 int8_fallback may revert
MODULE = re.compile(r"__module\.([^/]+)/")  # the module a node of a traced conversion came from


def _ranking(model: Any, converted: Any, calibration: Sequence[Any], reference: fallback.Outputs) -> fallback.Ranking:
    """The nodes NNCF quantized, ranked (`fallback.rank`): each quantized again without it alone. A
    larger model's candidates are chosen by PyTorch's proxy on the module each node came from."""
    full = _nncf_quantized(model, converted, calibration)
    names = quantized_layers(converted, full)

    def without(kept: tuple[str, ...]) -> Compiled:
        return Compiled(_nncf_quantized(model, converted, calibration, kept) if kept else full)

    def proxy() -> dict[str, float]:
        modules = {name: found.group(1) for name in names if (found := MODULE.search(name))}
        errors = fallback.proxy_errors(model, calibration, sorted(set(modules.values())), reduce_range=False)
        return {name: errors[module] for name, module in modules.items() if module in errors}

    return fallback.rank(names, calibration, reference, without, proxy)


def quantized_layers(converted: Any, quantized: Any) -> tuple[str, ...]:
    """The Convolution/MatMul nodes NNCF quantized, in graph order: those whose inputs now come from
    another kind of node (a FakeQuantize, int8 weights scaled back) than in the fp32 model."""

    def sources(model: Any) -> dict[str, tuple[str, ...]]:
        return {op.get_friendly_name(): tuple(op.input_value(i).get_node().get_type_name()
                                              for i in range(op.get_input_size()))
                for op in model.get_ordered_ops() if op.get_type_name() in LAYER_TYPES}

    before = sources(converted)
    return tuple(name for name, inputs in sources(quantized).items() if name in before and inputs != before[name])


class Compiled:
    """An OpenVINO model compiled for the CPU in fp32, called like the module (torch tensors in, its
    output tensors out, flat): what the ranking measures."""

    def __init__(self, model: Any) -> None:
        import openvino as ov

        self.request = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        import torch

        arrays = flat_numpy(kwargs if kwargs and not args else args[0] if len(args) == 1 else args)
        return [torch.from_numpy(array.copy()) for array in self.request.infer(arrays).to_tuple()]


def _nncf_quantized(model: Any, converted: Any, calibration: Sequence[Any], ignored: Sequence[str] = ()) -> Any:
    """NNCF's post-training quantization, the nodes `ignored` left in fp32."""
    import logging

    import nncf

    nncf.set_log_level(logging.ERROR)
    batches = [_numpy_inputs(batch) for batch in calibration]
    transformer = any("attention" in type(m).__name__.lower() for m in model.modules())
    try:
        return nncf.quantize(converted, nncf.Dataset(batches), subset_size=len(batches),
                             model_type=nncf.ModelType.TRANSFORMER if transformer else None,
                             ignored_scope=nncf.IgnoredScope(names=list(ignored)) if ignored else None,
                             advanced_parameters=_overflow_fix())
    except Exception as exc:
        raise ApplyError(f"precision=int8: NNCF could not quantize the OpenVINO model ({explain(exc)}); use "
                         f"precision=fp32 or bf16 with backend=openvino") from exc


def _overflow_fix() -> Any:
    """NNCF's 7-bit weights on every layer where this CPU's int8 sums saturate (measured), else NNCF's own choice."""
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

    return AdvancedQuantizationParameters(overflow_fix=OverflowFix.ENABLE) if saturation.remedy(OPENVINO) else None


def _numpy_inputs(batch: Any) -> Any:
    """A batch as NNCF feeds the OpenVINO model: one array, or a tuple of them in input order."""
    arrays = flat_numpy(batch)
    return arrays[0] if len(arrays) == 1 else tuple(arrays)


def _probe_model(kernel: Kernel, remedy: bool) -> Any:
    """The probe's operation as an OpenVINO model; int8 as NNCF's graphs hold it: FakeQuantize on the
    activations (256 levels on [0, 1]) and on the weights (symmetric per output channel; with the
    overflow fix, 7-bit weights: a range twice as wide on the same 255 levels, as NNCF writes them)."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    x, w = (t.numpy() for t in inputs(kernel.op))
    data = ops.parameter(list(x.shape), ov.Type.f32)
    source: Any = data
    weights: Any = ops.constant(w)
    if kernel.precision == "int8":
        q = quantized(kernel.op, w_max=63 if remedy else 127)
        high = (q.w_scales.numpy() * 127).reshape(-1, *([1] * (w.ndim - 1))).astype(np.float32)
        source = ops.fake_quantize(data, 0.0, 1.0, 0.0, 1.0, round(1 / q.x_scale) + 1)
        weights = ops.fake_quantize(weights, -high, high, -high, high, 255)
    if kernel.op == "conv":
        pad = [CONV[2] // 2] * 2
        out = ops.convolution(source, weights, [1, 1], pad, pad, [1, 1])
    else:
        out = ops.matmul(source, weights, transpose_a=False, transpose_b=True)
    return ov.Model([out], [data], f"probe-{kernel.op}")


def _ran_as(compiled: Any, op: str) -> str:
    """The precision OpenVINO's CPU plugin runs the convolution or matmul in (its runtime model)."""
    wanted = ("Convolution",) if op == "conv" else ("MatMul", "FullyConnected")
    for node in compiled.get_runtime_model().get_ordered_ops():
        info = node.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) in wanted:
            return info["runtimePrecision"].astype(str).lower() if "runtimePrecision" in info else ""
    return ""


OPENVINO: Converter = OpenVINO()
