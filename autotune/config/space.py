"""Search spaces: `search_spaces/*.yaml` loaded into typed knob ranges, adapted to this machine.

Format (every key is a knob name from `autotune knobs`):

    knobs:
      mkldnn: [off, on]                     # a list is the choices
      omp_runtime: [gnu, intel, llvm]
      kmp_blocktime:
        choices: [0, 1, 200]
        when: {omp_runtime: intel}          # sampled only when the condition holds
      instances: {low: 1, high: max}        # integer range; max = usable physical cores
      omp_threads: {low: 1, high: max, log: false, step: 1}

Knobs with a built-in condition (kmp_* need omp_runtime=intel, omp_proc_bind needs gnu/llvm)
get it without writing `when`; so do values with one (precision=bf16 is not for onnxruntime): where
the condition fails the value is not offered, and the knob is sampled as its own Optuna parameter
named after the values left, e.g. `precision (fp32/bf16)` (Optuna keeps one set of choices per
name). `omp_threads x instances` never exceeds the usable physical cores: the range of omp_threads
shrinks with the sampled instances, and OpenVINO's streams (ov_streams) never outnumber its threads.
The OpenMP knobs apply only with PyTorch's backends, OpenVINO's (ov_*) and ONNX Runtime's (ort_*)
only with theirs: a knob is sampled after the knobs its conditions read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import yaml

from autotune.base.errors import AutotuneError
from autotune.config.knobs import KNOBS, VALUE_CONDITIONS, Config, Knob, KnobValue, knob, parse
from autotune.model.knobdefs import value_text
from autotune.model.knobs import SHRINKS_WITH, SPLITS_CORES

USER_SPACES = Path("search_spaces")  # in the current folder: the user's own spaces, found before the shipped ones
BATCH_PARAM = "batch_size"  # the Optuna parameter of a search over several batch sizes


def _sample_order() -> tuple[str, ...]:
    """Every knob after the knobs its conditions (its own and its values') look at, so that each
    condition reads knobs sampled earlier (omp_runtime after backend, kmp_* after omp_runtime), and
    a range after the knob it shrinks with (`SHRINKS_WITH`); otherwise in the knob table's order."""
    after = {name: {other for other, _ in spec.only_when} for name, spec in KNOBS.items()}
    for (name, _), condition in VALUE_CONDITIONS.items():
        after[name] |= {other for other, _ in condition}
    for name, other in SHRINKS_WITH.items():
        after[name].add(other)
    order: list[str] = []
    while len(order) < len(after):
        order.append(next(name for name in after if name not in order and after[name] <= set(order)))
    return tuple(order)


SAMPLE_ORDER = _sample_order()
RANGE_KEYS = {"low", "high", "step", "log", "when"}
CHOICE_KEYS = {"choices", "when"}
# A space with more configurations is not listed (nor exhausted). The default space on 2 cores holds
# about 20 000 (19 722, and 20 058 once OpenVINO's int8 took int8_fallback): listed, as it was.
ENUMERATE_LIMIT = 25_000


class SpaceError(AutotuneError):
    """A search space file that cannot be used: names the file, the key and what is allowed."""


class Suggester(Protocol):
    """The part of an Optuna trial that sampling uses (a fake in tests)."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...


@dataclass(frozen=True)
class KnobRange:
    """One knob's search range: choices, or an integer range whose high may be `max`."""

    name: str
    choices: tuple[KnobValue, ...] = ()
    low: int = 0
    high: int | str = 0
    step: int = 1
    log: bool = False
    when: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Conditions of single values that this machine adds to the knob table's (`VALUE_CONDITIONS`):
    # (value, condition), e.g. precision=bf16 only with the backends whose probe runs it fast.
    value_when: tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = ()

    @property
    def is_range(self) -> bool:
        return not self.choices

    def applies(self, sampled: Mapping[str, KnobValue]) -> bool:
        return _holds(self.when, sampled)

    def value_condition(self, value: KnobValue) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """What must hold for this knob to take `value`: the knob table's condition and this machine's."""
        text = value_text(value)
        return VALUE_CONDITIONS.get((self.name, text), ()) + dict(self.value_when).get(text, ())

    def offered(self, sampled: Mapping[str, KnobValue]) -> tuple[KnobValue, ...]:
        """The choices whose own condition holds for what `sampled` holds (precision=int8 needs
        a backend that quantizes)."""
        return tuple(c for c in self.choices if _holds(self.value_condition(c), sampled))

    def param(self, sampled: Mapping[str, KnobValue]) -> str:
        """The Optuna parameter that samples this knob: its name, or, when a value's condition
        leaves fewer choices, a name of its own for those (`precision (fp32/bf16)`)."""
        offered = self.offered(sampled)
        if offered == self.choices:
            return self.name
        return f"{self.name} ({'/'.join(value_text(c) for c in offered)})"


def _holds(when: tuple[tuple[str, tuple[str, ...]], ...], sampled: Mapping[str, KnobValue]) -> bool:
    return all(value_text(sampled.get(k, KNOBS[k].default)) in allowed for k, allowed in when)


def knob_of_param(param: str) -> str:
    """The knob an Optuna parameter samples (`precision (fp32/bf16)` samples precision)."""
    return param.partition(" (")[0]


def config_of_params(params: Mapping[str, Any]) -> Config:
    """The configuration a trial's Optuna parameters sample (the batch size is no knob)."""
    return Config.from_mapping({knob_of_param(k): v for k, v in params.items() if k != BATCH_PARAM})


@dataclass(frozen=True)
class SearchSpace:
    source: str
    knobs: tuple[KnobRange, ...]
    notes: tuple[str, ...] = ()
    cores: int = 0  # usable physical cores, once adapted to a machine

    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def get(self, name: str) -> KnobRange | None:
        return next((k for k in self.knobs if k.name == name), None)

    def sample(self, trial: Suggester, only: Config | None = None) -> Config:
        """A configuration by construction valid: conditions hold, threads x instances fit. With
        `only`, just the knobs it sets are suggested (a recipe: the others stay at their defaults),
        each with the distribution a sampled trial would give it."""
        sampled: dict[str, KnobValue] = {}
        for rng in self._applicable(only.as_dict() if only is not None else sampled):
            if only is not None and rng.name not in only.as_dict():
                continue
            if rng.choices:
                labels = [value_text(c) for c in rng.offered(sampled)]
                sampled[rng.name] = parse(rng.name, trial.suggest_categorical(rng.param(sampled), labels))
            else:
                low, high = rng.low, self._dynamic_high(rng, sampled)
                sampled[rng.name] = trial.suggest_int(rng.name, low, high, step=rng.step, log=rng.log)
        return Config.from_mapping(sampled)

    def _applicable(self, sampled: Mapping[str, KnobValue]) -> Iterator[KnobRange]:
        """The knobs to sample, in order; each one's condition is read from what `sampled` holds by then."""
        for name in SAMPLE_ORDER:
            rng = self.get(name)
            if rng is not None and rng.applies(sampled) and (rng.is_range or rng.offered(sampled)):
                yield rng

    def configurations(self, limit: int = ENUMERATE_LIMIT) -> list[Config] | None:
        """Every configuration `sample` can return, in sampling order; None when there are more
        than `limit` (a space too large to list, which a search never exhausts)."""
        found: list[Config] = []
        pending: list[dict[str, KnobValue]] = [{}]
        while pending:
            partial = pending.pop()
            rng = next((r for r in self._applicable(partial) if r.name not in partial), None)
            if rng is None:
                found.append(Config.from_mapping(partial))
                if len(found) > limit:
                    return None
                continue
            options: Sequence[KnobValue] = rng.offered(partial) if rng.choices else range(
                rng.low, self._dynamic_high(rng, partial) + 1, rng.step)
            pending.extend({**partial, rng.name: value} for value in reversed(options))
        return found

    def lacks(self, config: Config) -> str:
        """The first knob value of `config` this space does not offer ("" when it offers them all)."""
        values = config.as_dict()
        for name, value in config.values:
            rng = self.get(name)
            offered = rng is not None and rng.applies(values) and (
                value in rng.offered(values) if rng.choices else
                rng.low <= int(value) <= self._dynamic_high(rng, values) and (int(value) - rng.low) % rng.step == 0)
            if not offered:
                return f"{name}={value_text(value)}"
        return ""

    def as_run(self, config: Config) -> Config | None:
        """`config` with every knob this space samples set: a knob it leaves unset at its default,
        or its `unset_as` value (what runs then, or the closest), as a sampled trial would hold it.
        None when the space does not offer such a value. A recipe sets only its authors' knobs; a
        sampler that sees them so can tell where in the space the recipe lies."""
        filled = config.as_dict()
        for rng in self._applicable(filled):
            if rng.name in filled:
                continue
            spec = KNOBS[rng.name]
            value = spec.default if spec.default is not None else spec.unset_as
            if value == "max":
                value = self._dynamic_high(rng, filled)
            if value is None:
                return None
            filled[rng.name] = value
        complete = Config.from_mapping(filled)
        return None if self.lacks(complete) else complete

    def params(self, config: Config) -> dict[str, KnobValue]:
        """The Optuna parameters that make a trial sample exactly `config` (choices as their labels)."""
        params: dict[str, KnobValue] = {}
        values = config.as_dict()
        for name, value in config.values:
            rng = self.get(name)
            if rng is not None:
                params[rng.param(values) if rng.choices else name] = value_text(value) if rng.choices else value
        return params

    def _dynamic_high(self, rng: KnobRange, sampled: Mapping[str, KnobValue]) -> int:
        high, other = int(rng.high), SHRINKS_WITH.get(rng.name, "")
        if other in sampled:
            splits = {rng.name, other} <= set(SPLITS_CORES)  # threads x instances fit the cores
            most = self.cores // int(sampled[other]) if splits else int(sampled[other])
            high = min(high, max(rng.low, most))
        return high

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "knobs": {
            k.name: ({"choices": [value_text(c) for c in k.choices]} if k.choices else
                     {"low": k.low, "high": k.high, "step": k.step, "log": k.log})
            | ({"when": {n: list(v) for n, v in k.when}} if k.when else {})
            | ({"value_when": {value: {n: list(v) for n, v in cond} for value, cond in k.value_when}}
               if k.value_when else {})
            for k in self.knobs}}


def shipped_spaces() -> Path:
    """The folder of the search spaces autotune comes with: search_spaces/ at the top of the
    repository, which the wheel installs inside the package, as autotune/search_spaces/
    (pyproject.toml maps the package autotune.search_spaces onto it). A checkout, installed
    editable or only on sys.path, has no such folder in the package: there it is the repository's."""
    package = Path(str(resources.files("autotune")))
    installed = package / "search_spaces"
    return installed if installed.is_dir() else package.parent / "search_spaces"


def find(spec: str) -> Path:
    """`--space` by path, or by name in ./search_spaces or the spaces autotune comes with."""
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    folders = (USER_SPACES, shipped_spaces())
    for folder in folders:
        candidate = folder / f"{spec}.yaml"
        if candidate.is_file():
            return candidate
    names = sorted({p.stem for d in folders for p in d.glob("*.yaml")})
    raise SpaceError(f"no search space {spec!r}; give a .yaml path or one of: {', '.join(names)}")


def load(path: Path, pins: Config | None = None) -> SearchSpace:
    """Read and validate a space file; every problem names the file and the key. `pins` (`--set`):
    a pinned knob's value is one more its dependants' conditions may see (a space of int8_fallback
    alone, with backend=inductor precision=int8 pinned, is one that samples); a pin never makes a
    knob the file offers unsamplable (mkldnn under --set backend=openvino simply does not apply)."""
    where = str(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpaceError(f"cannot read search space {where}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SpaceError(f"cannot read search space {where}: not a text file; give a YAML file like "
                         "search_spaces/default.yaml") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpaceError(f"{where}: not valid YAML{at}: {problem}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("knobs"), dict) or not raw["knobs"]:
        raise SpaceError(f"{where}: expected a mapping `knobs:` with at least one knob, as in "
                         f"search_spaces/default.yaml")
    extra = set(raw) - {"knobs", "description"}
    if extra:
        raise SpaceError(f"{where}: unknown top-level key {sorted(extra)[0]!r}; allowed: knobs, description")
    ranges = tuple(_knob_range(where, str(name), spec) for name, spec in raw["knobs"].items())
    space = SearchSpace(source=where, knobs=ranges)
    _check_conditions(where, space, pins or Config())
    return space


def _knob_range(where: str, name: str, spec: object) -> KnobRange:
    try:
        definition = knob(name)
    except AutotuneError as exc:
        raise SpaceError(f"{where}: knobs.{name}: {exc}") from None
    if isinstance(spec, list):
        spec = {"choices": spec}
    if not isinstance(spec, dict):
        raise SpaceError(f"{where}: knobs.{name}: expected a list of choices or a mapping with "
                         f"choices or low/high")
    when = _when(where, name, spec.get("when"), definition)
    if "choices" in spec and name in ("omp_threads", "instances"):
        raise SpaceError(f"{where}: knobs.{name}: give low/high (they are fitted to the cores), not choices")
    if "choices" in spec:
        _only_keys(where, name, spec, CHOICE_KEYS)
        return KnobRange(name, _choices(where, name, spec["choices"], definition), when=when)
    _only_keys(where, name, spec, RANGE_KEYS)
    if definition.kind != "int":
        raise SpaceError(f"{where}: knobs.{name}: takes choices, not low/high; use "
                         f"choices: [{definition.allowed()}]")
    return _int_range(where, name, spec, definition, when)


def _only_keys(where: str, name: str, spec: Mapping[str, object], allowed: set[str]) -> None:
    extra = sorted(set(spec) - allowed)
    if extra:
        raise SpaceError(f"{where}: knobs.{name}.{extra[0]}: unknown key; allowed: "
                         f"{', '.join(sorted(allowed))}")


def _choices(where: str, name: str, raw: object, definition: Knob) -> tuple[KnobValue, ...]:
    if not isinstance(raw, list) or not raw:
        raise SpaceError(f"{where}: knobs.{name}.choices: expected a non-empty list of "
                         f"{definition.allowed()}")
    try:
        values = tuple(parse(name, v) for v in raw)
    except AutotuneError as exc:
        raise SpaceError(f"{where}: knobs.{name}.choices: {exc}") from None
    return tuple(dict.fromkeys(values))


def _int_range(where: str, name: str, spec: Mapping[str, Any], definition: Knob,
               when: tuple[tuple[str, tuple[str, ...]], ...]) -> KnobRange:
    key = f"{where}: knobs.{name}"
    low, high, step = spec.get("low", definition.low), spec.get("high"), spec.get("step", 1)
    if high is None:
        raise SpaceError(f"{key}.high: missing; give an integer or max")
    for field, value in (("low", low), ("high", high), ("step", step)):
        if not (isinstance(value, int) and not isinstance(value, bool)) and not (field == "high"
                                                                             and value == "max"):
            raise SpaceError(f"{key}.{field}: {value!r} is not an integer" +
                             (" or max" if field == "high" else ""))
    if not definition.low <= low <= definition.high or (
            high != "max" and not definition.low <= high <= definition.high):
        raise SpaceError(f"{key}: low/high must be {definition.allowed()}")
    if high != "max" and low > high:
        raise SpaceError(f"{key}: low {low} is above high {high}")
    if step < 1 or not isinstance(spec.get("log", False), bool):
        raise SpaceError(f"{key}: step must be 1 or more and log true or false")
    if spec.get("log") and (step != 1 or low < 1):
        raise SpaceError(f"{key}: log: true needs step 1 and low 1 or more")
    return KnobRange(name, low=low, high=high, step=step, log=spec.get("log", False), when=when)


def _when(where: str, name: str, raw: object, definition: Knob) -> tuple[tuple[str, tuple[str, ...]], ...]:
    conditions = dict(definition.only_when)
    if raw is None:
        return tuple(conditions.items())
    if not isinstance(raw, dict):
        raise SpaceError(f"{where}: knobs.{name}.when: expected a mapping like {{omp_runtime: intel}}")
    for other, values in raw.items():
        if other not in KNOBS or other == name:
            raise SpaceError(f"{where}: knobs.{name}.when: condition names unknown knob {other!r}; "
                             f"knobs are: {', '.join(KNOBS)}")
        listed = values if isinstance(values, list) else [values]
        try:
            allowed = tuple(value_text(parse(other, v)) for v in listed)
        except AutotuneError as exc:
            raise SpaceError(f"{where}: knobs.{name}.when.{other}: {exc}") from None
        builtin = conditions.get(other)
        conditions[other] = tuple(v for v in allowed if builtin is None or v in builtin)
        if not conditions[other]:
            raise SpaceError(f"{where}: knobs.{name}.when.{other}: {name} applies only with "
                             f"{other}={'/'.join(builtin or ())}")
    return tuple(conditions.items())


def _check_conditions(where: str, space: SearchSpace, pins: Config) -> None:
    pinned = pins.as_dict()
    for rng in space.knobs:
        for other, allowed in rng.when:
            parent = space.get(other)
            possible = ({value_text(c) for c in parent.choices} if parent and parent.choices else
                        {value_text(KNOBS[other].default)} if parent is None else set(allowed))
            possible |= {value_text(pinned[other])} if other in pinned else set()  # a pin adds, never narrows
            if not possible & set(allowed):
                raise SpaceError(f"{where}: knobs.{rng.name}: can never be sampled: it needs "
                                 f"{other}={'/'.join(allowed)}, which the space never picks; add "
                                 f"{other} to the space or remove {rng.name}")


