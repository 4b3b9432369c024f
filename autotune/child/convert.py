"""How each model-level knob turns a module into what runs: mkldnn, channels_last, the TorchScript
weight cache, inductor, bf16 autocast, int8 (through `quantize`), int8_dynamic and int8_weight_only
(through `linear_int8`); the guard on the answers; the saved artifacts.

torch is imported inside functions. `autotune.apply` and the benchmark child both call `prepare`,
so what is measured is what a user's program runs.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.child import buckets, cpu, hf, kernels, linear_int8, peers, runtimes
from autotune.child.artifacts import (
    ARTIFACT_FORMAT,
    CALIBRATION_KIND,
    GRAPH_KIND,
    artifact_path,
    fingerprint,
    load,
    load_batches,
    mark_used,
    save_artifact,
    save_batches,
    stale_artifacts,
)
from autotune.child.batches import autocast, call, dense, explain, inputs, layout, split
from autotune.child.errors import ApplyError, WrongAnswers
from autotune.child.knobs import LINEAR_INT8, PEER_KNOBS, QUANTIZED, ModelKnobs, Precision

# What `--tolerance` allows against eager fp32, per precision: fp32 and bf16, the relative error on
# the same input; every int8 (`QUANTIZED`), the share of inputs whose top-1 answer may change, and
# how far below 1 any input's cosine similarity may fall (quantize.agreement_guard).
AGREEMENT_TOLERANCE = 1e-2
NO_SPACE = "No space left on device"  # ENOSPC as the C library words it, in a compiler's or linker's output
TOLERANCE: dict[Precision, float] = {"fp32": 1e-3, "bf16": 5e-2, **dict.fromkeys(QUANTIZED, AGREEMENT_TOLERANCE)}


@dataclass(frozen=True)
class Quantized:
    """How precision=int8 gets its graph (`quantize.quantized_export` on the calibration batches,
    bound by `deploy`), and what names those batches in the artifact's key. Batches the caller gave
    (`given`) are saved beside the artifact; a caller who gave none gets the ones saved for this very
    model, knobs and inputs (`rebind` binds the same quantizer to them), so that it loads the artifact
    they made: the one the study measured."""

    export: Callable[[Any, Any], Any]  # (model, example) -> ExportedProgram
    calibration: str
    load: Callable[[Path], Any]  # a quantized graph `torch.export.save`d -> ExportedProgram
    batches: Sequence[Any] = ()  # the calibration batches, which OpenVINO's and ONNX Runtime's quantizers observe
    given: bool = True  # the caller's own batches; False: the example alone, for want of any
    rebind: Callable[[Sequence[Any]], Quantized] | None = None


def _quiet(phase: str) -> None:
    pass


def prepare(model: Any, example: Any, knobs: ModelKnobs, setup: dict[str, Any],
            artifacts: Path | None = None, on_phase: Callable[[str], None] | None = None,
            quantized: Quantized | None = None) -> Callable[[Any], Any]:
    """The model converted as the knobs say, as forward(batch) converting inputs and outputs;
    `on_phase` (the benchmark child's progress) hears whether an artifact is compiled or loaded.
    precision=int8 takes its graph from `quantized`."""
    import torch

    knobs.check()
    weights = fingerprint(model) if knobs.compiled else ""
    mkldnn, channels_last = knobs.mkldnn, knobs.memory_format == "channels_last"
    if mkldnn:
        from torch.utils import mkldnn as mkldnn_utils

        start = time.perf_counter()
        model = mkldnn_utils.to_mkldnn(model)
        setup["mkldnn_convert_s"] = time.perf_counter() - start
        probe_mkldnn(model, example)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if knobs.precision in LINEAR_INT8:
        model = linear_int8.quantize_linears(model, knobs, setup)
    if knobs.compiled:
        with warnings.catch_warnings():
            # TorchScript is chosen on purpose where it measured faster; torch's deprecation notice is noise.
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated", category=FutureWarning)
            model = compiled(model, inputs(example, knobs), knobs, setup, artifacts, weights, on_phase or _quiet,
                             quantized)
    return _forward(model, knobs)


def load_saved(example: Any, knobs: ModelKnobs, setup: dict[str, Any], artifacts: Path, weights: str,
               quantized: Quantized | None = None,
               on_phase: Callable[[str], None] = _quiet) -> Callable[[Any], Any] | None:
    """What `prepare` returns for a compiled configuration whose artifact is saved, without the
    model: `weights` is the model's fingerprint, `quantized` int8's calibration. For int8, an
    artifact of another thread count left its quantized graph, which is compiled for this one
    without the model. None when neither is saved in `artifacts`."""
    knobs.check()
    example = inputs(example, knobs)
    quantized, meta = calibrated(artifacts, artifact_meta(knobs, example, weights), quantized, setup)
    path = _saved_path(artifacts, meta, knobs)
    if path.exists():
        _hit(path, meta, quantized, setup)
    elif quantized is None or not graph_path(artifacts, meta).exists():
        return None
    else:
        _compile_into(path, None, example, knobs, setup, artifacts, meta, on_phase, quantized)
    return _forward(_loaded(path, example, knobs, setup, on_phase), knobs)


def _forward(model: Any, knobs: ModelKnobs) -> Callable[[Any], Any]:
    """forward(batch): the inputs in the knobs' layout, bf16 under autocast, mkldnn outputs dense."""

    def forward(batch: Any) -> Any:
        with autocast("fp32" if knobs.peer else knobs.precision):  # a peer's precision is its runtime's
            output = call(model, inputs(batch, knobs))
        return dense(output) if knobs.mkldnn else output

    return forward


def guard(reference: list[Any], output: list[Any], precision: Precision, tolerance: float,
          setup: dict[str, Any]) -> None:
    """The correctness guard for fp32 and bf16: max abs and relative error against eager fp32 on the
    same input (recorded for every int8 too, which `quantize.agreement_guard` judges)."""
    import torch

    ref = torch.cat([r.float().flatten() for r in reference])
    out = torch.cat([o.float().flatten() for o in output])
    if ref.shape != out.shape:
        raise WrongAnswers(f"output shape changed: {tuple(out.shape)} instead of eager fp32's {tuple(ref.shape)}")
    abs_err = float((out - ref).abs().max())
    rel_err = abs_err / max(float(ref.abs().max()), 1e-12)
    allowed = tolerance if tolerance >= 0 else TOLERANCE[precision]
    setup.update(max_abs_err=abs_err, max_rel_err=rel_err, tolerance=allowed)
    if precision not in QUANTIZED and not rel_err <= allowed:  # int8s: judged by quantize.agreement_guard
        raise WrongAnswers(f"wrong answers: output differs from eager fp32 by max relative error {rel_err:.3g} "
                           f"(max abs {abs_err:.3g}) > tolerance {allowed:g}; raise --tolerance to accept it")


def probe_mkldnn(model: Any, example: Any) -> None:
    """Run once with a module stack, so an op without an mkldnn kernel is named with its module."""
    import torch

    stack: list[str] = []
    names = {id(m): f"{n or 'model'} ({type(m).__name__})" for n, m in model.named_modules()}

    def enter(module: Any, args: Any) -> None:
        stack.append(names[id(module)])

    def leave(module: Any, args: Any, output: Any) -> None:
        stack.pop()

    handles = []
    for module in model.modules():
        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        with torch.no_grad():
            dense(call(model, inputs(example, ModelKnobs(mkldnn=True))))
    except Exception as exc:
        text = str(exc)
        op = re.search(r"aten::\w+", text)
        where = f" in module {stack[-1]}" if stack else ""
        detail = (text.strip().splitlines() or [""])[0][:160]
        raise ApplyError(
            f"mkldnn: {op.group(0) if op else 'an operator'}{where} has no mkldnn (oneDNN layout) "
            f"kernel ({detail}); use mkldnn=off for this model"
        ) from exc
    finally:
        for handle in handles:
            handle.remove()


def compiled(model: Any, example: Any, knobs: ModelKnobs, setup: dict[str, Any], artifacts: Path | None,
             weights: str, on_phase: Callable[[str], None] = _quiet, quantized: Quantized | None = None) -> Any:
    """The compiled backends, built once into an artifact that every later process loads: a frozen
    TorchScript file (backend=torchscript, weight_cache) or an AOTInductor package with freezing
    (backend=inductor). Without an artifacts folder the artifact goes to a temporary one, so that
    the model always runs loaded, as the benchmark child ran it. An int8 artifact is also keyed by
    its calibration batches, so a process with the same ones loads it instead of quantizing again."""
    if artifacts is not None:
        return _load_or_build(model, example, knobs, setup, artifacts, weights, on_phase, quantized)
    with tempfile.TemporaryDirectory(prefix="autotune-artifact-") as folder:
        return _load_or_build(model, example, knobs, setup, Path(folder), weights, on_phase, quantized)


def _load_or_build(model: Any, example: Any, knobs: ModelKnobs, setup: dict[str, Any], folder: Path,
                   weights: str, on_phase: Callable[[str], None], quantized: Quantized | None) -> Any:
    if knobs.precision == "int8" and quantized is None:
        raise ApplyError("precision=int8 needs its calibration: apply it through autotune.apply")
    quantized, meta = calibrated(folder, artifact_meta(knobs, example, weights), quantized, setup)
    path = _saved_path(folder, meta, knobs)
    if path.exists():
        _hit(path, meta, quantized, setup)
    else:
        fallback = _compile_into(path, model, example, knobs, setup, folder, meta, on_phase, quantized)
        if fallback is not None:
            return fallback
    return _loaded(path, example, knobs, setup, on_phase)


def _compile_into(path: Path, model: Any, example: Any, knobs: ModelKnobs, setup: dict[str, Any], folder: Path,
                  meta: dict[str, Any], on_phase: Callable[[str], None], quantized: Quantized | None) -> Any:
    """Build the artifact at `path` (`_build`), timed; `model` may be None for int8 when its
    quantized graph is saved. Returns `_build`'s fallback, if any."""
    setup["artifact_file"], setup["artifact_hit"] = str(path), False
    setup["artifact_stale"] = stale_artifacts(folder, meta)
    on_phase("compiling")
    start = time.perf_counter()
    described = meta | {"model": _label(model, setup)}
    fallback = _build(model, example, knobs, setup, path, described, quantized)
    if fallback is None:
        setup["trace_s" if knobs.saved_as_torchscript else "compile_s"] = time.perf_counter() - start
    if fallback is None and quantized is not None:
        _keep_calibration(folder, described, quantized)
    return fallback


def _hit(path: Path, meta: dict[str, Any], quantized: Quantized | None, setup: dict[str, Any]) -> None:
    """A saved artifact found; int8's calibration kept beside it when it is not yet (an artifact made
    before autotune kept them)."""
    setup["artifact_file"], setup["artifact_hit"] = str(path), True
    mark_used(path)
    if quantized is not None:
        _keep_calibration(path.parent, meta, quantized)


def calibrated(folder: Path, meta: dict[str, Any], quantized: Quantized | None,
               setup: dict[str, Any]) -> tuple[Quantized | None, dict[str, Any]]:
    """int8's calibration and the artifact's key with it. Without batches of the caller's, the ones
    that quantized this very model, knobs and inputs into `folder` before (the study's, which
    `autotune export --artifacts` leaves there), else the example alone; `setup["calibration"]` says
    which."""
    if quantized is None:
        return None, meta
    saved = calibration_path(folder, meta)
    rebind = None if quantized.given else quantized.rebind
    batches = load_batches(saved) if rebind is not None and saved.exists() else None
    if rebind is not None and batches is not None:
        quantized = rebind(batches)
        mark_used(saved)
        setup["calibration"] = f"saved: {saved.name}"
    else:
        setup["calibration"] = "given" if quantized.given else "the example"
    return quantized, meta | {"calibration": quantized.calibration}


def calibration_path(folder: Path, meta: dict[str, Any]) -> Path:
    """Where the batches that calibrated int8 for this model, knobs and inputs are kept: the
    artifact's key without the thread count and the calibration itself."""
    return artifact_path(folder, {k: v for k, v in meta.items() if k not in ("threads", "model", "calibration")}, ".pt",
                         kind=CALIBRATION_KIND)


def _keep_calibration(folder: Path, described: dict[str, Any], quantized: Quantized) -> None:
    """The caller's calibration batches beside the artifact they quantized, unless some are kept
    already (the first, the study's, stay: what `calibrated` gives a caller without any)."""
    path = calibration_path(folder, described)
    if quantized.given and not path.exists():
        meta = {k: v for k, v in described.items() if k != "threads"} | {"batches": len(quantized.batches)}
        with contextlib.suppress(ApplyError):  # a folder it cannot write (deployed read-only) loads as before
            save_batches(path, quantized.batches, meta)


def _saved_path(folder: Path, meta: dict[str, Any], knobs: ModelKnobs) -> Path:
    suffix = peers.SUFFIX[knobs.backend] if knobs.peer else ".pt2" if knobs.backend == "inductor" else ".pt"
    return artifact_path(folder, meta, suffix)


def _loaded(path: Path, example: Any, knobs: ModelKnobs, setup: dict[str, Any],
            on_phase: Callable[[str], None]) -> Any:
    on_phase("loading the compiled model")
    start = time.perf_counter()
    loaded = peers.load(path, knobs, example) if knobs.peer else load(path, knobs.backend)
    setup["artifact_load_s"] = time.perf_counter() - start
    return ShapeChecked(loaded, example, any_length=knobs.shapes == "dynamic")


def _build(model: Any, example: Any, knobs: ModelKnobs, setup: dict[str, Any], path: Path,
           described: dict[str, Any], quantized: Quantized | None) -> Any:
    """Save the artifact; returns a torch.compile'd model instead when torch.export cannot capture
    the model (graph breaks, data-dependent control flow), with the reason recorded. int8 has no
    such fallback: quantization needs the exported graph, so its failure is the configuration's."""
    import torch

    if knobs.peer:  # `peers.save` adds the output's structure to the description before it is written
        batches = quantized.batches if quantized else ()
        save_artifact(path, lambda tmp: peers.save(model, example, knobs, tmp, path, batches, described), described)
        return None
    if quantized is not None:
        exported = _int8_graph(model, example, quantized, path.parent, described, setup)
        save_artifact(path, lambda tmp: _aot_compile(exported, tmp), described)
        return None

    if knobs.saved_as_torchscript:
        with torch.no_grad(), autocast(knobs.precision):
            scripted = _torchscript(model, example, knobs)
        save_artifact(path, lambda tmp: torch.jit.save(scripted, str(tmp)), described)
        return None
    try:
        exported = _export(model, example, knobs)
    except Exception as exc:
        if knobs.shapes == "dynamic":  # the knob's point is one artifact: torch.compile would recompile per length
            raise ApplyError(f"shapes=dynamic: torch.export could not export the model with a dynamic sequence "
                             f"length ({explain(exc)}); use shapes=buckets") from exc
        setup["aot_fallback"] = f"torch.export failed ({explain(exc)}); torch.compile"
        return _jit_compiled(model)
    save_artifact(path, lambda tmp: _aot_compile(exported, tmp), described)
    return None


def _int8_graph(model: Any, example: Any, quantized: Quantized, folder: Path, described: dict[str, Any],
                setup: dict[str, Any]) -> Any:
    """int8's quantized graph, which does not depend on the thread count: quantized from `model`
    and saved beside the artifacts the first time, loaded by every later compile (another thread
    count's) instead of quantizing again."""
    import torch

    saved = graph_path(folder, described)
    if saved.exists():
        start = time.perf_counter()
        graph = quantized.load(saved)
        setup["quantized_graph_load_s"] = time.perf_counter() - start
        mark_used(saved)
        return graph
    if model is None:
        raise ApplyError(f"the quantized graph {saved.name} went away while compiling; run again to quantize")
    graph = quantized.export(model, example)
    meta = {k: v for k, v in described.items() if k != "threads"}
    save_artifact(saved, lambda tmp: torch.export.save(graph, str(tmp)), meta)
    return graph


def graph_path(folder: Path, meta: dict[str, Any]) -> Path:
    """Where int8's quantized graph for this model, knobs, inputs, calibration, torch and CPU lives:
    the artifact's key without the thread count."""
    return artifact_path(folder, {k: v for k, v in meta.items() if k not in ("threads", "model")}, ".pt2",
                         kind=GRAPH_KIND)


def _aot_compile(exported: Any, tmp: Path) -> None:
    """Compile under no_grad whatever the caller's grad mode: with grad enabled, AOTInductor's
    freezing leaves the weights as they are, and int8's weight packing does not happen (resnext101
    int8 at 2 threads: 287 ms instead of 47)."""
    import torch._inductor

    try:
        with warnings.catch_warnings(), torch.no_grad():  # inductor's int8 lowering copies a tensor as it warns against
            warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)
            torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp),
                                                     inductor_configs={"freezing": True})
    except Exception as exc:
        if NO_SPACE in str(exc):  # the compiler's own output, inside inductor's error: not a missing compiler
            raise ApplyError(f"AOTInductor could not compile the model: no space left on the disk of its build "
                             f"folder ({tmp.parent}) or of TMPDIR; free space there and run again") from exc
        raise ApplyError(f"AOTInductor could not compile the model ({explain(exc)}); "
                         f"check that a C++ compiler is installed, or use backend=torchscript") from exc


class ShapeChecked:
    """A compiled model computes garbage, silently, for inputs of another shape, dtype or layout
    than it was compiled for (AOTInductor checks nothing unless asked; a trace bakes sizes in):
    every call is checked, and refused with one line."""

    def __init__(self, compiled: Any, example: Any, any_length: bool = False) -> None:
        """`any_length`: exported with a dynamic sequence length, up to the example's (shapes=dynamic)."""
        self.compiled, self.any_length = compiled, any_length
        self.expected = layout(example, any_length)
        self.lengths = buckets.Buckets((buckets.sequence_length(example),), (1.0,)) if any_length else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        batch = kwargs if kwargs and not args else args
        got = layout(batch, self.any_length)
        if got != self.expected:
            raise ApplyError(f"the compiled model takes inputs {'; '.join(self.expected)}, not {'; '.join(got)}; "
                             f"apply it with an example of each shape you serve")
        if self.lengths is not None:
            self.lengths.fitting(buckets.sequence_length(batch))
        return self.compiled(*args, **kwargs)


def _export(model: Any, example: Any, knobs: ModelKnobs) -> Any:
    """The model (bf16: under autocast) as torch.export captures it on `example`; shapes=dynamic
    makes its sequence length a dimension, up to the example's (`buckets.dynamic_shapes`)."""
    import torch

    precision = knobs.precision

    class Autocast(torch.nn.Module):
        """bf16 autocast inside forward, so that the exported graph holds the casts."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            with autocast(precision):
                return self.inner(*args, **kwargs)

    args, kwargs = split(example)
    dynamic = buckets.dynamic_shapes(example, variadic=True) if knobs.shapes == "dynamic" else None
    with torch.no_grad():
        return torch.export.export(Autocast(model), args, kwargs, dynamic_shapes=dynamic)


def _jit_compiled(model: Any) -> Any:
    import torch

    return torch.compile(model, backend="inductor", options={"freezing": True})


def _torchscript(model: Any, example: Any, knobs: ModelKnobs) -> Any:
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


def saved_knobs(knobs: ModelKnobs) -> dict[str, Any]:
    """The knobs an artifact is keyed by. A peer's runtime settings apply when it loads the file, so
    one file serves them all (OpenVINO's bf16 too: its inference precision); a PyTorch artifact
    bakes in every knob but the peers' own (`shapes` only where it is dynamic)."""
    if knobs.peer:
        return {"backend": knobs.backend, "precision": "fp32" if knobs.precision == "bf16" else knobs.precision}
    saved = {name: value for name, value in asdict(knobs).items() if name not in PEER_KNOBS}
    if knobs.shapes != "dynamic":  # what every artifact was before `shapes` existed: their keys stay
        saved.pop("shapes")
    return saved


def artifact_meta(knobs: ModelKnobs, example: Any, weights: str, calibration: str = "") -> dict[str, Any]:
    import torch

    meta: dict[str, Any] = {"format": ARTIFACT_FORMAT, "knobs": saved_knobs(knobs), "inputs": layout(example),
            "torch": torch.__version__, "isa": list(cpu.isa()), "weights": weights}
    if knobs.peer:
        meta["runtime"] = runtimes.version(knobs.backend)
    if calibration:
        meta["calibration"] = calibration  # int8: what the quantizer observed
    remedy = kernels.remedy(knobs.backend) if knobs.precision == "int8" else ""
    if remedy:
        meta["int8_remedy"] = remedy  # quantized otherwise: another artifact
    # Inductor bakes the thread count into its kernels (`omp parallel num_threads(N)`, and no
    # parallel loops at all for 1 thread), so each thread count is its own artifact.
    return meta | ({"threads": torch.get_num_threads()} if knobs.backend == "inductor" else {})


def _label(model: Any, setup: dict[str, Any]) -> str:
    """What the artifact's description calls the model: the benchmark's model name, else its class."""
    return str(setup.get("model") or f"{type(model).__module__}.{type(model).__qualname__}")


