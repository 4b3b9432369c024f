"""The harness's view of the knobs: looking one up by name, and `Config`, the knobs a request set.

The knobs themselves (names, values, defaults, conditions) are defined once, in the model layer
(`autotune.model.knobs`), so that the measuring child and `apply` read the same rules. A `Config`
holds only the knobs a user (or a trial) set; everything else stays at PyTorch's default, so the
empty configuration is "what the user has today".
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autotune.base.errors import ConfigError
from autotune.model.knobdefs import value_text
from autotune.model.knobs import (
    KNOBS,
    VALUE_CONDITIONS,
    Knob,
    KnobValue,
    KnobValueError,
    broken_condition,
    conditions,
    shown,
)

__all__ = ["KNOBS", "VALUE_CONDITIONS", "Config", "Knob", "KnobValue", "conditions", "identity_of", "knob", "parse"]


def parse(name: str, raw: object) -> KnobValue:
    """`raw` as knob `name`'s typed value; a value it does not take is a ConfigError saying what it takes."""
    try:
        return knob(name).parse(raw)
    except KnobValueError as exc:
        raise ConfigError(str(exc)) from None


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
        parsed = {name: parse(name, value) for name, value in raw.items()}
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

    @classmethod
    def from_description(cls, described: str) -> Config:
        """A configuration as `describe` wrote it ("defaults" for none)."""
        return cls.from_assignments([] if described == "defaults" else described.split())

    def as_dict(self) -> dict[str, KnobValue]:
        return dict(self.values)

    def get(self, name: str) -> KnobValue | None:
        """The value set, else the knob's documented default (None: the runtime decides)."""
        return self.as_dict().get(name, KNOBS[name].default)

    def text(self, name: str) -> str:
        """The value as a user types it (on/off for switches)."""
        return shown(self.get(name))

    def is_set(self, name: str) -> bool:
        return name in self.as_dict()

    def check_conditions(self) -> None:
        problem = broken_condition(self.as_dict(), self.as_dict())
        if problem:
            raise ConfigError(problem)

    def describe(self) -> str:
        """`k=v` pairs as a user would type them; `defaults` for the empty configuration."""
        if not self.values:
            return "defaults"
        return " ".join(f"{k}={value_text(v)}" for k, v in self.values)

    def identity(self) -> str:
        """What the configuration launches, described: a knob set to its declared default launches
        what leaving it unset does (`allocator=default` is the baseline), so it is left out. Two
        configurations with one identity are one configuration: measured once, counted once."""
        return Config(tuple((k, v) for k, v in self.values if v != KNOBS[k].default)).describe()


@functools.lru_cache(maxsize=4096)  # every claim reads every trial's: parse each description once
def identity_of(described: str) -> str:
    """`Config.identity` of a recorded description; a knob this autotune no longer knows keeps it as is."""
    try:
        return Config.from_description(described).identity()
    except ConfigError:
        return described



