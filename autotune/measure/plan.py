"""Knob values + topology + libraries -> a frozen `LaunchPlan`: what each instance will run.

Pure: nothing here reads `os.environ`, spawns a process or imports torch. The same plan is printed
by `autotune plan`, executed by the runner and stored with every result.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

from autotune.base.errors import TopologyError
from autotune.child.settings import CACHE_DIR, MeasureSettings
from autotune.config.knobs import Config
from autotune.host.libs import Libraries
from autotune.host.topology import PhysicalCore, Topology, format_cpus
from autotune.model import apply
from autotune.model.buckets import Buckets
from autotune.model.cpu import ISA_LIMITS
from autotune.model.knobdefs import PRELOAD
from autotune.model.knobs import KNOBS, ModelKnobs

THREADS = KNOBS["omp_threads"]  # what an instance's threads set, one per core of its own when not set

Binding = Literal["none", "numactl", "taskset", "sched_setaffinity"]

# Variables a child inherits from the parent; everything else (OMP_*, KMP_*, LD_PRELOAD,
# MALLOC_CONF, ...) is dropped so that only the plan decides how the benchmark runs.
INHERITED = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM",
             "TMPDIR", "TEMP", "TMP", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX",
             "CONDA_DEFAULT_ENV", "LD_LIBRARY_PATH", "TORCH_HOME", "SYSTEMROOT")
INHERITED_PREFIXES = ("LC_", "XDG_")
# Variables that change how PyTorch runs: shown by `plan` when the parent has them but the child won't.
TUNING = re.compile(r"^(OMP_|KMP_|GOMP_|MKL_|DNNL_|ONEDNN_|MALLOC_|TCMALLOC_|LD_PRELOAD$|TORCH_|"
                    r"ATEN_|OPENBLAS_)")


@dataclass(frozen=True)
class BenchSpec:
    """What the benchmark child measures; independent of how it is launched."""

    model: str
    item_shape: tuple[int, ...]
    batch_size: int = 1
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    cache_dir: str = CACHE_DIR
    tolerance: float | None = None  # relative error allowed against eager fp32; None: per precision
    import_path: str = ""  # where a `pkg.module:factory` model is imported from
    example_inputs: str = ""  # a torch.save file of the model's inputs, items along dim 0
    task: str = ""  # the head of a transformers model (`hf:`); its token inputs' length is item_shape[0]
    seq_lens: tuple[int, ...] = ()  # sequence-length buckets, each measured (item_shape[0]: the largest)
    seq_len_weights: tuple[float, ...] = ()  # their shares of the requests, summing to 1

    @property
    def buckets(self) -> Buckets | None:
        return Buckets(self.seq_lens, self.seq_len_weights) if self.seq_lens else None
    calibration_batches: int | None = None  # precision=int8: batches observed; None: quantize.CALIBRATION_BATCHES
    eval_data: str = ""  # the user's data (`--eval-data`): int8 calibrates on it; quality is judged on it
    guard_judges: bool = True  # False: the guard records its figures and fails nothing (a quality limit judges)
    eval_metric: str = ""  # `--eval MODULE:FUNCTION`: the user's own quality metric, instead of the built-in one
    eval_direction: str = ""  # `--eval-direction`: higher or lower is better
    eval_import_path: str = ""  # where MODULE is imported from

    @property
    def judged(self) -> bool:
        """Whether a configuration's quality is judged (on the user's data or by the user's metric)."""
        return bool(self.eval_data or self.eval_metric)


@dataclass(frozen=True)
class InstancePlan:
    """One benchmark process: where it runs, what it sees, what it executes."""

    index: int
    cpus: tuple[int, ...]
    numa_node: int | None
    env: Mapping[str, str]
    command: tuple[str, ...]


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the runner executes and the export reproduces, as plain data."""

    config: Config
    bench: BenchSpec
    binding: Binding  # how each instance is pinned to its CPUs ("none": not at all)
    instances: tuple[InstancePlan, ...]
    cleared: tuple[str, ...] = field(default=())

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchPlan:
        """The plan a trial recorded, to run it again exactly (confirmation, compare)."""
        bench = dict(data["bench"])
        bench["item_shape"] = tuple(bench["item_shape"])
        bench["seq_lens"] = tuple(bench.get("seq_lens", ()))
        bench["seq_len_weights"] = tuple(bench.get("seq_len_weights", ()))
        bench["measure"] = MeasureSettings(**bench["measure"])
        if bench.get("tolerance") is not None and bench["tolerance"] < 0:
            bench["tolerance"] = None  # recorded before it was optional: negative meant per precision
        instances = tuple(
            InstancePlan(i["index"], tuple(i["cpus"]), i["numa_node"], dict(i["env"]), tuple(i["command"]))
            for i in data["instances"])
        return cls(Config.from_mapping(data["config"]), BenchSpec(**bench), cast(Binding, data["binding"]), instances,
                   tuple(data.get("cleared", ())))

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.as_dict(),
            "bench": asdict(self.bench),
            "binding": self.binding,
            "cleared": list(self.cleared),
            "instances": [
                {"index": i.index, "cpus": list(i.cpus), "numa_node": i.numa_node,
                 "env": dict(i.env), "command": list(i.command)}
                for i in self.instances
            ],
        }


def stretched(plan: LaunchPlan, parts: int, give_up_above_ms: Sequence[float] = ()) -> LaunchPlan:
    """The same plan with a window `parts` times as long (and as many samples at least), to be cut
    into `parts` consecutive windows of one warmed process (`RunResult.parts`). With
    `give_up_above_ms`, each instance stops after its k-th part's worth (its time and samples)
    when its median latency is above the k-th limit (`autotune.search.pruning.GiveUp`); only the windows
    before the last are checked, since a stop after the last would save nothing."""
    first = plan.bench.measure
    measure = replace(first, duration_s=first.duration_s * parts, min_iterations=first.min_iterations * parts)
    flags = {"--duration": str(measure.duration_s), "--min-iterations": str(measure.min_iterations)}
    limits = tuple(give_up_above_ms)[:parts - 1]
    give_up = () if not limits else (
        "--give-up-above-ms", ",".join(repr(v) for v in limits), "--give-up-after", str(first.duration_s),
        "--give-up-iterations", str(first.min_iterations))
    instances = tuple(replace(i, command=(*_with_flags(i.command, flags), *give_up)) for i in plan.instances)
    return replace(plan, bench=replace(plan.bench, measure=measure), instances=instances)


def _with_flags(command: tuple[str, ...], flags: Mapping[str, str]) -> tuple[str, ...]:
    """`command` with the value after each flag replaced."""
    out = list(command)
    for at, word in enumerate(command[:-1]):
        if word in flags:
            out[at + 1] = flags[word]
    return tuple(out)


def model_knobs(config: Config) -> ModelKnobs:
    """The knobs that change the model itself, as `autotune.apply` and the child take them."""
    return ModelKnobs.from_values(config.as_dict())


def worker_command(python: str, bench: BenchSpec, config: Config) -> tuple[str, ...]:
    """The benchmark child's argv; the runner appends the per-run `--result` and `--ready-fd`."""
    knobs = apply.to_env(model_knobs(config))
    return (
        python, "-m", "autotune.child.worker",
        "--model", bench.model,
        "--item-shape", "x".join(map(str, bench.item_shape)),
        "--batch-size", str(bench.batch_size),
        *(arg for name, var in apply.KNOB_VARS.items() for arg in (f"--{name.replace('_', '-')}", knobs[var])),
        *(("--tolerance", str(bench.tolerance)) if bench.tolerance is not None else ()),
        *(("--calibration-batches", str(bench.calibration_batches))
          if bench.calibration_batches is not None and config.text("precision") == "int8" else ()),
        "--dataloader-workers", config.text("dataloader_workers"),
        "--warmup", str(bench.measure.warmup),
        "--warmup-time", str(bench.measure.warmup_s),
        "--duration", str(bench.measure.duration_s),
        "--min-iterations", str(bench.measure.min_iterations),
        "--cache-dir", bench.cache_dir,
        *(("--import-path", bench.import_path) if bench.import_path else ()),
        *(("--example-inputs", bench.example_inputs) if bench.example_inputs else ()),
        *(("--eval-data", bench.eval_data) if bench.eval_data else ()),
        *(() if bench.guard_judges else ("--guard-records-only",)),
        *(("--eval-metric", bench.eval_metric, "--eval-direction", bench.eval_direction, "--eval-import-path",
           bench.eval_import_path) if bench.eval_metric else ()),
        *(("--task", bench.task) if bench.task else ()),
        *(("--seq-lens", bench.buckets.text(), "--seq-len-weights", bench.buckets.weights_text())
          if bench.buckets else ()),
    )


def plan_launch(
    config: Config,
    bench: BenchSpec,
    topology: Topology,
    libs: Libraries,
    python: str,
    binder: Binding | None = None,
    parent_env: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """The whole launch. `binder` forces a binding tool (e.g. numactl when planning elsewhere)."""
    groups = _placement(config, topology)
    binding: Binding = "none" if groups is None else (binder or best_binder(libs))
    shared_env = {**isa_limits(parent_env or {}), **_runtime_env(config, libs), **serving_env(config, bench)}
    argv = worker_command(python, bench, config)
    instances = []
    for index, cores in enumerate(groups or [None]):
        cpus = tuple(c.cpus[0] for c in cores) if cores else tuple(sorted(topology.allowed))
        nodes = sorted({c.node for c in cores}) if cores else []
        env = dict(shared_env)
        if cores and not set(THREADS.variables) & env.keys():  # one thread per core of its own
            env |= THREADS.environment(len(cores))
        prefix = bind_prefix(binding, libs, cpus, nodes)
        instances.append(InstancePlan(index, cpus, nodes[0] if len(nodes) == 1 else None,
                                      env, prefix + argv))
    cleared = tuple(sorted(k for k in (parent_env or {}) if TUNING.match(k) and k not in shared_env))
    return LaunchPlan(config, bench, binding, tuple(instances), cleared)


def isa_limits(parent_env: Mapping[str, str]) -> dict[str, str]:
    """The instruction-set limits the parent runs under (`ONEDNN_MAX_CPU_ISA=AVX2`, ...): part of
    what this machine is (its host class, the kernel probe, every artifact's key), so every child
    runs under them too, and an export carries them."""
    return {name: parent_env[name] for name in ISA_LIMITS if parent_env.get(name)}


def _runtime_env(config: Config, libs: Libraries) -> dict[str, str]:
    """What the process knobs set, as their rows say (`Knob.sets`, `Knob.needs`): the variables of
    each knob with a value, then LD_PRELOAD with every library they preload, in the table's order."""
    env: dict[str, str] = {}
    preload: list[Path] = []
    for name, knob in KNOBS.items():
        value = config.get(name)
        if value is None or knob.model:
            continue
        env |= knob.environment(value)
        preload += [libs.require(library) for library in knob.preloads(value)]
    if preload:
        env[PRELOAD] = ":".join(str(p) for p in preload)
    return env


# oneDNN keeps 1024 primitives (a kernel JIT-compiled for one shape) by default. A model with a dynamic
# sequence length has a few per length (BERT-base int8: 4, one per distinct Linear shape); a stream over
# every length up to 384 tokens needs ~1540 and, in 1024, recompiled them as it went: requests of 1-32
# tokens took 1.29x as long as with room for all (benchmarks/RESULTS.md, "A dynamic model serving every
# length"). Room for 16 per length.
PRIMITIVE_CACHE_VAR = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
PRIMITIVES_PER_LENGTH, PRIMITIVE_CACHE_DEFAULT = 16, 1024


def serving_env(config: Config, bench: BenchSpec) -> dict[str, str]:
    """What a model that runs each request at its own length (shapes=dynamic) needs to serve every
    length of its buckets: a oneDNN primitive cache with room for them all."""
    if config.get("shapes") != "dynamic" or not bench.seq_lens:
        return {}
    return {PRIMITIVE_CACHE_VAR: str(max(PRIMITIVE_CACHE_DEFAULT, PRIMITIVES_PER_LENGTH * max(bench.seq_lens)))}


def _placement(config: Config, topology: Topology) -> list[list[PhysicalCore]] | None:
    """Disjoint whole physical cores per instance, or None when nothing asks for binding."""
    cores = topology.usable_cores
    threads = config.get("omp_threads")
    count = config.get("instances")
    total = int(threads or 1) * int(count or 1)
    if total > len(cores):
        what = f"omp_threads={threads or 1} x instances={count or 1} = {total} threads"
        raise TopologyError(
            f"{what} is above the {len(cores)} usable physical cores "
            f"(CPUs {format_cpus(topology.allowed)}); lower omp_threads or instances"
        )
    if count is None:
        return None
    per = int(threads) if threads is not None else len(cores) // int(count)
    return _first_fit(cores, int(count), per)


def _first_fit(cores: Sequence[PhysicalCore], count: int, per: int) -> list[list[PhysicalCore]]:
    """Fill NUMA nodes in order; an instance spans nodes only when no node has room for it whole."""
    free: dict[int, list[PhysicalCore]] = {}
    for core in cores:
        free.setdefault(core.node, []).append(core)
    groups = []
    for _ in range(count):
        node = next((n for n, left in free.items() if len(left) >= per), None)
        if node is not None:
            taken, free[node] = free[node][:per], free[node][per:]
        else:
            pool = [c for left in free.values() for c in left]
            taken = pool[:per]
            free = {n: [c for c in left if c not in taken] for n, left in free.items()}
        groups.append(taken)
    return groups


def best_binder(libs: Libraries) -> Binding:
    if libs.numactl_usable:
        return "numactl"
    return "taskset" if libs.taskset is not None else "sched_setaffinity"


def bind_prefix(binding: Binding, libs: Libraries, cpus: Sequence[int], nodes: Sequence[int]) -> tuple[str, ...]:
    """The argv prefix that binds a command to `cpus` (and their NUMA memory, with numactl)."""
    cpu_list = format_cpus(cpus)
    if binding == "numactl":
        tool = str(libs.numactl or "numactl")
        membind = (f"--membind={','.join(map(str, nodes))}",) if nodes else ()
        return (tool, f"--physcpubind={cpu_list}", *membind)
    if binding == "taskset":
        return (str(libs.taskset or "taskset"), "-c", cpu_list)
    return ()


def child_environment(parent_env: Mapping[str, str], plan_env: Mapping[str, str]) -> dict[str, str]:
    """The exact environment of a child: allow-listed parent variables plus the plan's."""
    env = {k: v for k, v in parent_env.items()
           if k in INHERITED or k.startswith(INHERITED_PREFIXES)}
    env.update(plan_env)
    return env
