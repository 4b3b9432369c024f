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
from autotune.child.knobs import PEER_BACKENDS
from autotune.config.knobs import Config, KnobValue
from autotune.config.space import SearchSpace
from autotune.host.capabilities import Refused
from autotune.host.topology import Topology


@dataclass(frozen=True)
class Recipe:
    name: str
    config: Config

    @property
    def peer(self) -> bool:
        """Another runtime's recipe (OpenVINO, ONNX Runtime) rather than an expert's for PyTorch."""
        return self.config.get("backend") in PEER_BACKENDS


def _seed(cores: int) -> dict[str, KnobValue]:
    """The seed write-up (PyTorch 1.x best known methods): mkldnn layout, weight cache, threads =
    physical cores, Intel OpenMP with compact affinity, jemalloc, bound to the cores."""
    return {"mkldnn": True, "weight_cache": True, "omp_threads": cores, "omp_runtime": "intel",
            "kmp_affinity": "compact", "kmp_blocktime": 1, "allocator": "jemalloc", "instances": 1}


def _launcher(cores: int) -> dict[str, KnobValue]:
    """`python -m torch.backends.xeon.run_cpu`: Intel OpenMP (compact, KMP_BLOCKTIME=1), jemalloc,
    threads = physical cores, bound with numactl."""
    return {"omp_runtime": "intel", "kmp_affinity": "compact", "kmp_blocktime": 1, "allocator": "jemalloc",
            "omp_threads": cores, "instances": 1}


COMPILE = {"backend": "inductor", "memory_format": "channels_last"}
COMPILE_BF16 = {**COMPILE, "precision": "bf16"}
# Vendors' CPU inference guides put int8 first for throughput; offered wherever the probe runs it well.
COMPILE_INT8 = {**COMPILE, "precision": "int8"}


# Each runtime at its own defaults (OpenVINO's LATENCY hint, ONNX Runtime's full graph optimization),
# then OpenVINO's bf16 inference precision where its probe runs bf16 well (as the expert bf16 recipe;
# OpenVINO does not always pick it by itself: on an AVX-512 EPYC without AMX its defaults ran fp32) and
# its int8 through NNCF where its probe runs int8 (as the expert int8 recipe).
PEERS = {"openvino": "OpenVINO defaults (LATENCY hint)", "onnxruntime": "ONNX Runtime defaults"}
PEER_BF16 = {"openvino": "OpenVINO bf16"}
PEER_INT8 = {"openvino": "OpenVINO int8 (NNCF)"}


def peer_recipes(installed: Mapping[str, bool], refused: Refused) -> list[Recipe]:
    """The peer recipes of the runtimes installed here (`installed`: backend -> its packages are),
    but those this CPU's probe refused (`refused`: (backend, precision) -> why)."""
    found = []
    for backend in (b for b in PEER_BACKENDS if installed.get(b, False) and (b, "fp32") not in refused):
        found.append(Recipe(PEERS[backend], Config.from_mapping({"backend": backend})))
        for names, precision in ((PEER_BF16, "bf16"), (PEER_INT8, "int8")):
            if backend in names and (backend, precision) not in refused:
                found.append(Recipe(names[backend], Config.from_mapping({"backend": backend, "precision": precision})))
    return found


def recipes(topology: Topology, objective: str, refused: Refused | None = None,
            installed: Mapping[str, bool] | None = None) -> list[Recipe]:
    """The known recipes for this machine and objective, in the order a search runs them: the peer
    recipes of the runtimes `installed` (backend -> whether its packages are; none when None), then
    the experts'; a recipe whose precision this CPU's probe refused (`refused`) is not among them."""
    cores, refused = len(topology.usable_cores), refused or {}
    experts = [Recipe("seed", Config.from_mapping(_seed(cores))),
               Recipe("pytorch-launcher", Config.from_mapping(_launcher(cores))),
               Recipe("compile+channels_last", Config.from_mapping(COMPILE))]
    if ("inductor", "bf16") not in refused:
        experts.append(Recipe("compile+bf16+channels_last", Config.from_mapping(COMPILE_BF16)))
    if ("inductor", "int8") not in refused:
        experts.append(Recipe("compile+int8+channels_last", Config.from_mapping(COMPILE_INT8)))
    found = []
    for group in (peer_recipes(installed or {}, refused), experts):
        found += group + ([_per_node(r, topology) for r in group] if objective != "latency" else [])
    return found


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
