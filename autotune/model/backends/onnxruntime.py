"""backend=onnxruntime: `torch.onnx.export(..., dynamo=True)`, one .onnx file, run by a CPU session
with the knobs' graph optimization level, execution mode and inter-op threads; the intra-op threads
are the process's thread count. precision=int8: ONNX Runtime's static quantization (QDQ, uint8
activations, int8 weights per channel) on the calibration batches, with reduce_range (7-bit weights)
where this CPU's int8 sums saturate (measured: `saturation.remedy`).

The probe runs its operations as ONNX graphs (int8 in the QDQ form the static quantization writes).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.model import saturation
from autotune.model.backends.base import Packages, Ready
from autotune.model.backends.converted import CONVERT_FAILED, Converter, Run, failed_at, flat_numpy
from autotune.model.batches import explain, split
from autotune.model.errors import ApplyError
from autotune.model.kernels import CONV, Kernel, inputs, quantized
from autotune.model.knobdefs import Knob, KnobValue, ModelSettings, Precision

ORT_OPTIMIZATION = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                    "all": "ORT_ENABLE_ALL"}


class OnnxRuntime(Converter):
    name = "onnxruntime"
    runtime = "onnxruntime"
    label = "ONNX Runtime"
    summary = "torch.onnx.export(dynamo=True), saved, run by an ONNX Runtime CPU session"
    precisions: tuple[Precision, ...] = ("fp32", "int8")
    # onnx and onnxscript are what torch.onnx.export(dynamo=True) needs.
    packages = Packages("ONNX Runtime", "onnxruntime", ("onnxruntime", "onnx", "onnxscript"),
                        ("onnxruntime", "onnx", "onnxscript"))
    suffix = ".onnx"
    preloaded_malloc = True
    int8_remedy = "reduce_range"

    def __init__(self) -> None:
        self.knobs = (
            self.own(Knob("ort_optimization", "choice", "ONNX Runtime's graph optimization level",
                          choices=("disabled", "basic", "extended", "all"), default="all")),
            self.own(Knob("ort_execution", "choice", "ONNX Runtime's execution mode: sequential, or parallel "
                          "(independent nodes at once, on the inter-op threads)", choices=("sequential", "parallel"),
                          default="sequential", places=True)),
            self.own(Knob("ort_inter_threads", "int", "ONNX Runtime's inter-op threads; 0 = its own choice",
                          low=0, high=4096, default=0, only_when=(("ort_execution", ("parallel",)),), places=True,
                          core_bound=True)),
        )

    def recipes(self, cores: int) -> tuple[tuple[str, dict[str, KnobValue]], ...]:
        """At its defaults: the full graph optimization."""
        return (("ONNX Runtime defaults", {"backend": self.name}),)

    def save(self, model: Any, example: Any, knobs: ModelSettings, tmp: Path, path: Path,
             calibration: Sequence[Any], setup: dict[str, Any], described: dict[str, Any]) -> None:
        import torch

        args, kwargs = split(example)
        with tempfile.TemporaryDirectory(prefix="autotune-onnx-") as folder:
            exported = Path(folder, "model.onnx") if knobs.precision == "int8" else tmp
            try:
                with torch.no_grad():
                    program = torch.onnx.export(model, args, kwargs=kwargs, dynamo=True, verbose=False)
                assert program is not None  # dynamo=True always returns the program
                program.save(str(exported), external_data=False)
            except Exception as exc:
                raise ApplyError(f"backend=onnxruntime: torch.onnx.export {CONVERT_FAILED} at "
                                 f"{failed_at(exc)} ({explain(exc)}); use another backend for it") from exc
            if knobs.precision == "int8":
                _quantized(exported, tmp, calibration, Path(folder))

    def runner(self, path: Path, knobs: ModelSettings, threads: int) -> Run:
        session = _session(path, knobs, threads)
        names = [i.name for i in session.get_inputs()]

        def run(arrays: list[Any]) -> list[Any]:
            if len(arrays) != len(names):  # the exporter drops an input the model never reads
                raise ApplyError(f"the ONNX model takes {len(names)} inputs ({', '.join(names)}), not {len(arrays)}; "
                                 f"call it with the inputs its example had")
            return list(session.run(None, dict(zip(names, arrays, strict=True))))

        return run

    def probe_kernel(self, kernel: Kernel, remedy: bool) -> Ready:
        import onnxruntime as ort

        model = _probe_model(kernel, remedy).SerializeToString()
        x = inputs(kernel.op)[0].numpy()

        def at(threads: int) -> Callable[[], Any]:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            return lambda: session.run(None, {"x": x})[0]

        return at, ""


def _quantized(exported: Path, tmp: Path, calibration: Sequence[Any], folder: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process


    names = [i.name for i in _session(exported, None, 1).get_inputs()]
    feeds = iter([dict(zip(names, flat_numpy(batch), strict=False)) for batch in calibration])

    class Batches(CalibrationDataReader):  # type: ignore[misc]
        def get_next(self) -> dict[str, Any] | None:
            return next(feeds, None)

    prepared = folder / "prepared.onnx"
    try:
        quant_pre_process(str(exported), str(prepared))
        quantize_static(str(prepared), str(tmp), Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        reduce_range=bool(saturation.remedy(ONNXRUNTIME)))
    except Exception as exc:
        raise ApplyError(f"precision=int8: ONNX Runtime's static quantization failed ({explain(exc)}); use "
                         f"precision=fp32 with backend=onnxruntime") from exc


def _session(path: Path, knobs: ModelSettings | None, threads: int) -> Any:
    """A session of the model at `path` as `knobs` say (None: ONNX Runtime's own settings)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if knobs is not None:
        _configured(options, knobs)
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ApplyError(f"ONNX Runtime could not load {path.name} ({explain(exc)}); delete it to convert the "
                         f"model anew") from exc


def _configured(options: Any, knobs: ModelSettings) -> None:
    import onnxruntime as ort

    options.inter_op_num_threads = knobs.ort_inter_threads
    options.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if knobs.ort_execution == "parallel"
                              else ort.ExecutionMode.ORT_SEQUENTIAL)
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, ORT_OPTIMIZATION[knobs.ort_optimization])


def _probe_model(kernel: Kernel, remedy: bool) -> Any:
    """The probe's operation as ONNX; int8 in QDQ form as the static quantization writes it (with
    reduce_range, 7-bit weights)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    x, w = inputs(kernel.op)
    nodes, inits = [], []
    source = "x"
    if kernel.precision == "int8":
        q = quantized(kernel.op, w_max=63 if remedy else 127)
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


ONNXRUNTIME: Converter = OnnxRuntime()
