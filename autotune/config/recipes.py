"""The recipes experts already use, as configurations: a search runs the ones that fit the machine
and the space right after the baseline, so that it cannot end worse than them and can say by how
much its winner beats the best of them.

A recipe sets only the knobs its authors set; everything else stays at PyTorch's default, as when
they run it. The throughput variants add one instance per NUMA node (or socket), each bound to its
own cores, as PyTorch's launcher does in its throughput mode.

The peer recipes come first: the other runtimes a user would pick instead (OpenVINO, ONNX Runtime)
at their own defaults, where their packages are installed, so that a study states its winner
against the best of them as well as against the best expert recipe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotune.base.errors import ConfigError
from autotune.config.knobs import Config, KnobValue
from autotune.config.space import SearchSpace
from autotune.host.capabilities import Refused
from autotune.host.topology import Topology
from autotune.model import backends


@dataclass(frozen=True)
class Recipe:
    name: str
    config: Config

    @property
    def peer(self) -> bool:
        """Another runtime's recipe (OpenVINO, ONNX Runtime) rather than an expert's for PyTorch."""
        return backends.get(str(self.config.get("backend"))).peer


def recipes(topology: Topology, objective: str, refused: Refused | None = None,
            installed: Mapping[str, bool] | None = None, generates: bool = False) -> list[Recipe]:
    """The known recipes for this machine and objective, in the order a search runs them: those of
    the peer runtimes `installed` (backend -> whether its packages are; none when None), then the
    experts' for PyTorch, each backend's in the registry's order (`Backend.recipes`, or for a causal
    LM generating text, `Backend.generation_recipes`); a recipe whose
    backend and precision this CPU's probe refused (`refused`) is not among them."""
    cores, refused = len(topology.usable_cores), refused or {}
    offered = [Recipe(name, Config.from_mapping(values)) for backend in backends.REGISTRY
               if not backends.needs(backend.name, generates) or (installed or {}).get(backend.name, False)
               for name, values in (backend.generation_recipes(cores) if generates else backend.recipes(cores))
               if not _refused(values, refused)]
    found = []
    for group in ([r for r in offered if r.peer], [r for r in offered if not r.peer]):
        found += group + ([_per_node(r, topology) for r in group] if objective != "latency" else [])
    return found


def _refused(values: Mapping[str, KnobValue], refused: Refused) -> bool:
    backend = str(values.get("backend", "eager"))
    return (backend, "fp32") in refused or (backend, str(values.get("precision", "fp32"))) in refused


def _per_node(recipe: Recipe, topology: Topology) -> Recipe:
    """The same recipe with one bound instance per NUMA node (or socket, where nodes are unknown)."""
    cores = len(topology.usable_cores)
    nodes = len({c.node for c in topology.usable_cores})
    nodes = nodes if nodes > 1 else max(1, len({c.socket for c in topology.usable_cores}))
    values = dict(recipe.config.values) | {"instances": nodes, "omp_threads": max(1, cores // nodes)}
    return Recipe(f"{recipe.name}, one instance per node", Config.from_mapping(values))


NO_PINS = Config()


def fitting(candidates: list[Recipe], space: SearchSpace, pins: Config = NO_PINS) -> tuple[tuple[Recipe, ...], str]:
    """The recipes whose every knob value the space offers, with the pinned knobs added (a recipe
    that sets a pinned knob otherwise is not that recipe any more), and one note naming those left out."""
    kept, left_out = [], []
    for recipe in candidates:
        merged = _with_pins(recipe, pins)
        missing = space.lacks(recipe.config) or (space.lacks(merged.config) if merged else "a pinned knob's condition")
        if missing or merged is None:
            left_out.append(f"{recipe.name} ({missing})")
        else:
            kept.append(merged)
    note = (f"recipes not run, since {space.source}{' with the pins' if pins.values else ''} does not offer a "
            f"knob value they set: {', '.join(left_out)}")
    return tuple(kept), note if left_out else ""


def _with_pins(recipe: Recipe, pins: Config) -> Recipe | None:
    """The recipe with the pins added; None when the two together break a knob's condition."""
    if not pins.values:
        return recipe
    try:
        return Recipe(recipe.name, Config.from_mapping(recipe.config.as_dict() | pins.as_dict()))
    except ConfigError:
        return None
