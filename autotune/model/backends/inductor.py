"""backend=inductor: AOTInductor. The model (under bf16 autocast, or quantized by PT2E for int8, or
with its Linear layers quantized by torchao) is captured by torch.export, compiled with freezing into
a package once, and loaded by every process through torch's own loader. With sequence-length
buckets, `shapes=dynamic` exports one package whose sequence length is a dimension.

Where torch.export cannot capture the model (graph breaks, data-dependent control flow), a
torch.compile'd model runs instead, with the reason recorded; int8 has no such fallback. int8's
quantized graph does not depend on the thread count: saved beside the packages the first time and
compiled again from there for another thread count, without the model.

torch is imported inside functions; loading a package does not import torch._inductor (which
imports torch._dynamo: about 2 s of every process that only loads).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

from autotune.model import buckets, fallback
from autotune.model.artifacts import GRAPH_KIND, artifact_path, mark_used, save_artifact
from autotune.model.backends.base import Generation, Quantized
from autotune.model.backends.pytorch import TorchBackend
from autotune.model.batches import autocast, explain, split
from autotune.model.errors import ApplyError
from autotune.model.knobdefs import (
    GENERATION_PRECISIONS,
    INT8_FALLBACK,
    PRECISIONS,
    Knob,
    KnobValue,
    ModelSettings,
    Precision,
)

NO_SPACE = "No space left on device"  # ENOSPC as the C library words it, in a compiler's or linker's output
SHAPES = ("buckets", "dynamic")  # how a compiled model serves sequence-length buckets (`autotune.model.buckets`)
COMPILE: dict[str, KnobValue] = {"backend": "inductor", "memory_format": "channels_last"}


class Inductor(TorchBackend):
    name = "inductor"
    summary = "AOTInductor package with freezing, compiled once and loaded"
    precisions: tuple[Precision, ...] = tuple(p for p in PRECISIONS if p != "int4_weight_only")
    generates = GENERATION_PRECISIONS
    generation = Generation("autotune.model.generate.pytorch", reads_folder=False)
    suffix = ".pt2"
    # Each its own compile: different kernels (one model per sequence-length bucket, or one dynamic
    # model), so a step between two values is measured, not assumed (`search.compile_skip`).
    compiled_for = ("precision", "memory_format", "omp_threads", "shapes")

    def __init__(self) -> None:
        self.knobs = (self.own(Knob(
            "shapes", "choice", "with sequence-length buckets (--seq-lens): buckets = one AOTInductor model per "
            "length, each request padded to the smallest bucket that holds it; dynamic = one AOTInductor model "
            "exported with a dynamic sequence dimension (torch.export), each request run at its own length up to "
            "the largest bucket", choices=SHAPES, default="buckets")),
            self.own(INT8_FALLBACK))

    def artifact_kind(self) -> str:
        return self.name

    def described(self, knobs: ModelSettings) -> dict[str, Any]:
        """Inductor bakes the thread count into its kernels (`omp parallel num_threads(N)`, and no
        parallel loops at all for 1 thread), so each thread count is its own artifact."""
        import torch

        return {"threads": torch.get_num_threads()}

    def build(self, model: Any, example: Any, knobs: ModelSettings, setup: dict[str, Any], path: Path,
              described: dict[str, Any], quantized: Quantized | None) -> Any:
        if quantized is not None:
            exported = _int8_graph(model, example, quantized, path.parent, described, setup)
            save_artifact(path, lambda tmp: _aot_compile(exported, tmp), described)
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

    def rebuildable(self, folder: Path, meta: dict[str, Any], quantized: Quantized | None) -> bool:
        """int8 compiles for another thread count from the quantized graph an earlier one saved."""
        return quantized is not None and graph_path(folder, meta).exists()

    def load(self, path: Path, knobs: ModelSettings, example: Any) -> Any:
        return Package(str(path))

    def recipes(self, cores: int) -> tuple[tuple[str, dict[str, KnobValue]], ...]:
        """Compile with channels_last, in fp32, bf16 and int8 (vendors' CPU inference guides put int8
        first for throughput): offered wherever the probe runs the precision well."""
        return (("compile+channels_last", COMPILE),
                ("compile+bf16+channels_last", {**COMPILE, "precision": "bf16"}),
                ("compile+int8+channels_last", {**COMPILE, "precision": "int8"}))

    def generation_recipes(self, cores: int) -> tuple[tuple[str, dict[str, KnobValue]], ...]:
        """gpt-fast's CPU recipe (a static cache, the decode step compiled, int4 weight-only; the seed
        author's own change took a model from 7 to 33.7 tokens/s so) and its int8 weight-only."""
        return (("gpt-fast-int4", {"backend": "inductor", "precision": "int4_weight_only", "omp_threads": cores}),
                ("gpt-fast-int8", {"backend": "inductor", "precision": "int8_weight_only", "omp_threads": cores}))


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
        _with_fallback(described, fallback.recall(saved, setup))
        return graph
    if model is None:
        raise ApplyError(f"the quantized graph {saved.name} went away while compiling; run again to quantize")
    graph = quantized.export(model, example, folder, described)
    _with_fallback(described, fallback.recorded(setup))
    meta = {k: v for k, v in described.items() if k != "threads"}
    save_artifact(saved, lambda tmp: torch.export.save(graph, str(tmp)), meta)
    return graph


def _with_fallback(described: dict[str, Any], kept: dict[str, Any]) -> None:
    """int8_fallback: the layers the graph kept in fp32 (and the divergences) go into its artifact's
    description, so that a process loading the artifact says what it runs (`fallback.recall`)."""
    if kept:
        described["int8_fallback"] = kept


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


def _export(model: Any, example: Any, knobs: ModelSettings) -> Any:
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


class Package:
    """An AOTInductor package, called like the exported module: inputs flattened as its call spec
    says, outputs put back into the structure the model returned."""

    def __init__(self, path: str) -> None:
        import torch
        from torch.utils import _pytree

        self.runner = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
        in_spec, out_spec = self.runner.get_call_spec()
        self.in_spec, self.out_spec = _pytree.treespec_loads(in_spec), _pytree.treespec_loads(out_spec)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.utils import _pytree

        ordered = {name: kwargs[name] for name in self.in_spec.child(1).context} if kwargs else {}
        flat = [x for x in _pytree.tree_leaves((args, ordered)) if isinstance(x, torch.Tensor)]
        return _pytree.tree_unflatten(self.runner.boxed_run(flat), self.out_spec)


INDUCTOR: TorchBackend = Inductor()
