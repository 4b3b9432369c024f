"""The knobs: their names as users type them, allowed values, and when each one applies.

A `Config` holds only the knobs a user (or a trial) set; everything else stays at PyTorch's
default, so the empty configuration is "what the user has today".
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from autotune.base.errors import ConfigError
from autotune.child.envfile import value_text

KnobValue = bool | int | str
KnobKind = Literal["bool", "int", "choice"]

_TRUE = {"on", "true", "yes", "1"}
_FALSE = {"off", "false", "no", "0"}


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
    only_when: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # For a knob without a default: the value whose launch is what leaving it unset runs, or comes
    # closest ("max": the most its range offers). How a sampler sees a recipe, which sets few knobs.
    unset_as: KnobValue | None = None

    def allowed(self) -> str:
        if self.kind == "bool":
            return "on, off"
        if self.kind == "int":
            return f"an integer from {self.low} to {self.high}"
        return ", ".join(self.choices)

    def parse(self, raw: object) -> KnobValue:
        """Turn text (CLI, YAML, study params) into this knob's typed value, or explain why not."""
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
        raise ConfigError(f"{self.name}={raw} is not allowed; use {self.allowed()}")


def _knob_table() -> dict[str, Knob]:
    intel = (("omp_runtime", ("intel",)),)
    not_intel = (("omp_runtime", ("gnu", "llvm")),)
    eager = (("backend", ("eager",)),)
    dense = (("mkldnn", ("off",)),)
    knobs = [
        Knob("backend", "choice", "eager; torchscript = trace + freeze (saved, cached on disk) + "
             "optimize_for_inference; inductor = AOTInductor package with freezing, compiled once and loaded",
             choices=("eager", "torchscript", "inductor"), default="eager"),
        Knob("mkldnn", "bool", "convert model and input to the mkldnn (oneDNN) layout (eager only)",
             default=False, only_when=eager),
        Knob("weight_cache", "bool", "the seed's recipe 2.c for eager models: trace (script with "
             "mkldnn), freeze, save and load, cached on disk", default=False, only_when=eager),
        Knob("memory_format", "choice", "model weights and inputs in this layout",
             choices=("contiguous", "channels_last"), default="contiguous", only_when=dense),
        Knob("precision", "choice", "fp32; bf16 autocast (offered where the CPU has avx512_bf16 or AMX); int8 = "
             "static quantization, calibrated (backend=inductor only; offered where the CPU has VNNI or AMX)",
             choices=("fp32", "bf16", "int8"), default="fp32", only_when=dense),
        Knob("omp_threads", "int", "OMP_NUM_THREADS and MKL_NUM_THREADS per instance", low=1, high=4096,
             unset_as="max"),
        Knob("omp_runtime", "choice", "OpenMP runtime: gnu (libgomp, PyTorch's own), intel "
             "(libiomp5 preloaded), llvm (libomp preloaded)", choices=("gnu", "intel", "llvm"),
             default="gnu"),
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
# Conditions of one value rather than of the whole knob: int8 is quantized through torch.export and
# AOTInductor, so it exists only with backend=inductor.
VALUE_CONDITIONS: Mapping[tuple[str, str], tuple[tuple[str, tuple[str, ...]], ...]] = {
    ("precision", "int8"): (("backend", ("inductor",)),),
}


def conditions(name: str, value: KnobValue) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """What must hold for `name=value`: the knob's own condition, and its value's."""
    return KNOBS[name].only_when + VALUE_CONDITIONS.get((name, value_text(value)), ())


def knob(name: str) -> Knob:
    """Look a knob up by name, suggesting close names for a typo."""
    if name in KNOBS:
        return KNOBS[name]
    close = difflib.get_close_matches(name, KNOBS, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ConfigError(f"unknown knob {name!r}; {hint}knobs are: {', '.join(KNOBS)}")


@dataclass(frozen=True)
class Config:
    """The knobs that were set, in registry order; unset knobs keep PyTorch's defaults."""

    values: tuple[tuple[str, KnobValue], ...] = ()

    @classmethod
    def from_mapping(cls, raw: Mapping[str, object]) -> Config:
        parsed = {name: knob(name).parse(value) for name, value in raw.items()}
        ordered = tuple((name, parsed[name]) for name in KNOBS if name in parsed)
        config = cls(ordered)
        config.check_conditions()
        return config

    @classmethod
    def from_assignments(cls, assignments: Iterable[str]) -> Config:
        """Parse `--set KNOB=VALUE` strings; a knob given twice is an error, not a silent override."""
        raw: dict[str, str] = {}
        for item in assignments:
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or not name or not value.strip():
                raise ConfigError(f"--set {item!r} is not KNOB=VALUE, e.g. --set omp_threads=2")
            knob(name)
            if name in raw:
                raise ConfigError(f"--set gives {name} twice ({raw[name]} and {value}); keep one")
            raw[name] = value
        return cls.from_mapping(raw)

    def as_dict(self) -> dict[str, KnobValue]:
        return dict(self.values)

    def get(self, name: str) -> KnobValue | None:
        """The value set, else the knob's documented default (None: the runtime decides)."""
        return self.as_dict().get(name, KNOBS[name].default)

    def text(self, name: str) -> str:
        """The value as a user types it (on/off for switches)."""
        return value_text(self.get(name)) if self.get(name) is not None else "default"

    def is_set(self, name: str) -> bool:
        return name in self.as_dict()

    def check_conditions(self) -> None:
        for name, value in self.values:
            for other, allowed in conditions(name, value):
                if self.text(other) not in allowed:
                    what = name if (other, allowed) in KNOBS[name].only_when else f"{name}={value_text(value)}"
                    raise ConfigError(
                        f"{what} applies only with {other}={'/'.join(allowed)} "
                        f"(here {other}={self.text(other)}); set {other} or drop {name}"
                    )

    def describe(self) -> str:
        """`k=v` pairs as a user would type them; `defaults` for the empty configuration."""
        if not self.values:
            return "defaults"
        return " ".join(f"{k}={value_text(v)}" for k, v in self.values)



