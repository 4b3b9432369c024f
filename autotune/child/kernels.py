"""The machine probe's measuring child: which precisions each runtime runs on this CPU, whether
they agree with fp32, and how fast, measured rather than read off a table of CPU flags.

Each kernel is one operation of realistic size, run the way the search's configurations run it:
- conv: a 3x3 convolution, 256 to 256 channels on 14x14 at batch 1 (a ResNet stage-3 conv);
- matmul: 128 tokens through a 768 x 3072 Linear (BERT-base's feed-forward layer).
PyTorch runs fp32 and bf16 through ATen/oneDNN as eager and autocast do, int8 through the oneDNN
kernels inductor lowers PT2E's quantized graph to (`onednn.qconv_pointwise`, `qlinear_pointwise`),
int8_dynamic and int8_weight_only through torchao's `quantize_` of an nn.Linear. OpenVINO and ONNX
Runtime run the same operations built in their own graph formats (int8 as FakeQuantize, or QDQ).

For each kernel the child records whether it runs (else the failure, in one line), its relative
error against fp32 on the same inputs, what the runtime says it ran in (OpenVINO may run bf16 as
f32 on a CPU without bf16), and GOP/s at each thread count asked for. PyTorch's and ONNX Runtime's
int8 are also checked against exact integer arithmetic on inputs that fill the uint8 range: a CPU
without VNNI multiplies u8 x s8 pairs into 16-bit sums that can saturate (`saturates`), and then
the int8 conversions quantize activations to 7 bits (`reduce_range`), which cannot.

It also measures the memory bandwidth (STREAM's copy and triad on arrays far larger than the
caches). Protocol: `python -m autotune.child.kernels --out FILE --threads 1,2`; the result file is
rewritten after every kernel with the one it is about to run as `running`, so that a crash names
its kernel and a rerun with `--skip` goes on past it. torch and the runtimes are imported inside
functions, and only for the kernels asked for.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.child.batches import explain
from autotune.child.cpu import isa_limits
from autotune.child.files import write_atomically
from autotune.child.knobs import PEER_BACKENDS, TORCH_BACKENDS

FORMAT = 1
CONV = (256, 256, 3, 14)  # in channels, out channels, kernel size, height = width
MATMUL = (128, 768, 3072)  # rows (tokens), in features, out features
OPS = ("conv", "matmul")
RUNTIMES = ("torch", "openvino", "onnxruntime")
RUNTIME_OF = {**dict.fromkeys(TORCH_BACKENDS, "torch"), **{backend: backend for backend in PEER_BACKENDS}}
# What each runtime is probed in: the precisions the knob table lets it run, and their operations
# (torchao's int8_dynamic and int8_weight_only quantize nn.Linear layers alone).
PROBED: dict[str, dict[str, tuple[str, ...]]] = {
    "torch": {"fp32": OPS, "bf16": OPS, "int8": OPS, "int8_dynamic": ("matmul",), "int8_weight_only": ("matmul",)},
    "openvino": {"fp32": OPS, "bf16": OPS, "int8": OPS},
    "onnxruntime": {"fp32": OPS, "int8": OPS},
}
SECONDS = 0.15  # timed per kernel and thread count, after two untimed calls
MIN_CALLS = 3
STREAM_FLOATS = 32 * 2**20  # 128 MiB per array: far beyond any L3 cache
EXACT = 1e-4  # relative error against exact integer arithmetic above which a u8 x s8 kernel saturates
FULL, REDUCED = 255, 127  # uint8 activation levels: the quantizers' default range, and reduce_range's


@dataclass(frozen=True)
class Kernel:
    runtime: str
    precision: str
    op: str

    @property
    def name(self) -> str:
        return f"{self.runtime}:{self.precision}:{self.op}"


@dataclass
class Measured:
    """What one kernel gave: `gops` per thread count (as text: a JSON key) when it runs."""

    runtime: str
    precision: str
    op: str
    runs: bool = False
    error: str = ""
    rel_error: float | None = None  # against fp32 on the same inputs
    exact_error: float | None = None  # int8: against exact integer arithmetic at the full uint8 range
    saturates: bool | None = None
    remedy: str = ""  # int8 where it saturates: how the conversion avoids it (`REMEDY`), as measured
    ran_as: str = ""  # what the runtime reports it ran the operation in, where it says
    gops: dict[str, float] = field(default_factory=dict)


def all_kernels(runtimes: Sequence[str] = RUNTIMES) -> list[Kernel]:
    return [Kernel(r, p, op) for r in runtimes for p, ops in PROBED[r].items() for op in ops]


def work(op: str) -> int:
    """Multiply-adds times two (FLOP, or integer OP) of one call of `op`."""
    if op == "conv":
        cin, cout, k, hw = CONV
        return 2 * cin * cout * k * k * hw * hw
    rows, inner, out = MATMUL
    return 2 * rows * inner * out


# -- inputs ----------------------------------------------------------------------------------------


@functools.cache
def inputs(op: str) -> tuple[Any, Any]:
    """Activations in [0, 1) (after a ReLU, as int8 quantizes them: uint8) and weights in [-1, 1),
    fixed by a seed: every runtime sees the same numbers."""
    import torch

    generator = torch.Generator().manual_seed(57)
    cin, cout, k, hw = CONV
    rows, inner, out = MATMUL
    x_shape, w_shape = ((1, cin, hw, hw), (cout, cin, k, k)) if op == "conv" else ((rows, inner), (out, inner))
    return torch.rand(x_shape, generator=generator), torch.rand(w_shape, generator=generator) * 2 - 1


def fp32(op: str) -> Any:
    import torch

    x, w = inputs(op)
    with torch.no_grad():
        return _torch_op(op, x, w)


def _torch_op(op: str, x: Any, w: Any) -> Any:
    import torch

    if op == "conv":
        return torch.nn.functional.conv2d(x, w, padding=CONV[2] // 2)
    return torch.nn.functional.linear(x, w)


@dataclass(frozen=True)
class Quantized:
    """`inputs` quantized as the int8 conversions do: uint8 activations per tensor (zero point 0),
    int8 weights per output channel (symmetric, within +-`w_max`)."""

    qx: Any
    x_scale: float
    qw: Any
    w_scales: Any

    def exact(self, op: str) -> Any:
        """What an exact integer kernel returns, dequantized (float64 sums of the integers)."""
        y = _torch_op(op, self.qx.double(), self.qw.double()) * self.x_scale
        scales = self.w_scales.double()
        return y * (scales[None, :, None, None] if op == "conv" else scales[None, :])


# How each runtime's int8 conversion avoids saturating 16-bit sums, where a probe finds it must:
# PyTorch's x86 quantizer quantizes activations to 7 bits (reduce_range), NNCF weights to 7 bits
# (its overflow fix), ONNX Runtime's static quantization weights to 7 bits (reduce_range).
REMEDY = {"torch": "reduce_range", "openvino": "overflow_fix", "onnxruntime": "reduce_range"}
LEVELS = {False: {"torch": (FULL, 127), "openvino": (FULL, 127), "onnxruntime": (FULL, 127)},
          True: {"torch": (REDUCED, 127), "openvino": (FULL, 63), "onnxruntime": (FULL, 63)}}


def quantized(op: str, x_levels: int = FULL, w_max: int = 127) -> Quantized:
    import torch

    x, w = inputs(op)
    x_scale = 1.0 / x_levels
    qx = torch.clamp(torch.round(x / x_scale), 0, x_levels).to(torch.uint8)
    w_scales = w.abs().reshape(w.shape[0], -1).amax(dim=1) / w_max
    shape = (-1, *([1] * (w.dim() - 1)))
    qw = torch.clamp(torch.round(w / w_scales.reshape(shape)), -w_max, w_max).to(torch.int8)
    return Quantized(qx, x_scale, qw, w_scales)


def int8_of(runtime: str, op: str, remedy: bool) -> Quantized:
    """The quantization `runtime`'s int8 conversion applies, with its remedy or without."""
    return quantized(op, *LEVELS[remedy][runtime])


def rel_error(output: Any, reference: Any) -> float:
    import torch

    out = torch.as_tensor(output).double().reshape(reference.shape)
    ref = reference.double()
    return float((out - ref).norm() / ref.norm())


# -- PyTorch ---------------------------------------------------------------------------------------

# A kernel made ready: the call to time at a thread count, and what the runtime says it ran in.
Ready = tuple[Callable[[int], Callable[[], Any]], str]


def torch_kernel(kernel: Kernel, remedy: bool) -> Ready:
    import torch

    x, w = inputs(kernel.op)
    if kernel.precision in ("fp32", "bf16"):
        dtype = torch.float32 if kernel.precision == "fp32" else torch.bfloat16
        xd, wd = x.to(dtype), w.to(dtype)
        return _torch_threads(lambda: _torch_op(kernel.op, xd, wd)), str(dtype).removeprefix("torch.")
    if kernel.precision == "int8":
        return _torch_threads(onednn_int8(kernel.op, int8_of("torch", kernel.op, remedy))), ""
    return _torch_threads(_torchao_linear(kernel.precision, w)), ""


def _torch_threads(call: Callable[[], Any]) -> Callable[[int], Callable[[], Any]]:
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


# -- OpenVINO --------------------------------------------------------------------------------------

OV_PRECISION = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}  # int8: FakeQuantize decides, as NNCF's graphs


def openvino_kernel(kernel: Kernel, remedy: bool) -> Ready:
    import openvino as ov

    model = _ov_model(kernel, remedy)
    core = ov.Core()

    def compiled(threads: int) -> Any:
        return core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                                 "INFERENCE_PRECISION_HINT": OV_PRECISION[kernel.precision]})

    def at(threads: int) -> Callable[[], Any]:
        request = compiled(threads).create_infer_request()
        x = inputs(kernel.op)[0].numpy()
        return lambda: request.infer([x])[0]

    return at, _ov_ran_as(compiled(1), kernel.op)


def _ov_model(kernel: Kernel, remedy: bool) -> Any:
    """The operation as an OpenVINO model; int8 as NNCF's graphs hold it: FakeQuantize on the
    activations (256 levels on [0, 1]) and on the weights (symmetric per output channel)."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    x, w = (t.numpy() for t in inputs(kernel.op))
    data = ops.parameter(list(x.shape), ov.Type.f32)
    source: Any = data
    weights: Any = ops.constant(w)
    if kernel.precision == "int8":
        q = int8_of("openvino", kernel.op, remedy)
        # 255 levels on +-127 steps: the overflow fix's 7-bit weights are a range twice as wide, as NNCF writes them
        high = (q.w_scales.numpy() * 127).reshape(-1, *([1] * (w.ndim - 1))).astype(np.float32)
        source = ops.fake_quantize(data, 0.0, 1.0, 0.0, 1.0, round(1 / q.x_scale) + 1)
        weights = ops.fake_quantize(weights, -high, high, -high, high, 255)
    if kernel.op == "conv":
        pad = [CONV[2] // 2] * 2
        out = ops.convolution(source, weights, [1, 1], pad, pad, [1, 1])
    else:
        out = ops.matmul(source, weights, transpose_a=False, transpose_b=True)
    return ov.Model([out], [data], f"probe-{kernel.op}")


def _ov_ran_as(compiled: Any, op: str) -> str:
    """The precision OpenVINO's CPU plugin runs the convolution or matmul in (its runtime model)."""
    wanted = ("Convolution",) if op == "conv" else ("MatMul", "FullyConnected")
    for node in compiled.get_runtime_model().get_ordered_ops():
        info = node.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) in wanted:
            return info["runtimePrecision"].astype(str).lower() if "runtimePrecision" in info else ""
    return ""


# -- ONNX Runtime ----------------------------------------------------------------------------------


def onnxruntime_kernel(kernel: Kernel, remedy: bool) -> Ready:
    import onnxruntime as ort

    model = _onnx_model(kernel, remedy).SerializeToString()
    x = inputs(kernel.op)[0].numpy()

    def at(threads: int) -> Callable[[], Any]:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        return lambda: session.run(None, {"x": x})[0]

    return at, ""


def _onnx_model(kernel: Kernel, remedy: bool) -> Any:
    """The operation as ONNX; int8 in QDQ form as ONNX Runtime's static quantization writes it."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    x, w = inputs(kernel.op)
    nodes, inits = [], []
    source = "x"
    if kernel.precision == "int8":
        q = int8_of("onnxruntime", kernel.op, remedy)
        inits += [numpy_helper.from_array(np.array(q.x_scale, np.float32), "xs"),
                  numpy_helper.from_array(np.array(0, np.uint8), "xz"),
                  numpy_helper.from_array(q.qw.numpy(), "qw"),
                  numpy_helper.from_array(q.w_scales.numpy().astype(np.float32), "ws"),
                  numpy_helper.from_array(np.zeros(q.qw.shape[0], np.int8), "wz")]
        nodes += [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["qx"]),
                  helper.make_node("DequantizeLinear", ["qx", "xs", "xz"], ["dx"]),
                  helper.make_node("DequantizeLinear", ["qw", "ws", "wz"], ["w"], axis=0)]
        source = "dx"
    else:
        inits.append(numpy_helper.from_array(w.numpy(), "w"))
    if kernel.op == "conv":
        nodes.append(helper.make_node("Conv", [source, "w"], ["y"], pads=[CONV[2] // 2] * 4))
    else:  # Gemm takes the weight as a Linear holds it (out x in)
        nodes.append(helper.make_node("Gemm", [source, "w"], ["y"], transB=1))
    graph = helper.make_graph(nodes, f"probe-{kernel.op}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# -- measuring -------------------------------------------------------------------------------------

READY: dict[str, Callable[[Kernel, bool], Ready]] = {"torch": torch_kernel, "openvino": openvino_kernel,
                                                     "onnxruntime": onnxruntime_kernel}


@functools.cache
def exact_error(runtime: str, op: str) -> float:
    """How far `runtime`'s int8 `op` at the full uint8 range lands from exact integer arithmetic
    on the same integers (0 up to float rounding, unless 16-bit sums saturate)."""
    import torch

    at, _ = READY[runtime](Kernel(runtime, "int8", op), False)
    with torch.no_grad():
        return rel_error(at(1)(), int8_of(runtime, op, False).exact(op))


@functools.cache
def saturates(runtime: str) -> bool:
    """Whether `runtime`'s int8 kernels lose sums on this CPU when the integers fill their ranges
    (a CPU without VNNI multiplies u8 x s8 pairs into 16-bit sums): then its int8 conversion
    applies its `REMEDY`. Measured on the probe's conv and matmul, in well under a second."""
    return any(exact_error(runtime, op) > EXACT for op in OPS)


def remedy(backend: str) -> str:
    """How `backend`'s int8 conversion must quantize on this CPU (`REMEDY`), "" where nothing saturates."""
    runtime = RUNTIME_OF[backend]
    return REMEDY[runtime] if saturates(runtime) else ""


def measure(kernel: Kernel, threads: Sequence[int]) -> Measured:
    """One kernel: ready it, check its output, time it at each thread count; a failure is its result."""
    import torch

    found = Measured(kernel.runtime, kernel.precision, kernel.op)
    try:
        if kernel.precision == "int8":
            found.exact_error, found.saturates = exact_error(kernel.runtime, kernel.op), saturates(kernel.runtime)
            found.remedy = REMEDY[kernel.runtime] if found.saturates else ""
        at, found.ran_as = READY[kernel.runtime](kernel, bool(found.remedy))
        with torch.no_grad():
            found.rel_error = rel_error(at(max(threads))(), fp32(kernel.op))
            found.gops = {str(t): work(kernel.op) / seconds_per_call(at(t)) / 1e9 for t in threads}
    except Exception as exc:
        found.error = one_line(exc)
        return found
    found.runs = True
    return found


def one_line(exc: BaseException) -> str:
    """A runtime's failure in one line: OpenVINO's source locations ("Exception from FILE:LINE:") dropped."""
    text = " ".join(re.sub(r"Exception from \S+:\d+:\s*", "", str(exc)).split())
    return explain(RuntimeError(text)).replace("RuntimeError", type(exc).__name__, 1)


def seconds_per_call(call: Callable[[], Any]) -> float:
    """The median of calls timed for at least SECONDS (and MIN_CALLS), after two untimed ones."""
    call()
    call()
    samples: list[float] = []
    end = time.perf_counter() + SECONDS
    while time.perf_counter() < end or len(samples) < MIN_CALLS:
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2]


def bandwidth(threads: Sequence[int]) -> dict[str, dict[str, float]]:
    """STREAM's copy (b = a) and triad (a = b + s * c) in GB/s at each thread count."""
    import torch

    a, b, c = (torch.ones(STREAM_FLOATS) for _ in range(3))
    size = STREAM_FLOATS * a.element_size()
    found = {}
    for t in threads:
        torch.set_num_threads(t)
        copy = seconds_per_call(lambda: b.copy_(a))
        triad = seconds_per_call(lambda: torch.add(b, c, alpha=3.0, out=a))
        found[str(t)] = {"copy_gbs": 2 * size / copy / 1e9, "triad_gbs": 3 * size / triad / 1e9}
    return found


def model_flops(forward: Callable[[Any], Any], batch: Any) -> float:
    """The FLOP of one call of an eager model on `batch`, by torch's FLOP counter (matmuls and
    convolutions): the work a search's winner is set against the probe's peaks."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        forward(batch)
    return float(counter.get_total_flops())


def versions() -> dict[str, str | None]:
    import importlib.metadata

    found: dict[str, str | None] = {}
    for name in ("torch", "torchao", "openvino", "onnxruntime"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="autotune.child.kernels")
    p.add_argument("--out", required=True, help="the result file (JSON), rewritten after every kernel")
    p.add_argument("--threads", required=True, help="thread counts N,N,...")
    p.add_argument("--runtimes", default=",".join(RUNTIMES), help="runtimes to probe R,R,...")
    p.add_argument("--skip", default="", help="kernels not to run (runtime:precision:op,...): a rerun after a crash")
    p.add_argument("--no-bandwidth", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    threads = sorted({int(t) for t in args.threads.split(",")})
    skip = set(filter(None, args.skip.split(",")))
    start = time.perf_counter()
    result: dict[str, Any] = {"format": FORMAT, "threads": threads, "versions": versions(),
                              "isa_limits": isa_limits(), "kernels": [], "bandwidth": {}, "running": ""}
    for kernel in all_kernels(args.runtimes.split(",")):
        if kernel.name in skip:
            continue
        write_atomically(args.out, json.dumps(result | {"running": kernel.name}))
        result["kernels"].append(asdict(measure(kernel, threads)))
    if not args.no_bandwidth:
        write_atomically(args.out, json.dumps(result | {"running": "bandwidth"}))
        result["bandwidth"] = bandwidth(threads)
    result["probe_s"] = time.perf_counter() - start
    write_atomically(args.out, json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
