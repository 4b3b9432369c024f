"""What a knob is (a name, its values, default and condition, and how text becomes its value), the
precisions, and the model knobs' values as the code below the knob table reads them (`ModelSettings`):
shared by the knob table (`autotune.model.knobs`) and the backends that declare knobs of their own
and build what the knobs say (`autotune.model.backends`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

KnobValue = bool | int | str
KnobKind = Literal["bool", "int", "choice"]
Condition = tuple[tuple[str, tuple[str, ...]], ...]  # (knob, the values it must have), all must hold

_TRUE = {"on", "true", "yes", "1"}
_FALSE = {"off", "false", "no", "0"}
PRELOAD = "LD_PRELOAD"  # where a knob's `needs` go: the libraries a process loads first

SWITCH = {"on": True, "off": False}  # how a switch is spelled everywhere: CLI, YAML, env files


def value_text(value: object) -> str:
    """A knob value as users type it: switches are on/off, everything else as it prints."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


@dataclass(frozen=True)
class Sets:
    """An environment variable a process knob sets: its name and its text per value (`texts`:
    (value, text) pairs, the values it is set for), or the value as typed where `texts` is empty."""

    variable: str
    texts: tuple[tuple[str, str], ...] = ()

    def text(self, value: KnobValue) -> str | None:
        """What the variable holds at `value` (None: the value leaves it unset)."""
        typed = value_text(value)
        return dict(self.texts).get(typed) if self.texts else typed


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
    places: bool = False  # a runtime's setting that places its work on the cores, not what it computes
    core_bound: bool = False  # an integer no larger than the usable physical cores (its `max`)
    splits_cores: bool = False  # the knobs so marked multiply into the cores one process uses (threads x instances)
    shrinks_with: str = ""  # the knob whose sampled value caps this one (threads x instances fit the cores)
    needs: tuple[tuple[str, str], ...] = ()  # (value, the library it preloads): a machine without it lacks it
    sets: tuple[Sets, ...] = ()  # the environment variables it sets (an export unsets them when it does not)
    # Its values other than the default only buy back quality at a cost in speed (layers kept in fp32):
    # a search proposes them for a model only once that model without them fell short on quality
    # (`quality_records.short_on_quality`); a space that offers nothing else proposes them as it is.
    remedy: bool = False

    @property
    def variables(self) -> tuple[str, ...]:
        """Every environment variable the knob may set: LD_PRELOAD for what it `needs`, and its own."""
        return tuple(dict.fromkeys([PRELOAD] * bool(self.needs) + [s.variable for s in self.sets]))

    def environment(self, value: KnobValue) -> dict[str, str]:
        """The variables `value` sets (LD_PRELOAD aside: its libraries are `preloads`)."""
        return {s.variable: text for s in self.sets if (text := s.text(value)) is not None}

    def preloads(self, value: KnobValue) -> tuple[str, ...]:
        """The libraries `value` preloads (names of `autotune.host.libs`)."""
        return tuple(library for wanted, library in self.needs if wanted == value_text(value))

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


# int8_fallback: one knob, one meaning in every runtime whose int8 can leave layers in fp32 (PT2E's
# for inductor, NNCF's for openvino): each such backend declares it among its own knobs (`Backend.own`),
# and the knob table merges their conditions into one knob (`knobs._knob_table`).
INT8_FALLBACK = Knob(
    "int8_fallback", "int", "precision=int8: the N quantized layers (Conv/Linear modules; OpenVINO's "
    "Convolution/MatMul nodes) whose int8 moves the output furthest from eager fp32's kept in fp32, as NNCF's "
    "accuracy control and Intel Neural Compressor's fallback do; ranked once per model and calibration by "
    "quantizing without each, on the calibration batches (docs/int8.md); 0 = every layer int8", low=0, high=4096,
    default=0, only_when=(("precision", ("int8",)),), remedy=True)


Precision = Literal["fp32", "bf16", "int8", "int8_dynamic", "int8_weight_only", "int4_weight_only"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16", "int8", "int8_dynamic", "int8_weight_only", "int4_weight_only")
# torchao's quantize_ on the model's nn.Linear layers, no calibration (`linear_int8`).
LINEAR_INT8: tuple[Precision, ...] = ("int8_dynamic", "int8_weight_only")
# Quantized: judged by top-1 agreement and cosine similarity with eager fp32 (`quantize.agreement_guard`).
QUANTIZED: tuple[Precision, ...] = ("int8", *LINEAR_INT8, "int4_weight_only")
# What --task generate offers (weights in int4 are for a language model's decode alone).
GENERATION_PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16", "int8_weight_only", "int4_weight_only", "int8_dynamic")


# The model knobs' values as types; what each takes is the knob table's (a test holds the two together).
Backend = Literal["eager", "torchscript", "inductor", "openvino", "onnxruntime", "llamacpp"]
MemoryFormat = Literal["contiguous", "channels_last"]
Shapes = Literal["buckets", "dynamic"]
OvHint = Literal["latency", "throughput"]
OrtOptimization = Literal["disabled", "basic", "extended", "all"]
OrtExecution = Literal["sequential", "parallel"]
KvCache = Literal["dynamic", "static"]
Attention = Literal["sdpa", "eager"]


class ModelSettings(Protocol):
    """The model knobs' values, as the backends and the conversions below the knob table read them.
    `knobs.ModelKnobs` is what they are given: it sits above the backends' registry (its defaults and
    its checks read it), so the modules below name this instead, and the imports run one way. Its
    members are properties, read-only as the frozen `ModelKnobs`'s fields are."""

    @property
    def backend(self) -> Backend: ...
    @property
    def precision(self) -> Precision: ...
    @property
    def memory_format(self) -> MemoryFormat: ...
    @property
    def mkldnn(self) -> bool: ...
    @property
    def weight_cache(self) -> bool: ...
    @property
    def shapes(self) -> Shapes: ...
    @property
    def int8_fallback(self) -> int: ...
    @property
    def ov_hint(self) -> OvHint: ...
    @property
    def ov_streams(self) -> int: ...
    @property
    def ov_pinning(self) -> bool: ...
    @property
    def ort_optimization(self) -> OrtOptimization: ...
    @property
    def ort_execution(self) -> OrtExecution: ...
    @property
    def ort_inter_threads(self) -> int: ...
    @property
    def kv_cache(self) -> KvCache: ...
    @property
    def attention(self) -> Attention: ...

    def without_peers(self) -> dict[str, Any]:
        """Every knob's value but the peer runtimes' own settings."""
        ...
