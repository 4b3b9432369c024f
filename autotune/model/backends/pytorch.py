"""PyTorch's own backends that need no compiler: eager (the module as it is, with the seed's mkldnn
layout and TorchScript weight cache) and torchscript (traced, frozen, optimized for inference). Both
save a TorchScript file where they save anything. This module also runs the kernel probe's
operations for the PyTorch runtime, the way its backends run them: ATen/oneDNN for fp32 and bf16,
the oneDNN int8 kernels inductor lowers PT2E's quantized graph to, torchao's linear int8.

torch is imported inside functions.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.model import hf
from autotune.model.artifacts import save_artifact
from autotune.model.backends.base import OPS, Backend, Generation, Ready
from autotune.model.backends.base import Quantized as Calibration
from autotune.model.batches import autocast
from autotune.model.kernels import CONV, REDUCED, Kernel, Quantized, inputs, quantized, torch_op
from autotune.model.knobdefs import GENERATION_PRECISIONS, LINEAR_INT8, Knob, KnobValue, ModelSettings, Precision


class TorchBackend(Backend):
    """A PyTorch backend whose artifact, where it saves one, is a TorchScript file."""

    suffix = ".pt"
    int8_remedy = "reduce_range"  # the x86 quantizer's: activations on 7 bits

    def artifact_kind(self) -> str:
        return "torchscript"

    def saved_knobs(self, knobs: ModelSettings) -> dict[str, Any]:
        """Every knob but the peers' own (`shapes` only where it is dynamic, `int8_fallback` where it
        keeps a layer): a PyTorch artifact bakes them in."""
        saved = knobs.without_peers()
        if knobs.shapes != "dynamic":  # what every artifact was before `shapes` existed: their keys stay
            saved.pop("shapes")
        if not knobs.int8_fallback:  # likewise before `int8_fallback`; each other count is its own artifact
            saved.pop("int8_fallback")
        return saved

    def build(self, model: Any, example: Any, knobs: ModelSettings, setup: dict[str, Any], path: Path,
              described: dict[str, Any], quantized: Calibration | None) -> Any:
        import torch

        with torch.no_grad(), autocast(knobs.precision):
            scripted = torchscript(model, example, knobs)
        save_artifact(path, lambda tmp: torch.jit.save(scripted, str(tmp)), described)
        return None

    def load(self, path: Path, knobs: ModelSettings, example: Any) -> Any:
        import torch

        return torch.jit.load(str(path))

    def probe_ops(self, precision: Precision) -> tuple[str, ...]:
        return ("matmul",) if precision in LINEAR_INT8 else OPS

    def probe_kernel(self, kernel: Kernel, remedy: bool) -> Ready:
        import torch

        x, w = inputs(kernel.op)
        if kernel.precision in ("fp32", "bf16"):
            dtype = torch.float32 if kernel.precision == "fp32" else torch.bfloat16
            xd, wd = x.to(dtype), w.to(dtype)
            return _at_threads(lambda: torch_op(kernel.op, xd, wd)), str(dtype).removeprefix("torch.")
        if kernel.precision == "int8":  # the remedy: the x86 quantizer's reduce_range, 7-bit activations
            return _at_threads(onednn_int8(kernel.op, quantized(kernel.op, REDUCED) if remedy else
                                           quantized(kernel.op))), ""
        return _at_threads(_torchao_linear(kernel.precision, w)), ""


class Eager(TorchBackend):
    name = "eager"
    summary = "the module as it is (with mkldnn and weight_cache: the seed's layout and TorchScript weight cache)"
    precisions: tuple[Precision, ...] = ("fp32", "bf16", "int8_dynamic", "int8_weight_only")
    generates = GENERATION_PRECISIONS
    generation = Generation("autotune.model.generate.pytorch", reads_folder=False)

    def __init__(self) -> None:
        self.knobs = (
            self.own(Knob("mkldnn", "bool", "convert model and input to the mkldnn (oneDNN) layout (eager only)",
                          default=False)),
            self.own(Knob("weight_cache", "bool", "the seed's recipe 2.c for eager models: trace and freeze (with "
                          "mkldnn: script, or trace a transformers model), save and load, cached on disk",
                          default=False)),
        )

    def compiles(self, knobs: ModelSettings) -> bool:
        return knobs.weight_cache

    def recipes(self, cores: int) -> tuple[tuple[str, dict[str, KnobValue]], ...]:
        """The seed write-up (PyTorch 1.x best known methods): mkldnn layout, weight cache, threads =
        physical cores, Intel OpenMP with compact affinity, jemalloc, bound to the cores; and
        `python -m torch.backends.xeon.run_cpu`: Intel OpenMP (compact, KMP_BLOCKTIME=1), jemalloc,
        threads = physical cores, bound with numactl."""
        launcher: dict[str, KnobValue] = {"omp_runtime": "intel", "kmp_affinity": "compact", "kmp_blocktime": 1,
                                          "allocator": "jemalloc", "omp_threads": cores, "instances": 1}
        seed: dict[str, KnobValue] = {"mkldnn": True, "weight_cache": True, "omp_threads": cores,
                                      "omp_runtime": "intel", "kmp_affinity": "compact", "kmp_blocktime": 1,
                                      "allocator": "jemalloc", "instances": 1}
        return ("seed", seed), ("pytorch-launcher", launcher)

    def generation_recipes(self, cores: int) -> tuple[tuple[str, dict[str, KnobValue]], ...]:
        """transformers' static cache in bf16 (its documented way to cut a decode step's cost), and
        PyTorch's launcher's process settings around the defaults."""
        launcher: dict[str, KnobValue] = {"omp_runtime": "intel", "kmp_affinity": "compact", "kmp_blocktime": 1,
                                          "allocator": "jemalloc", "omp_threads": cores, "instances": 1}
        return (("hf-static-bf16", {"kv_cache": "static", "precision": "bf16", "omp_threads": cores}),
                ("pytorch-launcher", launcher))


class TorchScript(TorchBackend):
    name = "torchscript"
    summary = "trace + freeze (saved, cached on disk) + optimize_for_inference"
    precisions: tuple[Precision, ...] = ("fp32", "bf16")

    def load(self, path: Path, knobs: ModelSettings, example: Any) -> Any:
        import torch

        return torch.jit.optimize_for_inference(torch.jit.load(str(path)))


def torchscript(model: Any, example: Any, knobs: ModelSettings) -> Any:
    """backend=torchscript and weight_cache: traced and frozen. With mkldnn, not frozen (freezing
    inlines the oneDNN weights, which torch.jit.save cannot write) and scripted, as the seed's recipe
    does; a transformers model is traced instead: TorchScript cannot script it (it cannot read the
    source of the model's configuration class)."""
    import torch

    if not knobs.mkldnn:
        return torch.jit.freeze(_trace(model, example))
    return _trace(model, example) if hf.is_wrapped(model) else torch.jit.script(model)


def _trace(model: Any, example: Any) -> Any:
    import torch

    if isinstance(example, dict):
        return torch.jit.trace(model, example_kwarg_inputs=example, check_trace=False)
    args = tuple(example) if isinstance(example, (list, tuple)) else (example,)
    return torch.jit.trace(model, args, check_trace=False)


# -- the kernel probe's operations in PyTorch -----------------------------------------------------


def _at_threads(call: Callable[[], Any]) -> Callable[[int], Callable[[], Any]]:
    def at(threads: int) -> Callable[[], Any]:
        import torch

        torch.set_num_threads(threads)
        return call

    return at


def onednn_int8(op: str, q: Quantized) -> Callable[[], Any]:
    """The oneDNN int8 kernel inductor lowers a quantized conv or Linear to, weights prepacked,
    returning fp32 (dequantized)."""
    import torch

    zeros = torch.zeros(q.qw.shape[0], dtype=torch.int64)
    if op == "conv":
        pad, one = CONV[2] // 2, [1, 1]
        packed = torch.ops.onednn.qconv_prepack(q.qw, q.w_scales, q.x_scale, 0, one, [pad, pad], one, 1,
                                                list(q.qx.shape))
        return lambda: torch.ops.onednn.qconv_pointwise(q.qx, q.x_scale, 0, packed, q.w_scales, zeros, None, one,
                                                        [pad, pad], one, 1, 1.0, 0, torch.float32, "none", [], "")
    packed = torch.ops.onednn.qlinear_prepack(q.qw, list(q.qx.shape))
    return lambda: torch.ops.onednn.qlinear_pointwise(q.qx, q.x_scale, 0, packed, q.w_scales, zeros, None, 1.0, 0,
                                                      torch.float32, "none", [], "")


def _torchao_linear(precision: str, w: Any) -> Callable[[], Any]:
    import torch
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        linear.weight.copy_(w)
    config = (Int8DynamicActivationInt8WeightConfig if precision == "int8_dynamic" else Int8WeightOnlyConfig)
    quantize_(linear, config(set_inductor_config=False))
    x = inputs("matmul")[0]
    return lambda: linear(x)


EAGER: Backend = Eager()
TORCHSCRIPT: Backend = TorchScript()
