"""The knobs, defined once: the names users type, their values, defaults and when each applies.

Everything else derives from this table: the search-space loader and `--set` (`autotune.config.knobs`),
the measuring child's flags (`worker.parse_args`), `apply`'s reading of an env file and its check of
a configuration (`ModelKnobs`, below). It lives in the model layer because the child and a user's program
must read the same rules as the harness and import nothing of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from autotune.model import backends
from autotune.model.backends import PEER_BACKENDS, TORCH_BACKENDS
from autotune.model.errors import ApplyError
from autotune.model.knobdefs import (
    LINEAR_INT8,
    PRECISIONS,
    QUANTIZED,
    Attention,
    Backend,
    Condition,
    Knob,
    KnobKind,
    KnobValue,
    KnobValueError,
    KvCache,
    MemoryFormat,
    OrtExecution,
    OrtOptimization,
    OvHint,
    Precision,
    Sets,
    Shapes,
    value_text,
)

__all__ = ["KNOBS", "LINEAR_INT8", "MODEL_KNOBS", "PEER_BACKENDS", "PEER_KNOBS", "PRECISIONS", "QUANTIZED",
           "TORCH_BACKENDS", "Condition", "Knob", "KnobKind", "KnobValue", "KnobValueError", "ModelKnobs",
           "Precision"]


# What each process knob's values set, where the variable does not take the value as typed.
KMP_AFFINITY = (("compact", "granularity=fine,compact,1,0"), ("scatter", "granularity=fine,scatter"),
                ("disabled", "disabled"))
PLACES = tuple((bind, "cores") for bind in ("true", "close", "spread"))  # OMP_PLACES unless OMP_PROC_BIND=false
# jemalloc's own defaults return memory eagerly; PyTorch's launchers set this and without it
# jemalloc measured about 2x slower than glibc here at batch size 1.
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"
# tcmalloc prints a report for every allocation above 1 GiB by default; large batches make many.
TCMALLOC_REPORT_THRESHOLD = str(64 << 30)


def _knob_table(registry: tuple[backends.Backend, ...] = backends.REGISTRY) -> dict[str, Knob]:
    """Every knob: the backend, the first backend's own knobs (eager's: the seed's layout and weight
    cache), the layout and precision PyTorch's backends take, every other backend's own knobs in the
    registry's order, then the process's knobs. The order is the order of a configuration's
    description, which names a study's trials: a new backend's knobs come after the others'."""
    torch_run = (("backend", tuple(b.name for b in registry if not b.peer)),)
    # OpenMP exists only in PyTorch's process: OpenVINO runs on TBB, ONNX Runtime on its own pool.
    intel = (*torch_run, ("omp_runtime", ("intel",)))
    not_intel = (*torch_run, ("omp_runtime", ("gnu", "llvm")))
    dense = (("mkldnn", ("off",)),)
    first, *rest = registry
    knobs = [
        Knob("backend", "choice", "; ".join(f"{b.name} = {b.summary}" for b in registry),
             choices=tuple(b.name for b in registry), default=first.name, model=True),
        *first.knobs,
        Knob("memory_format", "choice", "model weights and inputs in this layout (PyTorch backends)",
             choices=("contiguous", "channels_last"), default="contiguous", only_when=(*dense, *torch_run),
             model=True),
        Knob("precision", "choice", "fp32; bf16 = autocast, or OpenVINO's bf16 inference precision (offered where "
             "the kernel probe measured bf16 run well); int8 = static quantization calibrated on the example "
             "batches: PT2E for inductor, NNCF for openvino, QDQ for onnxruntime; int8_dynamic = torchao's dynamic "
             "int8 of every nn.Linear, activations quantized as it runs; int8_weight_only = torchao's int8 weights "
             "of every nn.Linear, computed in fp32 (eager, inductor); --task generate: bf16 = the weights in bf16, "
             "int8_weight_only/int4_weight_only = weights in 8 or 4 bits (ATen's CPU int8 and int4 kernels, bf16 "
             "activations; llama.cpp's Q8_0/Q4_0; NNCF's for OpenVINO GenAI)",
             choices=PRECISIONS, default="fp32", only_when=dense, model=True),
        *_shared(knob for backend in rest for knob in backend.knobs),
        Knob("kv_cache", "choice", "--task generate: the KV cache; dynamic = transformers' default, grown token by "
             "token; static = allocated once for the prompt and the new tokens (backend=inductor always uses it: its "
             "compiled decode step takes fixed shapes)", choices=("dynamic", "static"), default="dynamic",
             only_when=(("backend", ("eager",)),), model=True),
        Knob("attention", "choice", "--task generate: transformers' attention implementation; sdpa = PyTorch's "
             "scaled_dot_product_attention, eager = its own matmuls", choices=("sdpa", "eager"), default="sdpa",
             only_when=(("backend", ("eager", "inductor")),), model=True),
        Knob("omp_threads", "int", "OMP_NUM_THREADS and MKL_NUM_THREADS per instance; OpenVINO's inference threads, "
             "ONNX Runtime's intra-op threads and llama.cpp's threads", low=1, high=4096, unset_as="max",
             core_bound=True, splits_cores=True,
             shrinks_with="instances", sets=(Sets("OMP_NUM_THREADS"), Sets("MKL_NUM_THREADS"))),
        Knob("omp_runtime", "choice", "OpenMP runtime: gnu (libgomp, PyTorch's own), intel "
             "(libiomp5 preloaded), llvm (libomp preloaded); PyTorch backends only", choices=("gnu", "intel", "llvm"),
             default="gnu", only_when=torch_run, needs=(("intel", "libiomp5"), ("llvm", "libomp"))),
        Knob("kmp_affinity", "choice", "KMP_AFFINITY of Intel OpenMP: compact = "
             "granularity=fine,compact,1,0; scatter = granularity=fine,scatter",
             choices=("compact", "scatter", "disabled"), only_when=intel, unset_as="disabled",
             sets=(Sets("KMP_AFFINITY", KMP_AFFINITY),)),
        Knob("kmp_blocktime", "int", "KMP_BLOCKTIME of Intel OpenMP, in ms", low=0, high=1000,
             only_when=intel, unset_as=200, sets=(Sets("KMP_BLOCKTIME"),)),
        Knob("omp_proc_bind", "choice", "OMP_PROC_BIND of GNU/LLVM OpenMP (OMP_PLACES=cores "
             "unless false)", choices=("false", "true", "close", "spread"), only_when=not_intel,
             unset_as="false", sets=(Sets("OMP_PROC_BIND"), Sets("OMP_PLACES", PLACES))),
        Knob("allocator", "choice", "malloc by LD_PRELOAD, with the tuning env its users set",
             choices=("default", "jemalloc", "tcmalloc"), default="default",
             needs=(("jemalloc", "jemalloc"), ("tcmalloc", "tcmalloc")),
             sets=(Sets("MALLOC_CONF", (("jemalloc", JEMALLOC_CONF),)),
                   Sets("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", (("tcmalloc", TCMALLOC_REPORT_THRESHOLD),)))),
        Knob("instances", "int", "concurrent benchmark processes, each bound to its own "
             "physical cores", low=1, high=4096, unset_as=1, core_bound=True, splits_cores=True),
        Knob("dataloader_workers", "int", "DataLoader num_workers feeding the benchmark",
             low=0, high=64, default=0),
    ]
    return {k.name: k for k in knobs}


def _shared(declared: Iterable[Knob]) -> tuple[Knob, ...]:
    """The backends' own knobs, one per name: a knob that several backends declare (`int8_fallback`,
    PT2E's and NNCF's alike) is one knob applying with any of them, where its first declaration stands."""
    merged: dict[str, Knob] = {}
    for knob in declared:
        first = merged.get(knob.name)
        if first is None:
            merged[knob.name] = knob
            continue
        (_, theirs), *rest = first.only_when
        (_, mine), *my_rest = knob.only_when
        assert rest == my_rest, f"{knob.name}: backends declare it with other conditions"
        merged[knob.name] = replace(first, only_when=(("backend", (*theirs, *mine)), *rest))
    return tuple(merged.values())


def _value_conditions(registry: tuple[backends.Backend, ...] = backends.REGISTRY) -> dict[tuple[str, str], Condition]:
    """Conditions of one value rather than of the whole knob: a precision goes with the backends that
    run it (`Backend.precisions`: int8 is quantized through torch.export and AOTInductor or by a
    peer's own quantizer; torchao's tensor subclasses run in eager and through torch.export, and
    TorchScript cannot trace int8_dynamic, an internal assert in its tracer, so no weight cache with
    them either), and a preloaded malloc with the backends that tolerate one (`preloaded_malloc`)."""
    found: dict[tuple[str, str], Condition] = {}
    for precision in PRECISIONS[1:]:
        taking = tuple(b.name for b in registry if precision in b.precisions or precision in b.generates)
        found[("precision", precision)] = (("backend", taking),) + (
            (("weight_cache", ("off",)),) if precision in LINEAR_INT8 else ())
    tolerant = tuple(b.name for b in registry if b.preloaded_malloc)
    found |= {("allocator", value): (("backend", tolerant),) for value in ("jemalloc", "tcmalloc")}
    return found


KNOBS: Mapping[str, Knob] = _knob_table()
MODEL_KNOBS = tuple(name for name, k in KNOBS.items() if k.model)
# The settings of OpenVINO or ONNX Runtime alone (their condition names only those backends).
PEER_KNOBS = tuple(name for name, k in KNOBS.items()
                   if any(other == "backend" and set(allowed) <= set(PEER_BACKENDS) for other, allowed in k.only_when))
# A peer runtime's settings that place its work on the cores (the hint that sizes its streams, the
# streams, pinning, the executor and its threads): every operation computes what it did without them.
PLACEMENT_KNOBS = tuple(name for name, k in KNOBS.items() if k.places)
# Knobs whose highest value a machine's cores cap (`max`): threads, instances, and the runtimes'
# streams and inter-op threads, none of which can use more than the cores.
CORE_BOUND = tuple(name for name, k in KNOBS.items() if k.core_bound)
# A knob whose range shrinks with another's sampled value: threads x instances fit the cores, and an
# OpenVINO stream runs one thread at least.
SHRINKS_WITH = {name: k.shrinks_with for name, k in KNOBS.items() if k.shrinks_with}
# The environment variables the process knobs set, every one of them.
KNOB_VARIABLES = tuple(dict.fromkeys(var for k in KNOBS.values() for var in k.variables))
# The knobs whose values multiply into the cores the processes use: their product fits the cores.
SPLITS_CORES = tuple(name for name, k in KNOBS.items() if k.splits_cores)
VALUE_CONDITIONS: Mapping[tuple[str, str], Condition] = _value_conditions()


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


def _default(name: str) -> Any:
    """A model knob's default, as the table has it."""
    return KNOBS[name].default


@dataclass(frozen=True)
class ModelKnobs:
    """The knobs that change the model itself rather than its process (those are environment),
    at the table's defaults. The backends below the table read them as `knobdefs.ModelSettings`."""

    backend: Backend = field(default=_default("backend"))
    precision: Precision = field(default=_default("precision"))
    memory_format: MemoryFormat = field(default=_default("memory_format"))
    mkldnn: bool = field(default=_default("mkldnn"))
    weight_cache: bool = field(default=_default("weight_cache"))
    shapes: Shapes = field(default=_default("shapes"))
    int8_fallback: int = field(default=_default("int8_fallback"))
    ov_hint: OvHint = field(default=_default("ov_hint"))
    ov_streams: int = field(default=_default("ov_streams"))
    ov_pinning: bool = field(default=_default("ov_pinning"))
    ort_optimization: OrtOptimization = field(default=_default("ort_optimization"))
    ort_execution: OrtExecution = field(default=_default("ort_execution"))
    ort_inter_threads: int = field(default=_default("ort_inter_threads"))
    kv_cache: KvCache = field(default=_default("kv_cache"))
    attention: Attention = field(default=_default("attention"))

    @property
    def is_default(self) -> bool:
        return self == ModelKnobs()

    @property
    def runs_in(self) -> backends.Backend:
        """The backend that runs the model."""
        return backends.get(self.backend)

    @property
    def peer(self) -> bool:
        """Run by another runtime (OpenVINO, ONNX Runtime) than PyTorch."""
        return self.runs_in.peer

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
        return self.runs_in.compiles(self)

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

    def without_peers(self) -> dict[str, Any]:
        """Every knob's value but the peer runtimes' own settings (`PEER_KNOBS`)."""
        return {name: value for name, value in asdict(self).items() if name not in PEER_KNOBS}

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
        if not backends.installed(self.backend):
            raise ApplyError(backends.not_installed(self.backend))
        if self.mkldnn:
            import torch

            if not torch.backends.mkldnn.is_available():
                raise ApplyError("mkldnn=on needs a torch built with oneDNN (mkldnn), and this one is not; "
                                 "use mkldnn=off")
