"""How each model-level knob turns a module into what runs: mkldnn, channels_last, bf16 autocast,
int8_dynamic and int8_weight_only (through `linear_int8`), and the backend, which builds an artifact
once and loads it (`autotune.model.backends`: int8 gets its calibration through `backends.base.Quantized`);
the guard on the answers; the artifacts' keys, their calibration and where they are kept.

torch is imported inside functions. `autotune.apply` and the benchmark child both call `prepare`,
so what is measured is what a user's program runs.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.model import buckets, cpu, fallback, linear_int8, saturation
from autotune.model.artifacts import (
    ARTIFACT_FORMAT,
    CALIBRATION_KIND,
    artifact_path,
    fingerprint,
    load_batches,
    mark_used,
    save_batches,
    stale_artifacts,
)
from autotune.model.backends.base import Quantized
from autotune.model.batches import autocast, call, dense, inputs, layout
from autotune.model.errors import ApplyError, WrongAnswers
from autotune.model.knobs import LINEAR_INT8, QUANTIZED, ModelKnobs, Precision

# What `--tolerance` allows against eager fp32, per precision: fp32 and bf16, the relative error on
# the same input; every int8 (`QUANTIZED`), the share of inputs whose top-1 answer may change, and
# how far below 1 any input's cosine similarity may fall (quantize.agreement_guard).
AGREEMENT_TOLERANCE = 1e-2
TOLERANCE: dict[Precision, float] = {"fp32": 1e-3, "bf16": 5e-2, **dict.fromkeys(QUANTIZED, AGREEMENT_TOLERANCE)}


def allowed_error(precision: Precision, tolerance: float | None) -> float:
    """What a guard allows: the `--tolerance` given, else the precision's own (`TOLERANCE`)."""
    return TOLERANCE[precision] if tolerance is None else tolerance


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
    runs = knobs.runs_in.precisions
    if knobs.precision not in runs:  # a precision the backend takes for generating text alone
        raise ApplyError(f"backend={knobs.backend} runs precision={knobs.precision} for --task generate alone; "
                         f"with this model use {'/'.join(runs)}")
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
    elif not knobs.runs_in.rebuildable(artifacts, meta, quantized):
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


def guard(reference: list[Any], output: list[Any], precision: Precision, tolerance: float | None,
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
    allowed = allowed_error(precision, tolerance)
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
    fallback = knobs.runs_in.build(model, example, knobs, setup, path, described, quantized)
    if fallback is None:
        traced = knobs.runs_in.artifact_kind() == "torchscript"
        setup["trace_s" if traced else "compile_s"] = time.perf_counter() - start
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
        fallback.recall(path, setup)


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
    return artifact_path(folder, {k: v for k, v in meta.items() if k not in ("threads", "model", "calibration",
                                                                             "int8_fallback")}, ".pt",
                         kind=CALIBRATION_KIND)


def _keep_calibration(folder: Path, described: dict[str, Any], quantized: Quantized) -> None:
    """The caller's calibration batches beside the artifact they quantized, unless some are kept
    already (the first, the study's, stay: what `calibrated` gives a caller without any)."""
    path = calibration_path(folder, described)
    if quantized.given and not path.exists():
        meta = {k: v for k, v in described.items() if k not in ("threads", "int8_fallback")} | \
            {"batches": len(quantized.batches)}
        with contextlib.suppress(ApplyError):  # a folder it cannot write (deployed read-only) loads as before
            save_batches(path, quantized.batches, meta)


def _saved_path(folder: Path, meta: dict[str, Any], knobs: ModelKnobs) -> Path:
    return artifact_path(folder, meta, knobs.runs_in.suffix, kind=knobs.runs_in.artifact_kind())


def _loaded(path: Path, example: Any, knobs: ModelKnobs, setup: dict[str, Any],
            on_phase: Callable[[str], None]) -> Any:
    on_phase("loading the compiled model")
    start = time.perf_counter()
    loaded = knobs.runs_in.load(path, knobs, example)
    setup["artifact_load_s"] = time.perf_counter() - start
    return ShapeChecked(loaded, example, any_length=knobs.shapes == "dynamic")


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


def saved_knobs(knobs: ModelKnobs) -> dict[str, Any]:
    """The knobs an artifact is keyed by: its backend's (`Backend.saved_knobs`)."""
    return knobs.runs_in.saved_knobs(knobs)


def artifact_meta(knobs: ModelKnobs, example: Any, weights: str, calibration: str = "") -> dict[str, Any]:
    import torch

    meta: dict[str, Any] = {"format": ARTIFACT_FORMAT, "knobs": saved_knobs(knobs), "inputs": layout(example),
            "torch": torch.__version__, "isa": list(cpu.isa()), "weights": weights,
            **knobs.runs_in.described(knobs)}  # a runtime's version, a thread count baked in
    if calibration:
        meta["calibration"] = calibration  # int8: what the quantizer observed
    remedy = saturation.remedy(knobs.runs_in) if knobs.precision == "int8" else ""
    if remedy:
        meta["int8_remedy"] = remedy  # quantized otherwise: another artifact
    return meta


def _label(model: Any, setup: dict[str, Any]) -> str:
    """What the artifact's description calls the model: the benchmark's model name, else its class."""
    return str(setup.get("model") or f"{type(model).__module__}.{type(model).__qualname__}")


