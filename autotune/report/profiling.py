"""`autotune profile`: where a configuration spends its time, beside the baseline's.

A configuration is profiled through the launch its trial ran (the recorded plan, or the plan an env
file records): the same environment, preloads, binding and instances, run by the same runner.
Instance 0 gets `--profile K --trace PATH` and profiles K forward calls with torch.profiler
(`autotune.child.hotops`) while any other instance runs its timed loop beside it. The child's op
tables are turned into per-call tables here; ranking and comparing them are pure functions.
Op names are shown as the profiler records them: eager runs `aten::` ops, inductor its own
kernels (`cpp_fused_...`) and the ops it calls; no mapping between the two is made up.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.base import tempdirs
from autotune.base.errors import AutotuneError, RunFailed
from autotune.config.knobs import Config
from autotune.deploy import export
from autotune.host.machine import Machine
from autotune.measure import requests
from autotune.measure.plan import LaunchPlan
from autotune.measure.results import RunResult
from autotune.measure.runner import run_plan
from autotune.model.files import write_atomically
from autotune.study import records
from autotune.study.storage import safe_name

TOP_OPS = 10  # rows of the side-by-side table and of the changes
PROFILED_INSTANCE = 0
BASELINE = "baseline"
TRACE_SUFFIX = ".trace.json"
SUMMARY_FILE = "profile.json"
PROFILES = "profiles"  # under studies/ for a study; in the current folder for an env file
MOSTLY_OUTSIDE = 0.5  # above this share of the wall time outside any op, the table says little: a note says so
RUNTIME_SHOWN = ("malloc_library", "openmp_library", "torch_threads", "affinity")
OPEN_WITH = "open a trace in https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load)"

Runner = Callable[[LaunchPlan, float], RunResult]


class ProfileError(AutotuneError):
    """Nothing to profile, or nowhere to write it."""


@dataclass(frozen=True)
class Target:
    """One configuration to profile: what to call it, where its trace goes, what to launch."""

    label: str  # "baseline", "trial 7", "best.env"
    name: str  # the trace file's stem
    config: str  # the knobs, described
    plan: LaunchPlan
    trial: int | None = None


@dataclass(frozen=True)
class Op:
    """One op's cost per forward call."""

    name: str
    self_ms: float
    total_ms: float
    calls: float


@dataclass(frozen=True)
class OpTable:
    """What K profiled forward calls spent, per call; ops by self time, largest first."""

    iterations: int
    wall_ms: float  # the profiled forward call, profiler overhead included
    ops: tuple[Op, ...]

    @property
    def self_ms(self) -> float:
        return sum(op.self_ms for op in self.ops)

    @property
    def outside_ms(self) -> float:
        """Wall time inside no recorded op: Python, the profiler itself, and compiled code that records
        no ops (an AOTInductor package runs its kernels without profiler events)."""
        return max(self.wall_ms - self.self_ms, 0.0)

    def share(self, op: Op) -> float:
        return op.self_ms / self.self_ms if self.self_ms else 0.0

    def by_name(self) -> dict[str, Op]:
        return {op.name: op for op in self.ops}


@dataclass(frozen=True)
class Change:
    """One op's self time per call, before (the baseline) and after (the chosen configuration)."""

    name: str
    before_ms: float
    after_ms: float

    @property
    def delta_ms(self) -> float:
        return self.after_ms - self.before_ms


@dataclass(frozen=True)
class Profiled:
    target: Target
    table: OpTable
    trace: Path
    runtime: Mapping[str, Any]  # what the profiled instance really ran with (libraries, threads, CPUs)


def op_table(payload: Mapping[str, Any]) -> OpTable:
    """The child's totals over K calls (microseconds, counts) as per-call milliseconds; rows of
    the same name (the profiler may split one op by thread or overload) are added up."""
    k = int(payload["iterations"])
    merged: dict[str, tuple[float, float, float]] = {}
    for row in payload["ops"]:
        self_us, total_us, calls = merged.get(str(row["name"]), (0.0, 0.0, 0.0))
        merged[str(row["name"])] = (self_us + float(row["self_cpu_us"]), total_us + float(row["cpu_total_us"]),
                                    calls + float(row["calls"]))
    ops = [Op(name, s / 1e3 / k, t / 1e3 / k, c / k) for name, (s, t, c) in merged.items()]
    return OpTable(k, float(payload["wall_ms"]) / k, tuple(sorted(ops, key=lambda op: (-op.self_ms, op.name))))


def changes(before: OpTable, after: OpTable, count: int = TOP_OPS) -> list[Change]:
    """The `count` ops whose self time per call changed most, either way (an op only one side ran
    counts as 0 ms on the other); an op that did not change at all is not a change."""
    old, new = before.by_name(), after.by_name()
    rows = [Change(name, old[name].self_ms if name in old else 0.0, new[name].self_ms if name in new else 0.0)
            for name in old.keys() | new.keys()]
    return sorted((c for c in rows if c.delta_ms), key=lambda c: (-abs(c.delta_ms), c.name))[:count]


def profiled_plan(plan: LaunchPlan, iterations: int, trace: Path) -> LaunchPlan:
    """The plan with instance 0 profiling instead of timing; every other instance as it was."""
    first, *rest = plan.instances
    flags = ("--profile", str(iterations), "--trace", str(trace))
    return replace(plan, instances=(replace(first, command=(*first.command, *flags)), *rest))


def profile(target: Target, iterations: int, folder: Path, timeout_s: float, runner: Runner = run_plan) -> Profiled:
    """Run the target once with instance 0 profiled; a run that fails is `RunFailed` with its reason."""
    trace = folder / f"{target.name}{TRACE_SUFFIX}"
    result = runner(profiled_plan(target.plan, iterations, trace), timeout_s)
    if not result.ok:
        raise RunFailed(f"profiling {target.label} ({target.config}) failed: {result.reason}")
    metrics = result.instances[PROFILED_INSTANCE].metrics
    return Profiled(target, op_table(metrics["profile"]), trace, metrics.get("runtime", {}))


def study_targets(study: optuna.Study, number: int | None, with_baseline: bool) -> list[Target]:
    """The baseline (unless left out) and the trial asked for, else the one `export` picks."""
    chosen = export.pick_trial(study, number)
    picked = []
    if with_baseline:
        base = records.baseline(study)
        if base is None:
            raise ProfileError(f"study {study.study_name!r} has no completed baseline (PyTorch's defaults) to "
                               f"compare with; use --no-baseline to profile trial {chosen.number} alone")
        picked.append(base)
    if all(t.number != chosen.number for t in picked):
        picked.append(chosen)
    return [_trial_target(t) for t in picked]


def _trial_target(trial: FrozenTrial) -> Target:
    base = bool(trial.user_attrs.get("baseline"))
    return Target(BASELINE if base else f"trial {trial.number}", BASELINE if base else f"trial-{trial.number}",
                  str(trial.user_attrs.get("config", "")), records.plan_of(trial), trial.number)


def env_file_targets(path: Path, machine: Machine, with_baseline: bool) -> list[Target]:
    """The env file's configuration planned for this machine, and PyTorch's defaults for the same
    model, batch size and inputs (unless left out, or the file holds the defaults)."""
    request = requests.exported_request(export.read(path).env)
    name = safe_name(path.stem)
    chosen = Target(path.name, name if name != BASELINE else f"{name}-env", request.config.describe(),
                    requests.make_plan(request, machine))
    if not with_baseline or request.config == Config():
        return [chosen]
    defaults = replace(request, config=Config())
    return [Target(BASELINE, BASELINE, defaults.config.describe(), requests.make_plan(defaults, machine)), chosen]


def study_out(studies_dir: Path, study: optuna.Study) -> Path:
    return studies_dir / PROFILES / safe_name(study.study_name)


def env_file_out(path: Path) -> Path:
    return Path(PROFILES) / safe_name(path.stem)


def check_out(out: Path) -> Path:
    """`out` if it is, or can be made, a writable folder; checked before anything runs, creating nothing."""
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as exc:
        raise ProfileError(f"--out {str(out)!r} is not a writable folder ({exc.strerror}); choose another") from None
    return out


@contextlib.contextmanager
def staging() -> Iterator[Path]:
    """Where the children write their traces until every configuration has been profiled."""
    with tempfile.TemporaryDirectory(prefix=tempdirs.prefix("profile")) as folder:
        yield Path(folder)


def summary(profiled: Sequence[Profiled], out: Path) -> dict[str, Any]:
    """Plain data for `--json`, profile.json and the tables: every op of each configuration, and the
    changes from the first (the baseline) to the last when there are two."""
    moved = [(p, out / p.trace.name) for p in profiled]
    return {
        "iterations": profiled[0].table.iterations,
        "profiled_instance": PROFILED_INSTANCE,
        "out": str(out),
        "summary_file": str(out / SUMMARY_FILE),
        "configurations": [_configuration(p, trace) for p, trace in moved],
        "changed": [{"name": c.name, "before_ms": c.before_ms, "after_ms": c.after_ms, "delta_ms": c.delta_ms}
                    for c in (changes(profiled[0].table, profiled[-1].table) if len(profiled) > 1 else [])],
    }


def _configuration(profiled: Profiled, trace: Path) -> dict[str, Any]:
    target, table = profiled.target, profiled.table
    return {"label": target.label, "trial": target.trial, "config": target.config,
            "instances": len(target.plan.instances), "trace": str(trace),
            "runtime": {key: profiled.runtime.get(key) for key in RUNTIME_SHOWN},
            "wall_ms_per_iteration": table.wall_ms, "self_ms_per_iteration": table.self_ms,
            "outside_ops_ms_per_iteration": table.outside_ms,
            "mostly_outside_ops": table.outside_ms > MOSTLY_OUTSIDE * table.wall_ms,
            "ops": [{"name": op.name, "self_ms": op.self_ms, "share": table.share(op), "total_ms": op.total_ms,
                     "calls": op.calls} for op in table.ops]}


def save(profiled: Sequence[Profiled], out: Path, document: Mapping[str, Any]) -> None:
    """The traces moved into `out` and the summary written beside them (each file whole or not at all)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        for p in profiled:
            shutil.move(p.trace, out / p.trace.name)
        write_atomically(out / SUMMARY_FILE, json.dumps(document, indent=2, default=str) + "\n")
    except OSError as exc:
        raise ProfileError(f"cannot write the profile into {str(out)!r} ({exc.strerror}); choose another --out") \
            from None
