"""precision=int8: post-training static quantization through PT2E with torchao's x86 inductor
quantizer (uint8 activations calibrated per tensor, int8 weights per channel; activations on 7 bits,
`reduce_range`, where this CPU's int8 kernels saturate 16-bit sums: `saturation.saturates`, measured),
and the guard that fits it: top-1 agreement and cosine similarity with eager fp32, over several batches.

Why not the maximum relative error: int8 moves every output a little (about 2% of the largest
logit on resnext101), which says nothing about whether the answers changed; whether the top class
and the direction of the output vector stay is what a classifier or an embedding is used for.

torch and torchao are imported inside functions; importing torchao's quantizer also registers its
int8 fusion passes with inductor (for the whole process).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.model import backends, buckets, fallback, saturation
from autotune.model.artifacts import hash_tensor
from autotune.model.batches import call, explain, rows, split
from autotune.model.convert import allowed_error
from autotune.model.errors import ApplyError, WrongAnswers, failed_op
from autotune.model.knobdefs import Precision
from autotune.model.linear_int8 import TORCHAO_INSTALL

CALIBRATION_BATCHES = 4  # default `--calibration-batches`: batches of the example inputs observed
GUARD_ITEMS = 32  # inputs (rounded up to whole batches) the int8 guard compares with eager fp32


def quantized_export(model: Any, example: Any, calibration: Sequence[Any], setup: dict[str, Any],
                     dynamic: bool = False, keep_fp32: int = 0, folder: Path | None = None,
                     described: dict[str, Any] | None = None) -> Any:
    """The model captured, observed on the calibration batches, quantized, and exported again for
    AOTInductor; `dynamic` (shapes=dynamic): with a dynamic sequence length up to the example's
    (`buckets.dynamic_shapes`); `keep_fp32` (int8_fallback): the most sensitive layers left in fp32,
    ranked once and kept in `folder` beside the artifact `described` (`fallback`). Any failure is an
    ApplyError naming the operator where it could be told."""
    import copy
    import time

    import torch

    quantizer_cls, prepare_pt2e, convert_pt2e, default_config = _torchao()
    args, kwargs = split(example)
    shapes = buckets.dynamic_shapes(example) if dynamic else None
    start = time.perf_counter()
    with torch.enable_grad():  # under no_grad, export groups a reused module's calls (resnet's relu) into one
        try:
            captured = torch.export.export(model, args, kwargs, strict=True, dynamic_shapes=shapes).module()
        except Exception as exc:
            raise ApplyError(f"precision=int8: torch.export could not capture the model at {failed_op(exc)} "
                             f"({explain(exc)}); use precision=fp32 or bf16 for it") from exc
    reduce_range = bool(saturation.remedy(backends.get("inductor")))
    config = default_config(reduce_range=reduce_range)

    def without(kept: tuple[str, ...], graph: Any = None) -> Any:
        """The captured graph (a copy of it, unless `graph`) quantized with the `kept` layers in fp32."""
        quantizer = quantizer_cls()
        quantizer.set_global(config)
        for name in kept:
            quantizer.set_module_name_qconfig(name, None)
        with torch.enable_grad():
            prepared = _step("annotate", lambda: prepare_pt2e(copy.deepcopy(captured) if graph is None else graph,
                                                              quantizer))
        with torch.no_grad():
            _step("calibrate", lambda: [call(prepared, batch) for batch in calibration])
            return _step("convert", lambda: convert_pt2e(prepared))

    reference = fallback.outputs(model, calibration) if keep_fp32 else []
    kept: tuple[str, ...] = ()
    if keep_fp32:
        ranking = fallback.ranked(None if folder is None else fallback.ranking_path(folder, described or {}),
                                  described or {},
                                  lambda: _ranking(model, captured, calibration, reference, without, reduce_range),
                                  setup)
        kept = ranking.order[:keep_fp32]
        setup.update(int8_kept_fp32=list(kept), int8_divergence_full=ranking.divergence_full)
    converted = without(kept, captured)
    if keep_fp32:
        setup["int8_divergence"] = fallback.divergence(reference, fallback.outputs(converted, calibration))
    setup["quantize_s"] = time.perf_counter() - start
    with torch.no_grad():
        return _step("export", lambda: torch.export.export(converted, args, kwargs, strict=True,
                                                           dynamic_shapes=shapes))


def _ranking(model: Any, captured: Any, calibration: Sequence[Any], reference: fallback.Outputs,
             without: Any, reduce_range: bool) -> fallback.Ranking:
    """PT2E's layers (the captured graph's Conv/Linear modules) ranked, the proxy rounding as the x86 quantizer does."""
    names = fallback.layers(captured)
    return fallback.rank(names, calibration, reference, without,
                         lambda: fallback.proxy_errors(model, calibration, names, reduce_range))


def load_graph(path: Path) -> Any:
    """A quantized graph that `quantized_export` made and `torch.export.save` wrote. torchao's
    quantizer is imported first: that registers the int8 fusion passes inductor compiles it with."""
    import torch

    _torchao()
    try:
        return torch.export.load(str(path))
    except Exception as exc:
        raise ApplyError(f"cannot load the quantized graph {path} ({explain(exc)}); delete it (and its .json) "
                         f"to quantize again") from exc


def _torchao() -> tuple[Any, Any, Any, Any]:
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )
    except ImportError as exc:
        raise ApplyError(f"precision=int8 needs torchao ({exc}); install it with `{TORCHAO_INSTALL}`") from None
    return X86InductorQuantizer, prepare_pt2e, convert_pt2e, get_default_x86_inductor_quantization_config


def _step(name: str, action: Any) -> Any:
    try:
        with warnings.catch_warnings():  # what the quantizer leaves in fp32 (a max pool after fp32 input) is no fault
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torchao\.")
            return action()
    except ApplyError:
        raise
    except Exception as exc:
        raise ApplyError(f"precision=int8: the x86 quantizer cannot handle this model: {name} failed at "
                         f"{failed_op(exc)} ({explain(exc)}); use precision=fp32 or bf16 for it") from exc


def digest(batches: Sequence[Any]) -> str:
    """What the calibration saw, for the artifact's key: the bytes of every calibration tensor."""
    import torch
    from torch.utils import _pytree

    hashed = hashlib.sha256(str(len(batches)).encode())
    for batch in batches:
        for tensor in (t for t in _pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)):
            hash_tensor(hashed, "input", tensor)
    return hashed.hexdigest()[:20]


def agreement_guard(reference: Sequence[Any], output: Sequence[Any], precision: Precision, tolerance: float | None,
                    setup: dict[str, Any]) -> None:
    """The guard of every int8 precision (`ModelKnobs.quantized`): each item's top-1 answer and the
    cosine similarity of its output with eager fp32's; fails when more than `tolerance` of the items
    change their top-1 answer, or any item's cosine similarity falls below 1 - tolerance.
    `reference`/`output`: per batch, its output tensors (batches of different sequence lengths
    compare item by item: shapes=dynamic checks every bucket's)."""
    import torch

    agree, cosine = [], []
    for ref_batch, out_batch in zip(reference, output, strict=True):
        ref, out = rows(ref_batch), rows(out_batch)
        if ref.shape != out.shape:
            raise WrongAnswers(f"output shape changed: {tuple(out.shape)} instead of eager fp32's {tuple(ref.shape)}")
        agree.append(ref.argmax(dim=1) == out.argmax(dim=1))
        cosine.append(torch.nn.functional.cosine_similarity(ref, out, dim=1))
    figures = {"top1_agreement": float(torch.cat(agree).float().mean()), "min_cosine": float(torch.cat(cosine).min()),
               "guard_items": sum(len(a) for a in agree)}
    judge(figures, precision, tolerance, setup)


def judge(figures: dict[str, Any], precision: Precision, tolerance: float | None, setup: dict[str, Any]) -> None:
    """`agreement_guard`'s verdict on its figures (measured now, or by an earlier process on the
    same artifact and inputs), recorded in `setup` with the tolerance applied."""
    allowed = allowed_error(precision, tolerance)
    agreement, cosine, items = figures["top1_agreement"], figures["min_cosine"], figures["guard_items"]
    setup.update(top1_agreement=agreement, min_cosine=cosine, guard_items=items, tolerance=allowed)
    if not (agreement >= 1 - allowed and cosine >= 1 - allowed):
        remedy = ", or calibrate on more batches (--calibration-batches)" if precision == "int8" else ""
        raise WrongAnswers(f"wrong answers: {precision} agrees with eager fp32 on the top-1 answer of {agreement:.1%} "
                           f"of {items} inputs (min cosine similarity {cosine:.4f}); the tolerance {allowed:g} "
                           f"asks for {1 - allowed:.1%} and {1 - allowed:.4f}; raise --tolerance to accept it{remedy}")


def guard_key(batches: Sequence[Any], reference: Sequence[Any]) -> str:
    """What a guard's figures hold for: the bytes of the checked batches and of eager's outputs."""
    import torch

    hashed = hashlib.sha256(digest(batches).encode())
    for tensor in (t for outputs in reference for t in outputs if isinstance(t, torch.Tensor)):
        hash_tensor(hashed, "reference", tensor)
    return hashed.hexdigest()[:20]
