"""A loaded search space fitted to one machine: what it lacks (libraries, runtimes) dropped with a
note, the backends and precisions its kernel probe refused dropped with the probe's words, ranges
of cores capped at its cores, and the knobs a user pinned with `--set`; and how a study's recorded
space differs from this host's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from autotune.config.knobs import KNOBS, VALUE_CONDITIONS, Config, KnobValue, conditions, knob
from autotune.config.space import SAMPLE_ORDER, KnobRange, SearchSpace, SpaceError
from autotune.host.capabilities import Refused
from autotune.host.libs import LIBRARIES
from autotune.model import backends
from autotune.model.backends import RUNTIME_OF
from autotune.model.knobdefs import value_text
from autotune.model.knobs import CORE_BOUND, LINEAR_INT8, PRECISIONS, SPLITS_CORES

# Which library (the knob's `needs`) or runtime (the backend's packages) each choice needs, so a
# machine without it never samples it.
NEEDS: dict[tuple[str, str], str] = {
    **{(name, value): library for name, k in KNOBS.items() for value, library in k.needs},
    **{("backend", b.name): b.name for b in backends.REGISTRY if b.packages or backends.needs(b.name, True)}}


def _missing_runtime(backend: backends.Backend) -> str:
    """What is missing when a backend's runtime is, for running a model and for generating text."""
    forward, generation = backend.packages, backends.needs(backend.name, generates=True)
    said = [f"{p.name} is not installed; install it with {p.install}" for p in (forward, generation) if p]
    return f"{said[0]} (to generate text: {generation.install})" if forward and generation else said[0]


# What is missing when a need is not met, and what to do about it.
MISSING = {**{name: f"{name} is not installed ({spec.install})" for name, spec in LIBRARIES.items()},
           **{need: _missing_runtime(backends.get(need)) for (knob, _), need in NEEDS.items() if knob == "backend"}}


def runtimes_installed(generates: bool = False) -> dict[str, bool]:
    """Whether each backend's runtime (OpenVINO, ONNX Runtime, llama.cpp) is installed, for running a
    model or for generating text (`generates`): `available`'s entries for them."""
    return {b.name: backends.installed(b.name, generates) for b in backends.REGISTRY
            if b.packages or backends.needs(b.name, True)}


def adapt(space: SearchSpace, cores: int, available: Mapping[str, bool]) -> SearchSpace:
    """Fit a space to a machine: drop choices whose library is missing, cap ranges at the cores."""
    notes: list[str] = []
    adapted = []
    for rng in space.knobs:
        if rng.choices:
            keep = tuple(c for c in rng.choices if available.get(NEEDS.get((rng.name, value_text(c)), ""), True))
            for dropped in (value_text(c) for c in rng.choices if c not in keep):
                notes.append(f"{rng.name}={dropped} dropped: {MISSING[NEEDS[(rng.name, dropped)]]}")
            if not keep:
                raise SpaceError(f"{space.source}: knobs.{rng.name}: no choice is available on this "
                                 f"machine ({'; '.join(notes)}); install one or remove the knob")
            adapted.append(replace(rng, choices=keep))
        else:
            adapted.append(_cap(space.source, rng, cores))
    capped = _fit_instances(tuple(adapted), cores)
    return SearchSpace(space.source, capped, tuple(notes), cores)


def for_model(space: SearchSpace, linear_heavy: bool) -> SearchSpace:
    """int8_dynamic and int8_weight_only quantize Linear layers alone: a model whose work is not in
    them (a torchvision CNN) is not offered them; a trial of it would measure the same model."""
    found = next((rng for rng in space.knobs if rng.name == "precision"), None)
    if linear_heavy or found is None or not set(found.choices) & set(LINEAR_INT8):
        return space
    keep = tuple(c for c in found.choices if c not in LINEAR_INT8)
    ranges = tuple(replace(rng, choices=keep) if rng is found else rng for rng in space.knobs)
    note = (f"precision={'/'.join(c for c in found.choices if c in LINEAR_INT8)} dropped: they quantize Linear "
            f"layers, and this model's work is in its convolutions")
    return SearchSpace(space.source, ranges, (*space.notes, note), space.cores)


# Knobs of one kind of model alone: a causal LM's generation, or the other models' forward calls.
GENERATION_KNOBS = ("kv_cache", "attention")
FORWARD_KNOBS = ("mkldnn", "weight_cache", "memory_format", "shapes", "ov_hint", "ov_streams", "ov_pinning",
                 "ort_optimization", "ort_execution", "ort_inter_threads", "dataloader_workers")


def task_refusals(generates: bool) -> dict[tuple[str, str], str]:
    """(backend, precision) -> why a model of this kind is not run so: a backend generates text with
    its `generates` precisions (llama.cpp with nothing else), the other models run with its
    `precisions`. Read like the probe's refusals (`for_probe`, `pin`)."""
    found: dict[tuple[str, str], str] = {}
    for backend in backends.REGISTRY:
        taken = backend.generates if generates else backend.precisions
        for precision in PRECISIONS:
            if precision in taken:
                continue
            if not taken:
                found[(backend.name, precision)] = ("it does not generate text" if generates else
                                                    "it runs --task generate alone")
            else:
                found[(backend.name, precision)] = (f"it generates text with {'/'.join(taken)}" if generates else
                                                    "int4 weights are for --task generate" if
                                                    precision == "int4_weight_only" else
                                                    f"it runs {'/'.join(taken)}")
    return found


def check_task_knobs(config: Config, generates: bool) -> None:
    """A knob set for the other kind of model (a KV cache for an image model, mkldnn for generation) is refused."""
    other = FORWARD_KNOBS if generates else GENERATION_KNOBS
    pinned = [name for name in other if name in config.as_dict()]
    if pinned:
        what = "--task generate" if generates else "a model that is not generating (--task generate)"
        raise SpaceError(f"--set {pinned[0]} does not apply to {what}; drop it")


def for_task(space: SearchSpace, generates: bool, pins: Config) -> SearchSpace:
    """A causal LM generating text is searched over the generation knobs (KV cache, attention), not
    the forward-call ones (mkldnn, layouts, length buckets, the peers' graph settings, DataLoader
    workers); any other model the other way round. A pin of the other kind is refused."""
    check_task_knobs(pins, generates)
    other = FORWARD_KNOBS if generates else GENERATION_KNOBS
    return SearchSpace(space.source, tuple(rng for rng in space.knobs if rng.name not in other), space.notes,
                       space.cores)


def for_buckets(space: SearchSpace, bucketed: bool) -> SearchSpace:
    """`shapes` chooses how a compiled model serves sequence-length buckets (`--seq-lens`): without
    buckets there is nothing to choose, and the knob is not searched."""
    if bucketed or space.get("shapes") is None:
        return space
    return SearchSpace(space.source, tuple(rng for rng in space.knobs if rng.name != "shapes"), space.notes,
                       space.cores)


def for_probe(space: SearchSpace, refused: Refused, silent: Refused | None = None) -> SearchSpace:
    """The space without what this CPU's kernel probe refused: a backend whose fp32 failed, a
    precision no backend of the space runs well here (dropped), or runs well on some backends only
    (offered with those alone). Every note gives the probe's reason. `silent`: pairs left out without
    a note (what the model's task does not run: `task_refusals`)."""
    quiet = silent or {}
    notes: list[str] = []
    ranges = {rng.name: rng for rng in space.knobs}
    if "backend" in ranges:
        ranges["backend"] = _drop_backends(space.source, ranges["backend"], refused, notes, quiet)
    backends = tuple(map(value_text, ranges["backend"].choices)) if "backend" in ranges else (
        value_text(KNOBS["backend"].default),)
    if "precision" in ranges:
        ranges["precision"] = _fit_precisions(space.source, ranges["precision"], backends, refused, notes, quiet)
    return SearchSpace(space.source, tuple(ranges.values()), (*space.notes, *notes), space.cores)


def _drop_backends(source: str, rng: KnobRange, refused: Refused, notes: list[str], quiet: Refused) -> KnobRange:
    rng = replace(rng, choices=tuple(b for b in rng.choices if (value_text(b), "fp32") not in quiet))
    keep = tuple(b for b in rng.choices if (value_text(b), "fp32") not in refused)
    notes += [f"backend={value_text(b)} dropped: {refused[(value_text(b), 'fp32')]}"
              for b in rng.choices if b not in keep]
    if not keep:
        raise SpaceError(f"{source}: knobs.backend: no backend runs on this machine ({'; '.join(notes)})")
    return replace(rng, choices=keep)


def _fit_precisions(source: str, rng: KnobRange, backends: tuple[str, ...], refused: Refused,
                    notes: list[str], quiet: Refused) -> KnobRange:
    keep, only = [], []
    for value in rng.choices:
        text = value_text(value)
        allowed = dict(VALUE_CONDITIONS.get(("precision", text), ())).get("backend", backends)
        present = tuple(b for b in backends if b in allowed)
        candidates = tuple(b for b in present if (b, text) not in quiet)
        if present and not candidates:  # what this kind of model does not run: left out without a note
            continue
        fine = tuple(b for b in candidates if (b, text) not in refused)
        if candidates and not fine:
            notes.append(f"precision={text} dropped: {_reasons(candidates, text, refused)}")
            continue
        keep.append(value)
        if len(fine) < len(present):
            only.append((text, (("backend", fine),)))
        if len(fine) < len(candidates):
            refusing = tuple(b for b in candidates if b not in fine)
            notes.append(f"precision={text} only with backend={'/'.join(fine)}: with "
                         f"{'/'.join(refusing)}, {_reasons(refusing, text, refused)}")
    if not keep:
        raise SpaceError(f"{source}: knobs.precision: no choice runs on this machine ({'; '.join(notes)})")
    return replace(rng, choices=tuple(keep), value_when=tuple(only))


def _reasons(names: tuple[str, ...], precision: str, refused: Refused) -> str:
    """The probe's reasons, once per runtime (inductor and eager share PyTorch's), named where several."""
    said = {RUNTIME_OF[b]: refused[(b, precision)] for b in names}
    if len(said) == 1:
        return next(iter(said.values()))
    labels = {b.runtime: b.label for b in backends.REGISTRY}
    return "; ".join(f"{labels[runtime]}: {why}" for runtime, why in said.items())


def pin(space: SearchSpace, pins: Config, available: Mapping[str, bool],
        refused: Refused | None = None) -> SearchSpace:
    """The adapted space with each pinned knob fixed to its value (added where the space lacks it),
    and the knobs its condition depends on narrowed to the values that keep it applying, so that
    every sampled configuration holds the pins. A pin the machine or the space cannot honour is
    one error naming it."""
    if not pins.values:
        return space
    for name, value in pins.values:
        _check_pin_fits_machine(name, value, space.cores, available)
    _check_pins_run_here(pins, refused or {})
    ranges = {rng.name: rng for rng in space.knobs}
    for name, value in pins.values:
        ranges[name] = _pinned_range(space, name, value)
    for name, value in pins.values:
        for other, allowed in conditions(name, value) + _machine_condition(space, name, value):
            if other not in pins.as_dict() and other in ranges:
                ranges[other] = _narrowed(space.source, ranges[other], allowed, f"{name}={pins.text(name)}")
    _check_pinned_cores(pins, ranges, space.cores)
    ordered = tuple(ranges[name] for name in SAMPLE_ORDER if name in ranges)
    note = f"pinned: {pins.describe()} (searched in every trial but the baseline, which stays PyTorch's defaults)"
    return SearchSpace(space.source, _fit_instances(ordered, space.cores), (*space.notes, note), space.cores)


def _machine_condition(space: SearchSpace, name: str, value: KnobValue) -> tuple[tuple[str, tuple[str, ...]], ...]:
    rng = space.get(name)
    return dict(rng.value_when).get(value_text(value), ()) if rng is not None else ()


def _check_pins_run_here(pins: Config, refused: Refused) -> None:
    """A pinned precision (with the pinned backend, or PyTorch's) the probe refused: its reason."""
    pinned = pins.as_dict()
    if "precision" not in pinned:
        return
    backend, precision = value_text(pins.get("backend")), value_text(pinned["precision"])
    why = refused.get((backend, precision))
    if why:
        raise SpaceError(f"--set precision={precision} cannot run well here with backend={backend}: {why}; "
                         f"drop that --set (or `autotune doctor --probe` to measure again)")


def _check_pin_fits_machine(name: str, value: KnobValue, cores: int, available: Mapping[str, bool]) -> None:
    need = NEEDS.get((name, value_text(value)))
    if need and not available.get(need, True):
        raise SpaceError(f"--set {name}={value_text(value)} cannot run here: {MISSING[need]}; drop that --set")
    if name in CORE_BOUND and int(value) > cores:
        raise SpaceError(f"--set {name}={value} is above the {cores} usable physical cores of this machine; "
                         f"use at most {cores}")


def _pinned_range(space: SearchSpace, name: str, value: KnobValue) -> KnobRange:
    rng = space.get(name)
    definition = knob(name)
    if rng is not None and not _offers(rng, value):
        offered = "/".join(value_text(c) for c in rng.choices) if rng.choices else f"{rng.low}..{rng.high}"
        raise SpaceError(f"--set {name}={value_text(value)} is outside the search space {space.source}, which "
                         f"offers {name} {offered}; pin one of those, or widen the space (--space)")
    when = rng.when if rng is not None else definition.only_when
    if definition.kind == "int" and name in SPLITS_CORES:
        return KnobRange(name, low=int(value), high=int(value), when=when)
    return KnobRange(name, choices=(value,), when=when, value_when=rng.value_when if rng is not None else ())


def _offers(rng: KnobRange, value: KnobValue) -> bool:
    if rng.choices:
        return value in rng.choices
    return rng.low <= int(value) <= int(rng.high) and (int(value) - rng.low) % rng.step == 0


def _narrowed(source: str, rng: KnobRange, allowed: tuple[str, ...], because: str) -> KnobRange:
    if rng.is_range:
        return rng
    keep = tuple(c for c in rng.choices if value_text(c) in allowed)
    if not keep:
        raise SpaceError(f"--set {because} needs {rng.name}={'/'.join(allowed)}, which the search space "
                         f"{source} never picks; pin {rng.name} too, or drop that --set")
    return replace(rng, choices=keep)


def _check_pinned_cores(pins: Config, ranges: Mapping[str, KnobRange], cores: int) -> None:
    """Pinned threads x instances (`SPLITS_CORES`; a pinned one with the others' smallest values) must
    fit the cores."""
    pinned = pins.as_dict()
    if not set(SPLITS_CORES) & pinned.keys():
        return
    each = {n: int(pinned[n]) if n in pinned else (ranges[n].low if n in ranges else 1) for n in SPLITS_CORES}
    if math.prod(each.values()) > cores:
        split = " x ".join(f"{n}={v}" for n, v in each.items())
        raise SpaceError(f"--set {pins.describe()}: {split} need more than the {cores} usable physical cores of "
                         f"this machine; pin fewer")


def _cap(source: str, rng: KnobRange, cores: int) -> KnobRange:
    if rng.name not in CORE_BOUND:
        return replace(rng, high=int(rng.high) if rng.high != "max" else KNOBS[rng.name].high)
    if rng.low > cores:
        raise SpaceError(f"{source}: knobs.{rng.name}.low: {rng.low} is above the {cores} usable "
                         f"physical cores of this machine; use at most {cores}")
    high = cores if rng.high == "max" else min(int(rng.high), cores)
    return replace(rng, high=high)


def _fit_instances(ranges: tuple[KnobRange, ...], cores: int) -> tuple[KnobRange, ...]:
    """Of the knobs that split the cores (`SPLITS_CORES`: threads x instances), none so high that
    the others' smallest values no longer fit (instances never so many that one thread each does not)."""
    lows = {r.name: r.low for r in ranges if r.name in SPLITS_CORES and r.is_range}
    room = {name: cores // math.prod(low for other, low in lows.items() if other != name) for name in lows}
    return tuple(replace(r, high=max(r.low, min(int(r.high), room[r.name]))) if r.name in lows else r for r in ranges)


def recorded_differs(recorded: Mapping[str, Any], mine: Mapping[str, Any], cores_may_differ: bool = False) -> str:
    """How this host's space (`to_json`) differs from the one a study recorded: "" when it may
    resume the study. A host of another class (`--allow-mixed`) may cap the core-bound knobs at
    its own cores; its choices must still be the study's (Optuna keeps one set per parameter)."""
    theirs, ours = dict(recorded["knobs"]), dict(mine["knobs"])
    if cores_may_differ:
        for knobs in (theirs, ours):
            for name in CORE_BOUND:
                if name in knobs:
                    knobs[name] = {k: v for k, v in knobs[name].items() if k != "high"}
    if theirs == ours:
        return ""
    for name in sorted(set(theirs) | set(ours)):
        if theirs.get(name) != ours.get(name):
            return (f"{name} is {_shown_knob(theirs.get(name))} in the study and {_shown_knob(ours.get(name))} "
                    f"on this host")
    return "the knobs differ"


def _shown_knob(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "not searched"
    if "choices" in entry:
        return "/".join(entry["choices"])
    return f"{entry.get('low')}..{entry.get('high', 'its cores')}"
