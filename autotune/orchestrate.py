"""Execute a `LaunchPlan`: start every instance, barrier, common window, kill and reap, collect.

The protocol with each child is documented in `autotune.child.worker`: after every child said
`ready`, each is sent the same window (`go START END`, CLOCK_MONOTONIC seconds a short lead from
now), and each says `done` when its timed loop ends; the noise snapshots span START to the last
`done`, the children's timed loops, not their result writing and exit. What each child is doing
(its `phase` lines before `ready`, then waiting and measuring) goes to an optional callback, for
live progress.

Every outcome is a result: a crash, a non-zero exit, a hang past the timeout or a missing result
file becomes a failed `InstanceResult` with its reason and stderr tail. Each child runs in its own
session so that its whole process group (DataLoader workers included) is killed on the way out,
on success, failure, timeout and Ctrl-C alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune import noise, tempdirs
from autotune.launch import Binding, InstancePlan, LaunchPlan, child_environment
from autotune.results import InstanceResult, RunResult, combine

STDERR_TAIL_CHARS = 2000
GO_LEAD_S = 0.1  # from sending `go` to the window's start: every child has read it by then
# What a child is doing, told as it changes: (instance index, phase), e.g. (0, "compiling").
PhaseCallback = Callable[[int, str], None]
WAITING, MEASURING = "waiting for the other instances", "measuring"


def _ignore(index: int, phase: str) -> None:
    pass


@dataclass
class _Child:
    plan: InstancePlan
    proc: subprocess.Popen[bytes]
    ready_fd: int
    result_path: Path
    log_path: Path
    heard: bytes = b""  # what the child wrote to its ready fd so far
    forced_reason: str = ""
    fd_open: bool = True
    told: int = 0  # complete lines of `heard` already passed on as phases

    def said(self, word: bytes) -> bool:
        return word in self.heard.split(b"\n")[:-1]

    def new_phases(self) -> list[str]:
        """The phases of the lines completed since the last call (`ready` means it waits)."""
        lines = self.heard.split(b"\n")[:-1]
        fresh, self.told = lines[self.told:], len(lines)
        return [WAITING if line == b"ready" else line.removeprefix(b"phase ").decode(errors="replace")
                for line in fresh if line == b"ready" or line.startswith(b"phase ")]

    def close_ready_fd(self) -> None:
        if self.fd_open:
            os.close(self.ready_fd)
            self.fd_open = False


def run_plan(plan: LaunchPlan, timeout_s: float, parent_env: Mapping[str, str] | None = None,
             on_phase: PhaseCallback = _ignore) -> RunResult:
    """Run all instances together; a run where any instance fails has failed. `on_phase` hears
    what each instance is doing while it runs."""
    env = dict(os.environ if parent_env is None else parent_env)
    start = time.monotonic()
    deadline = start + timeout_s
    with tempfile.TemporaryDirectory(prefix=tempdirs.prefix("run")) as tmp:
        children: list[_Child] = []
        before: noise.Snapshot | None = None
        after = before
        try:
            for instance in plan.instances:
                children.append(_start(instance, plan.binding, Path(tmp), env))
            if _barrier(children, deadline, timeout_s, on_phase):
                before, after = _measure(children, plan.bench.measure.duration_s, deadline, timeout_s, on_phase)
        except OSError as exc:  # could not start an instance (e.g. a binding tool is missing)
            index = len(children)
            _stop_unfinished(children, f"stopped because instance {index} could not start")
            unstarted = InstanceResult(index, False, f"could not start: {exc}", None, "")
            return combine((*(_collect(c) for c in _finish(children)), unstarted), time.monotonic() - start)
        finally:
            _kill_all(children)
        results = tuple(_collect(c) for c in children)
        disturbance = noise.noise(before, after, results) if before and after else {}
        return combine(results, time.monotonic() - start, disturbance)


def _measure(children: list[_Child], duration_s: float, deadline: float, timeout_s: float,
             on_phase: PhaseCallback) -> tuple[noise.Snapshot | None, noise.Snapshot | None]:
    """Send the common window, snapshot the CPUs at its start and when the last timed loop ends."""
    window_start = _go(children, duration_s)
    for child in children:
        on_phase(child.plan.index, MEASURING)
    time.sleep(max(window_start - time.monotonic(), 0.0))
    before = noise.snapshot()
    if not _hear(children, b"done", deadline, stop_on_exit=False):
        _stop_unfinished(children, f"timed out after {timeout_s:g}s while measuring")
    after = noise.snapshot()
    _wait(children, deadline, timeout_s)
    return before, after


def _finish(children: list[_Child]) -> list[_Child]:
    _kill_all(children)
    return children


def _start(instance: InstancePlan, binding: Binding, tmp: Path, parent_env: Mapping[str, str]) -> _Child:
    result_path = tmp / f"instance-{instance.index}.json"
    log_path = tmp / f"instance-{instance.index}.log"
    read_fd, write_fd = os.pipe()
    argv = [*instance.command, "--result", str(result_path), "--ready-fd", str(write_fd),
            "--parent-pid", str(os.getpid())]
    cpus = set(instance.cpus)

    def bind() -> None:  # only when neither numactl nor taskset is available
        os.sched_setaffinity(0, cpus)

    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                argv, env=child_environment(parent_env, instance.env), stdin=subprocess.PIPE,
                stdout=log, stderr=subprocess.STDOUT, pass_fds=(write_fd,),
                start_new_session=True,
                preexec_fn=bind if binding == "sched_setaffinity" else None,
            )
        except OSError:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
    os.set_blocking(read_fd, False)
    return _Child(instance, proc, read_fd, result_path, log_path)


def _barrier(children: list[_Child], deadline: float, timeout_s: float, on_phase: PhaseCallback) -> bool:
    """Wait until every child is warm. False (and the rest stopped) if one fails or time runs out."""
    if not _hear(children, b"ready", deadline, stop_on_exit=True, on_phase=on_phase):
        _stop_unfinished(children, f"timed out after {timeout_s:g}s before measuring "
                                   "(model setup or warmup too slow, or hung)")
        return False
    dead = [c for c in children if not c.said(b"ready") and c.proc.poll() is not None]
    if dead:
        _stop_unfinished(children, f"stopped because instance {dead[0].plan.index} failed")
        return False
    return True


def _hear(children: list[_Child], word: bytes, deadline: float, stop_on_exit: bool,
          on_phase: PhaseCallback = _ignore) -> bool:
    """Listen until every child said `word` or exited (with `stop_on_exit`: until one exited
    without saying it), passing on the phases they report. False when the deadline came first."""
    selector = selectors.DefaultSelector()
    for child in children:
        if child.fd_open:
            selector.register(child.ready_fd, selectors.EVENT_READ, child)
    try:
        while True:
            silent = [c for c in children if not c.said(word)]
            exited = [c for c in silent if c.proc.poll() is not None]
            if len(exited) == len(silent) or (stop_on_exit and exited):
                return True
            if time.monotonic() > deadline:
                return False
            for key, _ in selector.select(timeout=0.05):
                _listen(key.data, selector)
                for phase in key.data.new_phases():
                    on_phase(key.data.plan.index, phase)
    finally:
        selector.close()


def _listen(child: _Child, selector: selectors.BaseSelector) -> None:
    try:
        data = os.read(child.ready_fd, 64)
    except BlockingIOError:
        return
    child.heard += data
    if not data:  # the child closed its end or exited
        selector.unregister(child.ready_fd)


def _go(children: list[_Child], duration_s: float) -> float:
    """Send every child the same window; returns its start."""
    start = time.monotonic() + GO_LEAD_S
    line = f"go {start!r} {start + duration_s!r}\n".encode()
    for child in children:
        try:
            assert child.proc.stdin is not None
            child.proc.stdin.write(line)
            child.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
    return start


def _wait(children: list[_Child], deadline: float, timeout_s: float) -> None:
    while any(c.proc.poll() is None for c in children):
        if time.monotonic() > deadline:
            _stop_unfinished(children, f"timed out after {timeout_s:g}s while measuring")
            return
        time.sleep(0.05)


def _stop_unfinished(children: list[_Child], reason: str) -> None:
    for child in children:
        if child.proc.poll() is None:
            child.forced_reason = reason
            kill_group(child.proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill_all(children: list[_Child]) -> None:
    """Kill every child's process group, even of children that exited (their helpers may not)."""
    for child in children:
        kill_group(child.proc)
        child.close_ready_fd()
    for child in children:
        if child.proc.stdin is not None and not child.proc.stdin.closed:
            with contextlib.suppress(OSError):
                child.proc.stdin.close()
        child.proc.wait()


def _collect(child: _Child) -> InstanceResult:
    code = child.proc.returncode
    tail = _tail(child.log_path)
    payload = _read_result(child.result_path)
    index = child.plan.index
    if child.forced_reason:
        return InstanceResult(index, False, child.forced_reason, code, tail)
    if payload is not None and payload.get("status") == "error":
        return InstanceResult(index, False, str(payload.get("reason")), code, tail)
    if code is not None and code < 0:
        return InstanceResult(index, False, f"crashed with {_signal_name(-code)}", code, tail)
    if code != 0:
        return InstanceResult(index, False, f"exited with code {code}{_last_line(tail)}", code, tail)
    if payload is None:
        return InstanceResult(index, False, "exited without writing a result", code, tail)
    ignored = ignored_preload(child.plan.env.get("LD_PRELOAD", ""), payload.get("runtime", {}))
    if ignored:
        return InstanceResult(index, False, ignored, code, tail)
    return InstanceResult(index, True, "", code, tail, payload)


def ignored_preload(preload: str, runtime: Mapping[str, Any]) -> str:
    """Why the run is not what the plan said when a library in LD_PRELOAD is neither the OpenMP
    nor the malloc the child resolved (the loader skipped it: missing, wrong architecture, ...);
    "" when each preloaded library is one of them (same real path, or same library name)."""
    resolved = {"OpenMP": runtime.get("openmp_library"), "malloc": runtime.get("malloc_library")}
    found = [str(path) for path in resolved.values() if path]
    paths = {os.path.realpath(p) for p in found}
    names = {_library_name(p) for p in found}
    for entry in re.split(r"[:\s]+", preload.strip()):
        if entry and os.path.realpath(entry) not in paths and _library_name(entry) not in names:
            seen = ", ".join(f"{what} from {_library_name(path) if path else 'nowhere'}"
                             for what, path in resolved.items())
            return f"LD_PRELOAD of {_library_name(entry)} was ignored: the child resolved {seen}"
    return ""


def _library_name(path: str) -> str:
    """`/usr/lib/x86_64-linux-gnu/libjemalloc.so.2` -> `libjemalloc`."""
    return Path(path).name.split(".so")[0]


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-STDERR_TAIL_CHARS:]
    except OSError:
        return ""
    return data.decode(errors="replace")


def _last_line(tail: str) -> str:
    """The last line of the child's output, plus an OpenMP runtime's own error, which names the
    real cause when a crash surfaces elsewhere (e.g. in a forked DataLoader worker)."""
    lines = [line.strip() for line in tail.strip().splitlines() if line.strip()]
    omp = next((line for line in lines if line.startswith("OMP: Error")), "")
    last = lines[-1][:200] if lines else ""
    return "".join(f": {part}" for part in (last, omp[:200]) if part)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
