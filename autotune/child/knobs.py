"""The knobs, defined once: the names users type, their values, defaults and when each applies.

Everything else derives from this table: the search-space loader and `--set` (`autotune.config.knobs`),
the measuring child's flags (`worker.parse_args`), `apply`'s reading of an env file and its check of
a configuration (`ModelKnobs`, below). It lives in the child's layer because the child and a user's
program must read the same rules as the harness and import nothing of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Literal

from autotune.child import runtimes
from autotune.child.envfile import SWITCH, value_text
from autotune.child.errors import ApplyError

KnobValue = bool | int | str
KnobKind = Literal["bool", "int", "choice"]
Condition = tuple[tuple[str, tuple[str, ...]], ...]  # (knob, the values it must have), all must hold

_TRUE = {"on", "true", "yes", "1"}
_FALSE = {"off", "false", "no", "0"}


class KnobValueError(ValueError):
    """A value a knob does not take; the message names the knob and what it takes."""


@dataclass(frozen=True)
class Knob:
    """One tunable setting; `only_when` names the (knob, allowed values) it depends on."""

    name: str
    kind: KnobKind
    help: str
    choices: tuple[str, ...] = ()
    low: int = 0
    high: int = 0
    default: KnobValue | None = None
    only_when: Condition = ()
    # For a knob without a default: the value whose launch is what leaving it unset runs, or comes
    # closest ("max": the most its range offers). How a sampler sees a recipe, which sets few knobs.
    unset_as: KnobValue | None = None
    model: bool = False  # changes the module itself (apply's business); the others are the process's

    def allowed(self) -> str:
        if self.kind == "bool":
            return ", ".join(SWITCH)
        if self.kind == "int":
            return f"an integer from {self.low} to {self.high}"
        return ", ".join(self.choices)

    def spellings(self) -> tuple[str, ...]:
        """The values as a user types them (a switch's on/off): the child's flags take these."""
        return tuple(SWITCH) if self.kind == "bool" else self.choices

    def parse(self, raw: object) -> KnobValue:
        """Turn text (CLI, YAML, study params, env files) into this knob's typed value, or say why not."""
        text = value_text(raw).strip().lower()
        if self.kind == "bool" and text in _TRUE | _FALSE:
            return text in _TRUE
        if self.kind == "int":
            try:
                number = int(text)
            except ValueError:
                number = None
            if number is not None and self.low <= number <= self.high:
                return number
        if self.kind == "choice" and text in self.choices:
            return text
        raise KnobValueError(f"{self.name}={raw} is not allowed; use {self.allowed()}")


# PyTorch's own ways to run a model, and the other runtimes a model is converted to (its peers).
TORCH_BACKENDS = ("eager", "torchscript", "inductor")
PEER_BACKENDS = ("openvino", "onnxruntime")
PRECISIONS = ("fp32", "bf16", "int8", "int8_dynamic", "int8_weight_only")
SHAPES = ("buckets", "dynamic")  # how a compiled model serves sequence-length buckets (`autotune.child.buckets`)
# torchao's quantize_ on the model's nn.Linear layers, no calibration (`linear_int8`).
LINEAR_INT8: tuple[Precision, ...] = ("int8_dynamic", "int8_weight_only")
# Quantized: judged by top-1 agreement and cosine similarity with eager fp32 (`quantize.agreement_guard`).
QUANTIZED: tuple[Precision, ...] = ("int8", *LINEAR_INT8)


def _knob_table() -> dict[str, Knob]:
    torch_run = (("backend", TORCH_BACKENDS),)
    # OpenMP exists only in PyTorch's process: OpenVINO runs on TBB, ONNX Runtime on its own pool.
    intel = (*torch_run, ("omp_runtime", ("intel",)))
    not_intel = (*torch_run, ("omp_runtime", ("gnu", "llvm")))
    eager = (("backend", ("eager",)),)
    dense = (("mkldnn", ("off",)),)
    openvino = (("backend", ("openvino",)),)
    onnxruntime = (("backend", ("onnxruntime",)),)
    knobs = [
        Knob("backend", "choice", "eager; torchscript = trace + freeze (saved, cached on disk) + "
             "optimize_for_inference; inductor = AOTInductor package with freezing, compiled once and loaded; "
             "openvino = openvino.convert_model, saved as IR, compiled for the CPU plugin; onnxruntime = "
             "torch.onnx.export(dynamo=True), saved, run by an ONNX Runtime CPU session",
             choices=(*TORCH_BACKENDS, *PEER_BACKENDS), default="eager", model=True),
        Knob("mkldnn", "bool", "convert model and input to the mkldnn (oneDNN) layout (eager only)",
             default=False, only_when=eager, model=True),
        Knob("weight_cache", "bool", "the seed's recipe 2.c for eager models: trace and freeze (with "
             "mkldnn: script, or trace a transformers model), save and load, cached on disk", default=False,
             only_when=eager, model=True),
        Knob("memory_format", "choice", "model weights and inputs in this layout (PyTorch backends)",
             choices=("contiguous", "channels_last"), default="contiguous", only_when=(*dense, *torch_run),
             model=True),
        Knob("precision", "choice", "fp32; bf16 = autocast, or OpenVINO's bf16 inference precision (offered where "
             "the kernel probe measured bf16 run well); int8 = static quantization calibrated on the example "
             "batches: PT2E for inductor, NNCF for openvino, QDQ for onnxruntime; int8_dynamic = torchao's dynamic "
             "int8 of every nn.Linear, activations quantized as it runs; int8_weight_only = torchao's int8 weights "
             "of every nn.Linear, computed in fp32 (eager, inductor)",
             choices=PRECISIONS, default="fp32", only_when=dense, model=True),
        Knob("shapes", "choice", "with sequence-length buckets (--seq-lens): buckets = one AOTInductor model per "
             "length, each request padded to the smallest bucket that holds it; dynamic = one AOTInductor model "
             "exported with a dynamic sequence dimension (torch.export), each request run at its own length up to "
             "the largest bucket", choices=SHAPES, default="buckets", only_when=(("backend", ("inductor",)),),
             model=True),
        Knob("ov_hint", "choice", "OpenVINO's performance hint: latency (one stream, all threads) or throughput "
             "(several streams)", choices=("latency", "throughput"), default="latency", only_when=openvino,
             model=True),
        Knob("ov_streams", "int", "OpenVINO's number of streams (NUM_STREAMS); 0 = as the hint decides",
             low=0, high=4096, default=0, only_when=openvino, model=True),
        Knob("ov_pinning", "bool", "OpenVINO pins its threads to CPUs (ENABLE_CPU_PINNING)", default=True,
             only_when=openvino, model=True),
        Knob("ort_optimization", "choice", "ONNX Runtime's graph optimization level",
             choices=("disabled", "basic", "extended", "all"), default="all", only_when=onnxruntime, model=True),
        Knob("ort_execution", "choice", "ONNX Runtime's execution mode: sequential, or parallel (independent "
             "nodes at once, on the inter-op threads)", choices=("sequential", "parallel"), default="sequential",
             only_when=onnxruntime, model=True),
        Knob("ort_inter_threads", "int", "ONNX Runtime's inter-op threads; 0 = its own choice",
             low=0, high=4096, default=0, only_when=(*onnxruntime, ("ort_execution", ("parallel",))), model=True),
        Knob("omp_threads", "int", "OMP_NUM_THREADS and MKL_NUM_THREADS per instance; OpenVINO's inference threads "
             "and ONNX Runtime's intra-op threads", low=1, high=4096, unset_as="max"),
        Knob("omp_runtime", "choice", "OpenMP runtime: gnu (libgomp, PyTorch's own), intel "
             "(libiomp5 preloaded), llvm (libomp preloaded); PyTorch backends only", choices=("gnu", "intel", "llvm"),
             default="gnu", only_when=torch_run),
        Knob("kmp_affinity", "choice", "KMP_AFFINITY of Intel OpenMP: compact = "
             "granularity=fine,compact,1,0; scatter = granularity=fine,scatter",
             choices=("compact", "scatter", "disabled"), only_when=intel, unset_as="disabled"),
        Knob("kmp_blocktime", "int", "KMP_BLOCKTIME of Intel OpenMP, in ms", low=0, high=1000,
             only_when=intel, unset_as=200),
        Knob("omp_proc_bind", "choice", "OMP_PROC_BIND of GNU/LLVM OpenMP (OMP_PLACES=cores "
             "unless false)", choices=("false", "true", "close", "spread"), only_when=not_intel,
             unset_as="false"),
        Knob("allocator", "choice", "malloc by LD_PRELOAD, with the tuning env its users set",
             choices=("default", "jemalloc", "tcmalloc"), default="default"),
        Knob("instances", "int", "concurrent benchmark processes, each bound to its own "
             "physical cores", low=1, high=4096, unset_as=1),
        Knob("dataloader_workers", "int", "DataLoader num_workers feeding the benchmark",
             low=0, high=64, default=0),
    ]
    return {k.name: k for k in knobs}


KNOBS: Mapping[str, Knob] = _knob_table()
MODEL_KNOBS = tuple(name for name, k in KNOBS.items() if k.model)
# The settings of OpenVINO or ONNX Runtime alone (their condition names only those backends).
PEER_KNOBS = tuple(name for name, k in KNOBS.items()
                   if any(other == "backend" and set(allowed) <= set(PEER_BACKENDS) for other, allowed in k.only_when))
# A peer runtime's settings that place its work on the cores (the hint that sizes its streams, the
# streams, pinning, the executor and its threads): every operation computes what it did without them.
PLACEMENT_KNOBS = ("ov_hint", "ov_streams", "ov_pinning", "ort_execution", "ort_inter_threads")
# Conditions of one value rather than of the whole knob: int8 is quantized through torch.export and
# AOTInductor, or by a peer's own quantizer, so it needs a backend that quantizes. torchao's tensor
# subclasses run in eager and through torch.export; TorchScript cannot trace int8_dynamic (an
# internal assert in its tracer), and the peers take no torchao model.
VALUE_CONDITIONS: Mapping[tuple[str, str], Condition] = {
    ("precision", "bf16"): (("backend", ("eager", "torchscript", "inductor", "openvino")),),
    ("precision", "int8"): (("backend", ("inductor", *PEER_BACKENDS)),),
    **{("precision", value): (("backend", ("eager", "inductor")), ("weight_cache", ("off",))) for value in LINEAR_INT8},
    # OpenVINO's runtime frees memory the preloaded malloc did not allocate ("free(): invalid pointer",
    # SIGABRT; SIGBUS once): every such run crashed, resnet18 and BERT alike (OpenVINO 2026.4.1).
    **{("allocator", value): (("backend", (*TORCH_BACKENDS, "onnxruntime")),) for value in ("jemalloc", "tcmalloc")},
}


def conditions(name: str, value: KnobValue) -> Condition:
    """What must hold for `name=value`: the knob's own condition, and its value's."""
    return KNOBS[name].only_when + VALUE_CONDITIONS.get((name, value_text(value)), ())


def shown(value: KnobValue | None) -> str:
    """A value as a user types it; "default" where the runtime decides (no value)."""
    return "default" if value is None else value_text(value)


def broken_condition(values: Mapping[str, KnobValue], set_names: Iterable[str]) -> str | None:
    """The first condition that a knob of `set_names` breaks, said as what to do; None when all hold.
    `values` holds the set knobs; a knob it lacks is at its default."""
    for name in (n for n in KNOBS if n in set(set_names)):
        for other, allowed in conditions(name, values[name]):
            here = shown(values.get(other, KNOBS[other].default))
            if here not in allowed:
                what = name if (other, allowed) in KNOBS[name].only_when else f"{name}={value_text(values[name])}"
                return (f"{what} applies only with {other}={'/'.join(allowed)} (here {other}={here}); "
                        f"set {other} or drop {name}")
    return None


# The model knobs' values as types; what each takes is `knobs.KNOBS` (a test holds the two together).
Backend = Literal["eager", "torchscript", "inductor", "openvino", "onnxruntime"]


Precision = Literal["fp32", "bf16", "int8", "int8_dynamic", "int8_weight_only"]


MemoryFormat = Literal["contiguous", "channels_last"]


Shapes = Literal["buckets", "dynamic"]


OvHint = Literal["latency", "throughput"]


OrtOptimization = Literal["disabled", "basic", "extended", "all"]


OrtExecution = Literal["sequential", "parallel"]


@dataclass(frozen=True)
class ModelKnobs:
    """The knobs that change the model itself rather than its process (those are environment)."""

    backend: Backend = "eager"
    precision: Precision = "fp32"
    memory_format: MemoryFormat = "contiguous"
    mkldnn: bool = False
    weight_cache: bool = False
    shapes: Shapes = "buckets"
    ov_hint: OvHint = "latency"
    ov_streams: int = 0
    ov_pinning: bool = True
    ort_optimization: OrtOptimization = "all"
    ort_execution: OrtExecution = "sequential"
    ort_inter_threads: int = 0

    @property
    def is_default(self) -> bool:
        return self == ModelKnobs()

    @property
    def saved_as_torchscript(self) -> bool:
        return self.backend == "torchscript" or self.weight_cache

    @property
    def peer(self) -> bool:
        """Run by another runtime (OpenVINO, ONNX Runtime) than PyTorch."""
        return self.backend in PEER_BACKENDS

    @property
    def quantized(self) -> bool:
        """int8 of any kind: guarded by agreement with eager fp32 rather than by relative error."""
        return self.precision in QUANTIZED

    @property
    def converts_in_place(self) -> bool:
        """Whether converting changes the module itself, so that `apply` must work on a copy."""
        return self.mkldnn or self.memory_format == "channels_last" or self.precision in LINEAR_INT8

    @property
    def compiled(self) -> bool:
        """A configuration whose converted model is saved as an artifact and loaded back."""
        return self.saved_as_torchscript or self.backend == "inductor" or self.peer

    @property
    def one_shape(self) -> bool:
        """A compiled model that takes its example's shape alone: one per sequence-length bucket."""
        return self.compiled and self.shapes != "dynamic"

    @property
    def answers(self) -> str:
        """What decides the answers the model gives, described: every model knob but a peer's
        placement of its work (`PLACEMENT_KNOBS`). The process knobs (threads, OpenMP, allocator,
        instances) are not model knobs: between thread counts only the order of a reduction's
        additions differs, far below what the guard tolerates."""
        return replace(self, **{name: getattr(ModelKnobs(), name) for name in PLACEMENT_KNOBS}).describe()

    def describe(self) -> str:
        changed = {k: v for k, v in asdict(self).items() if v != getattr(ModelKnobs(), k)}
        return " ".join(f"{k}={value_text(v)}" for k, v in changed.items()) or "defaults"

    @classmethod
    def from_values(cls, values: Mapping[str, KnobValue]) -> ModelKnobs:
        """The model knobs among `values` (typed as `knobs.Knob.parse` gives them); the rest keep their defaults."""
        return cls(**{name: values[name] for name in MODEL_KNOBS if name in values})  # type: ignore[arg-type]

    def check(self) -> None:
        """Combinations the conversions cannot honour (the knobs' conditions), and a runtime or a
        torch build this machine lacks. Whether a precision runs well on this CPU is the kernel
        probe's to say, when a search chooses; a configuration that was chosen is converted as asked."""
        values = asdict(self)
        problem = broken_condition(values, [name for name in MODEL_KNOBS if values[name] != KNOBS[name].default])
        if problem:
            raise ApplyError(problem)
        if self.peer and not runtimes.installed(self.backend):
            raise ApplyError(runtimes.not_installed(self.backend))
        if self.mkldnn:
            import torch

            if not torch.backends.mkldnn.is_available():
                raise ApplyError("mkldnn=on needs a torch built with oneDNN (mkldnn), and this one is not; "
                                 "use mkldnn=off")
