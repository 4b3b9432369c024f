"""int8_fallback: which quantized layers stay in fp32 (PT2E's Conv/Linear modules; OpenVINO's
Convolution/MatMul nodes, which NNCF's IgnoredScope leaves out: `backends.openvino`), chosen as NNCF's
accuracy control and Intel Neural Compressor's fallback choose them: measured, not assumed.

Each candidate layer is ranked by how close the model's output comes to eager fp32's when that
layer alone is left in fp32 (the x86 quantizer's `set_module_name_qconfig(name, None)`): the layer
whose reverting brings the output closest is the most sensitive. The distance (`divergence`) is the
mean KL divergence of the softmax of each item's output (its output tensors flattened side by side)
from eager fp32's, on the calibration batches: no labels, and never the items a quality judgement
evaluates. The quantized graphs run as converted (q/dq ops in eager), not compiled.

Ranking costs one quantization of the whole model and one per candidate. A model with more than
`REVERTED` layers has its candidates chosen by a cheap proxy first (`proxy_errors`: each layer's
own output error when its input and weights are rounded as the quantizer rounds them, one eager
pass), and only the proxy's top `REVERTED` are reverted and measured. The ranking is kept beside
the artifacts (`int8ranking-*.json`), keyed by the model, its inputs and calibration, torch and the
CPU, so that every count of kept layers, thread count and process after the first reads it.

torch is imported inside functions.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.model import schema
from autotune.model.artifacts import ARTIFACT_FORMAT, RANKING_KIND, DescriptionError, artifact_path, description
from autotune.model.batches import call, leaves, rows
from autotune.model.files import read_text, write_atomically

REVERTED = 16  # at most this many layers are reverted and measured; the proxy picks them in a larger model
LAYER_OPS = ("aten.conv1d.default", "aten.conv2d.default", "aten.linear.default")  # what the x86 quantizer quantizes
# What a ranking file holds (besides the artifact key it is for: model, knobs, inputs, torch, CPU).
RANKING = schema.record({"format": schema.text, "order": schema.list_of(schema.text),
                         "divergence_full": schema.real, "reverted": schema.map_of(schema.real),
                         "ranking_s": schema.real},
                        {"proxy": schema.map_of(schema.real), "layers": schema.integer, "model": schema.text,
                         "knobs": schema.map_of(schema.scalar), "inputs": schema.list_of(schema.text),
                         "torch": schema.text, "isa": schema.list_of(schema.text),
                         "runtime": schema.optional(schema.text)})
# What a quantized graph and its artifacts record of their fallback, in their description and the setup.
KEPT = "int8_kept_fp32"
RECORDED = schema.record({KEPT: schema.list_of(schema.text)},
                         {"int8_divergence": schema.real, "int8_divergence_full": schema.real,
                          "int8_ranking": schema.map_of(schema.anything)})

Outputs = list[list[Any]]  # per batch, its output tensors


@dataclass(frozen=True)
class Ranking:
    """The layers, most sensitive first, and what ranked them: the divergence from fp32 with every
    layer int8 and with each reverted one alone in fp32, and the proxy where one chose the candidates."""

    order: tuple[str, ...]
    divergence_full: float
    reverted: dict[str, float]
    ranking_s: float
    proxy: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"order": list(self.order), "divergence_full": self.divergence_full, "reverted": self.reverted,
                "ranking_s": round(self.ranking_s, 3), "proxy": self.proxy, "layers": len(self.order)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ranking:
        return cls(tuple(data["order"]), data["divergence_full"], data["reverted"], data["ranking_s"],
                   data.get("proxy", {}))

    def summary(self, reused: bool) -> dict[str, Any]:
        """How it was ranked, for the setup: layers, how many reverted, by what, how long it took."""
        return {"layers": len(self.order), "reverted": len(self.reverted), "took_s": round(self.ranking_s, 3),
                "candidates_by": "proxy" if self.proxy else "every layer", "reused": reused}


def layers(captured: Any) -> tuple[str, ...]:
    """The modules whose convolution or linear op the quantizer quantizes, in graph order: the
    innermost module of each such node (its name as the quantizer's module filter reads it)."""
    found: dict[str, None] = {}
    for node in captured.graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        if node.op == "call_function" and str(node.target) in LAYER_OPS and stack:
            path = list(stack.values())[-1][0]
            found[path.removeprefix("L['self'].")] = None
    return tuple(found)


def outputs(model: Any, batches: Sequence[Any]) -> Outputs:
    import torch

    with torch.no_grad():
        return [leaves(call(model, batch)) for batch in batches]


def divergence(reference: Outputs, output: Outputs) -> float:
    """The mean over items of KL(softmax(fp32's row) || softmax(this row)), `rows` of each batch."""
    import torch

    total, items = 0.0, 0
    for ref_batch, out_batch in zip(reference, output, strict=True):
        ref = torch.log_softmax(rows(ref_batch).double(), dim=1)
        out = torch.log_softmax(rows(out_batch).double(), dim=1)
        kl = (ref.exp() * (ref - out)).sum(dim=1).clamp_min(0.0)
        total, items = total + float(kl.sum()), items + int(kl.numel())
    return total / max(items, 1)


def rank(names: Sequence[str], calibration: Sequence[Any], reference: Outputs,
         without: Callable[[tuple[str, ...]], Any], proxy: Callable[[], dict[str, float]]) -> Ranking:
    """Every layer of `names` ranked (the module's doc): `reference` is eager fp32's outputs on the
    calibration batches, `without(names)` the model quantized with `names` in fp32 (called like the
    module), `proxy()` each layer's own error, asked for only where there are more than `REVERTED`."""
    start = time.perf_counter()
    errors = proxy() if len(names) > REVERTED else {}
    by_proxy = sorted(names, key=lambda name: -errors.get(name, math.inf))  # a layer it cannot judge goes first
    full = divergence(reference, outputs(without(()), calibration))
    reverted = {name: divergence(reference, outputs(without((name,)), calibration)) for name in by_proxy[:REVERTED]}
    order = sorted(reverted, key=reverted.__getitem__) + [name for name in by_proxy if name not in reverted]
    return Ranking(tuple(order), full, reverted, time.perf_counter() - start, errors)


def proxy_errors(model: Any, calibration: Sequence[Any], names: Sequence[str], reduce_range: bool) -> dict[str, float]:
    """Each nn.Linear/Conv1d/Conv2d layer's own relative output error (its norm over fp32's) when its
    input is rounded per tensor to uint8 over the calibration's range (7 bits with `reduce_range`) and
    its weights per output channel to int8, as the x86 quantizer does; one pass records the input
    ranges, one the errors. A layer it cannot judge (a functional call) is left out."""
    import torch

    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)
    judged = {}
    for name in names:
        with contextlib.suppress(AttributeError):
            module = model.get_submodule(name)
            if isinstance(module, kinds):
                judged[name] = module
    ranges = {name: [0.0, 0.0] for name in judged}  # the range holds 0, as an affine uint8's does
    sums = {name: [0.0, 0.0] for name in judged}  # error and reference squared norms

    def seen(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            low, high = ranges[name]
            ranges[name] = [min(low, float(args[0].min())), max(high, float(args[0].max()))]
        return hook

    def rounded(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            moved = _rounded_layer(module, args[0], ranges[name], 127 if reduce_range else 255) - output
            sums[name][0] += float(moved.double().square().sum())
            sums[name][1] += float(output.double().square().sum())
        return hook

    for make, pre in ((seen, True), (rounded, False)):
        handles = [module.register_forward_pre_hook(make(name)) if pre else module.register_forward_hook(make(name))
                   for name, module in judged.items()]
        try:
            outputs(model, calibration)
        finally:
            for handle in handles:
                handle.remove()
    return {name: math.sqrt(error / max(norm, 1e-30)) for name, (error, norm) in sums.items()}


def _rounded_layer(module: Any, x: Any, span: list[float], levels: int) -> Any:
    """The layer's output on its input and weights rounded as int8 rounds them."""
    import torch

    low, high = span
    scale = max(high - low, 1e-12) / levels
    point = round(-low / scale)
    xq = torch.fake_quantize_per_tensor_affine(x.float().contiguous(), scale, point, 0, levels)
    weight = module.weight.detach().float()
    scales = weight.abs().reshape(weight.shape[0], -1).amax(dim=1).clamp_min(1e-12) / 127
    wq = torch.fake_quantize_per_channel_affine(weight, scales, torch.zeros_like(scales, dtype=torch.int32), 0,
                                                -128, 127)
    if isinstance(module, torch.nn.Linear):
        return torch.nn.functional.linear(xq, wq, module.bias)
    return module._conv_forward(xq, wq, module.bias)


def ranking_path(folder: Path, meta: dict[str, Any]) -> Path:
    """Where the ranking for this model, inputs, calibration, torch and CPU is kept: the quantized
    graph's key without the thread count or the number of layers kept."""
    return artifact_path(folder, key_meta(meta), ".json", kind=RANKING_KIND)


def key_meta(meta: dict[str, Any]) -> dict[str, Any]:
    knobs = {k: v for k, v in meta.get("knobs", {}).items() if k != "int8_fallback"}
    return {k: v for k, v in meta.items() if k not in ("threads", "model", "guarded", "int8_fallback")} | \
        {"knobs": knobs}


def read_ranking(path: Path) -> Ranking | None:
    """The ranking kept at `path`; None when none is, or it cannot be used (damaged, another format)."""
    data = ranking_file(path)
    return Ranking.from_json(data) if data and data["format"] == ARTIFACT_FORMAT else None


def ranking_file(path: Path) -> dict[str, Any] | None:
    """What a ranking file holds (its key's model, knobs, inputs, torch and CPU too: `autotune cache`
    lists it by them), as `RANKING` says; None when it cannot be read so."""
    try:
        return schema.loads(read_text(path), RANKING)
    except (OSError, UnicodeDecodeError, schema.SchemaError):
        return None


def keep_ranking(path: Path, ranking: Ranking, meta: dict[str, Any]) -> None:
    """Atomically; a folder it cannot write costs the next process only the time of ranking again."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = key_meta(meta) | {"format": ARTIFACT_FORMAT, "model": meta.get("model", "")} | ranking.to_json()
        write_atomically(path, json.dumps(kept, indent=1))


def ranked(path: Path | None, meta: dict[str, Any], make: Callable[[], Ranking],
           setup: dict[str, Any]) -> Ranking:
    """The ranking kept at `path`, else made now (`make`) and kept there; the setup says which, and
    how long ranking took (`int8_ranking_s` only in the process that ranked)."""
    found = read_ranking(path) if path is not None else None
    if found is not None and path is not None:
        with contextlib.suppress(OSError):  # its time of use, for `autotune cache --older-than`
            os.utime(path)
    if found is None:
        found = make()
        setup["int8_ranking_s"] = round(found.ranking_s, 3)
        if path is not None:
            keep_ranking(path, found, meta)
    setup["int8_ranking"] = found.summary(reused="int8_ranking_s" not in setup)
    return found


def recorded(setup: dict[str, Any]) -> dict[str, Any]:
    """What a quantized graph's and its artifact's description keep of the fallback (`recall` reads it)."""
    return {key: setup[key] for key in (KEPT, "int8_divergence", "int8_divergence_full", "int8_ranking")
            if key in setup}


def recall(path: Path, setup: dict[str, Any]) -> dict[str, Any]:
    """The fallback an artifact or quantized graph at `path` was made with, into the setup (and returned)."""
    try:
        kept = description(path).get("int8_fallback")
        found = RECORDED(kept, "int8_fallback") if kept is not None else {}
    except (DescriptionError, schema.SchemaError):
        found = {}
    if "int8_ranking" in found:  # ranked by the process that made it: this one read it
        found["int8_ranking"] = {**found["int8_ranking"], "reused": True}
    setup.update(found)
    return found
