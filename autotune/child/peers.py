"""backend=openvino and backend=onnxruntime: the model converted through each runtime's official
path, saved once as an artifact, and run by that runtime behind a callable that takes and returns
torch tensors, so that a user's program does not change when the winner is another runtime.

- OpenVINO: `openvino.convert_model(model, example_input=...)` with the example's shapes fixed,
  saved as IR (an .xml beside its .bin, weights kept in fp32), compiled for the CPU plugin with the
  knobs' hint, streams, pinning, the process's thread count and the inference precision (bf16 where
  precision=bf16). precision=int8: NNCF post-training quantization on the calibration batches.
- ONNX Runtime: `torch.onnx.export(..., dynamo=True)`, one .onnx file, run by a CPU session with
  the knobs' graph optimization level, execution mode and inter-op threads; the intra-op threads
  are the process's thread count. precision=int8: ONNX Runtime's static quantization (QDQ, uint8
  activations, int8 weights per channel) on the calibration batches.

Where this CPU's int8 kernels saturate their 16-bit sums (`kernels.saturates`, measured on the
runtime itself: CPUs without VNNI), NNCF quantizes with its overflow fix and ONNX Runtime with
reduce_range, both 7-bit weights.

What is saved depends only on the model, the inputs, the precision, the runtime and the CPU; the
runtime's settings apply when it is loaded, so every setting loads the same file.

The runtimes and torch are imported inside functions.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from autotune.child import kernels
from autotune.child.batches import explain, split
from autotune.child.errors import ApplyError
from autotune.child.knobs import ModelKnobs

CONVERT_FAILED = "could not convert the model"  # how a converter's refusal is told, child to harness
SUFFIX = {"openvino": ".xml", "onnxruntime": ".onnx"}
OV_PRECISION = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}  # int8: the quantized layers run int8 anyway
ORT_OPTIMIZATION = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                    "all": "ORT_ENABLE_ALL"}


def weights_file(path: Path) -> Path:
    """OpenVINO IR's weights, beside its .xml."""
    return path.with_suffix(".bin")


def save(model: Any, example: Any, knobs: ModelKnobs, tmp: Path, path: Path, calibration: Sequence[Any],
         described: dict[str, Any]) -> None:
    """Convert `model` (quantized on `calibration` for int8) and write it to `tmp`, which becomes
    `path`; OpenVINO's weights go straight to their final place first, so that no process finds
    an .xml without its .bin. The output's structure goes into the description."""
    described["outputs"] = output_spec(model, example)
    with _quiet_stdout():
        if knobs.backend == "openvino":
            _save_openvino(model, example, knobs, tmp, path, calibration)
        else:
            _save_onnx(model, example, knobs, tmp, calibration)


def output_spec(model: Any, example: Any) -> str:
    """How the model's output tensors nest (a tensor, a tuple, a dict ...), as torch's pytree
    serialises it: the runtimes return a flat list, which is put back into this shape."""
    import torch
    from torch.utils import _pytree

    args, kwargs = split(example)
    with torch.no_grad():
        output = model(*args, **kwargs)
    spec = _pytree.tree_structure(output)
    try:
        return _pytree.treespec_dumps(spec)
    except Exception:
        raise ApplyError(f"the model returns {type(output).__name__}, whose structure cannot be saved with a "
                         f"converted model; let it return a tensor, a tuple, a list or a dict of tensors") from None


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """The converters print progress on stdout; it belongs with the rest of their talk, on stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _save_openvino(model: Any, example: Any, knobs: ModelKnobs, tmp: Path, path: Path,
                   calibration: Sequence[Any]) -> None:
    import openvino as ov

    args, kwargs = split(example)
    if args and kwargs:
        raise ApplyError("backend=openvino converts a model called with positional or keyword inputs, not both")
    try:
        converted = _ov_converted(model, args, kwargs)
        shapes = [ov.PartialShape(list(t.shape)) for t in _flat(example)]  # fixed, as the other backends compile
        converted.reshape(dict(zip(converted.inputs, shapes, strict=True)))
    except Exception as exc:
        raise ApplyError(f"backend=openvino: openvino.convert_model {CONVERT_FAILED} at "
                         f"{_failed_at(exc)} ({explain(exc)}); use another backend for it") from exc
    if knobs.precision == "int8":
        converted = _nncf_quantized(model, converted, calibration)
    bin_tmp = weights_file(tmp)
    try:
        ov.save_model(converted, str(tmp), compress_to_fp16=False)
        os.replace(bin_tmp, weights_file(path))
    finally:
        bin_tmp.unlink(missing_ok=True)


def _ov_converted(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
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


def _nncf_quantized(model: Any, converted: Any, calibration: Sequence[Any]) -> Any:
    import logging

    import nncf

    nncf.set_log_level(logging.ERROR)
    batches = [_numpy_inputs(batch) for batch in calibration]
    transformer = any("attention" in type(m).__name__.lower() for m in model.modules())
    try:
        return nncf.quantize(converted, nncf.Dataset(batches), subset_size=len(batches),
                             model_type=nncf.ModelType.TRANSFORMER if transformer else None,
                             advanced_parameters=_overflow_fix())
    except Exception as exc:
        raise ApplyError(f"precision=int8: NNCF could not quantize the OpenVINO model ({explain(exc)}); use "
                         f"precision=fp32 or bf16 with backend=openvino") from exc


def _save_onnx(model: Any, example: Any, knobs: ModelKnobs, tmp: Path, calibration: Sequence[Any]) -> None:
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
                             f"{_failed_at(exc)} ({explain(exc)}); use another backend for it") from exc
        if knobs.precision == "int8":
            _ort_quantized(exported, tmp, calibration, Path(folder))


def _ort_quantized(exported: Path, tmp: Path, calibration: Sequence[Any], folder: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    names = [i.name for i in _session(exported, ModelKnobs(backend="onnxruntime"), 1).get_inputs()]
    feeds = iter([dict(zip(names, _flat_numpy(batch), strict=False)) for batch in calibration])

    class Batches(CalibrationDataReader):  # type: ignore[misc]
        def get_next(self) -> dict[str, Any] | None:
            return next(feeds, None)

    prepared = folder / "prepared.onnx"
    try:
        quant_pre_process(str(exported), str(prepared))
        quantize_static(str(prepared), str(tmp), Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        reduce_range=bool(kernels.remedy("onnxruntime")))
    except Exception as exc:
        raise ApplyError(f"precision=int8: ONNX Runtime's static quantization failed ({explain(exc)}); use "
                         f"precision=fp32 with backend=onnxruntime") from exc


def _overflow_fix() -> Any:
    """NNCF's 7-bit weights on every layer where this CPU's int8 sums saturate (`kernels.saturates`,
    measured), else NNCF's own choice."""
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

    return AdvancedQuantizationParameters(overflow_fix=OverflowFix.ENABLE) if kernels.remedy("openvino") else None


def _failed_at(exc: BaseException) -> str:
    from autotune.child.quantize import failed_op  # quantize imports convert, which imports this module

    return failed_op(exc)


def _flat(batch: Any) -> list[Any]:
    """The batch's tensors in the order the converted model takes them (positional, then by keyword)."""
    import torch
    from torch.utils import _pytree

    return [t for t in _pytree.tree_leaves(split(batch)) if isinstance(t, torch.Tensor)]


def _flat_numpy(batch: Any) -> list[Any]:
    return [t.detach().contiguous().numpy() for t in _flat(batch)]


def _numpy_inputs(batch: Any) -> Any:
    """A batch as NNCF feeds the OpenVINO model: one array, or a tuple of them in input order."""
    arrays = _flat_numpy(batch)
    return arrays[0] if len(arrays) == 1 else tuple(arrays)


def load(path: Path, knobs: ModelKnobs, example: Any) -> Any:
    """The saved model, compiled or put in a session by its runtime with the knobs' settings and this
    process's thread count, called like the module it came from (keyword inputs in any order: the
    runtimes take them in the example's)."""
    import torch
    from torch.utils import _pytree

    try:
        spec = _pytree.treespec_loads(json.loads(Path(f"{path}.json").read_text())["outputs"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ApplyError(f"the description of {path} is missing or damaged; delete {path.name} and run again "
                         f"to convert the model anew") from None
    threads = torch.get_num_threads()
    run = _openvino(path, knobs, threads) if knobs.backend == "openvino" else _onnxruntime(path, knobs, threads)
    return Converted(run, spec, tuple(example) if isinstance(example, dict) else ())


class Converted:
    """A converted model called like the original: torch tensors in, torch tensors out, nested as
    the original returned them."""

    def __init__(self, run: Any, spec: Any, names: tuple[str, ...] = ()) -> None:
        self.run, self.spec, self.names = run, spec, names

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.utils import _pytree

        if kwargs and self.names and set(kwargs) == set(self.names):
            kwargs = {name: kwargs[name] for name in self.names}
        arrays = _flat_numpy(kwargs if kwargs and not args else args[0] if len(args) == 1 else args)
        outputs = [torch.from_numpy(array) for array in self.run(arrays)]
        return _pytree.tree_unflatten(outputs, self.spec)


def _openvino(path: Path, knobs: ModelKnobs, threads: int) -> Any:
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


def _onnxruntime(path: Path, knobs: ModelKnobs, threads: int) -> Any:
    session = _session(path, knobs, threads)
    names = [i.name for i in session.get_inputs()]

    def run(arrays: list[Any]) -> list[Any]:
        if len(arrays) != len(names):  # the exporter drops an input the model never reads
            raise ApplyError(f"the ONNX model takes {len(names)} inputs ({', '.join(names)}), not {len(arrays)}; "
                             f"call it with the inputs its example had")
        return list(session.run(None, dict(zip(names, arrays, strict=True))))

    return run


def _session(path: Path, knobs: ModelKnobs, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = knobs.ort_inter_threads
    options.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if knobs.ort_execution == "parallel"
                              else ort.ExecutionMode.ORT_SEQUENTIAL)
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, ORT_OPTIMIZATION[knobs.ort_optimization])
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ApplyError(f"ONNX Runtime could not load {path.name} ({explain(exc)}); delete it to convert the "
                         f"model anew") from exc
