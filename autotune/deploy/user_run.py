"""`autotune run`: the user's own program under an exported configuration.

Each recorded instance becomes one process of the user's command with the file's environment
(as `source` would give it), bound to the recorded CPUs, dying with autotune.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from autotune.base import tempdirs
from autotune.base.errors import AutotuneError
from autotune.host.libs import Libraries
from autotune.host.topology import Topology, format_cpus
from autotune.measure.children import kill_group
from autotune.measure.plan import Binding, best_binder, bind_prefix
from autotune.model import apply, envfile
from autotune.model.errors import ApplyError
from autotune.model.knobs import ModelKnobs


@dataclass(frozen=True)
class EnvFile:
    """An exported configuration as `autotune run` needs it."""

    env: dict[str, str]
    unset: tuple[str, ...]
    instances: int
    cpus: tuple[tuple[int, ...], ...]
    nodes: tuple[int | None, ...]
    binding: Binding


@dataclass(frozen=True)
class UserLaunch:
    """One instance of the user's command: argv, exact environment, CPUs to bind before exec."""

    argv: tuple[str, ...]
    env: dict[str, str]
    affinity: tuple[int, ...]


def check_runnable(env_file: EnvFile, source: Path, program: str, topology: Topology) -> None:
    """The program exists, the file's CPUs are ones this process may use, and its model knobs
    are ones this machine can apply."""
    try:
        chosen = apply.from_env(env_file.env, str(source))
        if chosen is not None:
            chosen.knobs.check()
    except ApplyError as exc:
        raise AutotuneError(str(exc)) from None
    if shutil.which(program) is None and not Path(program).is_file():
        raise AutotuneError(f"command not found: {program!r}; give the program to run after --")
    outside = {c for cpus in env_file.cpus for c in cpus} - topology.allowed
    if env_file.binding != "none" and outside:
        raise AutotuneError(f"{source} binds CPUs {format_cpus(outside)}, which this process may not use "
                            f"here; export a study made on this machine")


def user_launches(env_file: EnvFile, command: Sequence[str], libs: Libraries,
                  parent_env: Mapping[str, str]) -> list[UserLaunch]:
    """The user's command per instance, with the exported env and core binding.

    The environment is what `source` of the file gives: the user's own without the variables the
    file unsets (those a knob can set), plus the file's exports and AUTOTUNE_INSTANCE_INDEX, so
    that instances can shard work. The shell's other variables (OPENBLAS_CORETYPE keeps some
    OpenBLAS builds from crashing) stay the user's.
    """
    base = {k: v for k, v in parent_env.items() if k not in env_file.unset}
    binding: Binding = "none" if env_file.binding == "none" else best_binder(libs)
    launches = []
    for index in range(env_file.instances):
        cpus = env_file.cpus[index]
        node = env_file.nodes[index]
        env = {**base, **env_file.env, envfile.INSTANCE_INDEX_VAR: str(index)}
        prefix = bind_prefix(binding, libs, cpus, [] if node is None else [node]) if cpus else ()
        affinity = cpus if binding == "sched_setaffinity" else ()
        launches.append(UserLaunch((*prefix, *command), env, affinity))
    return launches


def run_checked(env_file: EnvFile, launches: Sequence[UserLaunch]) -> tuple[int, str]:
    """Run the instances with a report file `autotune.apply` writes to; also return a warning
    naming the model knobs when an instance never applied them ('' when all did)."""
    with tempfile.TemporaryDirectory(prefix=tempdirs.prefix("apply")) as tmp:
        report = Path(tmp) / "applied.jsonl"
        told = [replace(launch, env={**launch.env, envfile.REPORT_VAR: str(report)}) for launch in launches]
        code = run_foreground(told)
        return code, unapplied(apply.knobs_from_env(env_file.env), len(launches), report)


def unapplied(knobs: ModelKnobs, instances: int, report: Path) -> str:
    """One warning line when the knobs change the model and fewer instances applied them."""
    if knobs.is_default:
        return ""
    try:
        lines = report.read_text().splitlines()
    except OSError:
        lines = []
    applied = {record.get("pid") for record in map(_record, lines) if record.get("knobs")}
    if len(applied) >= instances:
        return ""
    who = "the program never called" if not applied else f"only {len(applied)} of {instances} processes called"
    return (f"warning: {who} autotune.apply(model, example_inputs), so {knobs.describe()} "
            f"{'was' if ' ' not in knobs.describe() else 'were'} not applied there; see docs/deploying.md, "
            f"'Using the result in your program'")


def _record(line: str) -> dict[str, object]:
    """One report line; a line cut short by a killed process counts as no report."""
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def run_foreground(launches: Sequence[UserLaunch]) -> int:
    """Start every instance, wait, pass their output through.

    Returns the first non-zero exit code (128 + signal for a signal), else 0. Ctrl-C kills them all.
    """
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for launch in launches:
            procs.append(subprocess.Popen(list(launch.argv), env=dict(launch.env), start_new_session=True,
                                          preexec_fn=_user_child(set(launch.affinity))))
        codes = [p.wait() for p in procs]
    finally:
        for proc in procs:
            kill_group(proc)
        for proc in procs:
            proc.wait()
    failed = [c for c in codes if c != 0]
    if not failed:
        return 0
    return 128 - failed[0] if failed[0] < 0 else failed[0]


def _user_child(cpus: set[int]) -> Callable[[], None]:
    """In the user's instance before exec: bind if asked, and die with autotune (PDEATHSIG)."""

    def setup() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return setup
