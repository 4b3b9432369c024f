"""Execute a `LaunchPlan`: start every instance, barrier, common window, kill and reap, collect.

The protocol with each child is documented in `autotune.child.worker`: after every child said
`ready`, each is sent the same window (`go START END`, CLOCK_MONOTONIC seconds a short lead from
now), and each says `done` when its timed loop ends; the noise snapshots span START to the last
`done`, the children's timed loops, not their result writing and exit. What each child is doing
(its `phase` lines before `ready`, then waiting and measuring) goes to an optional callback, for
live progress. A series of plans (`run_series`, a confirmation's rounds) builds two plans at a
time where memory allows: their children start together, say `built` and wait until their turn,
sent as `warm`.

Every outcome is a result: a crash, a non-zero exit, a hang past the timeout or a missing result
file becomes a failed `InstanceResult` with its reason and stderr tail. Each child runs in its own
session so that its whole process group (DataLoader workers included) is killed on the way out,
on success, failure, timeout and Ctrl-C alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from autotune.base import tempdirs
from autotune.measure import noise
from autotune.measure.plan import Binding, InstancePlan, LaunchPlan, child_environment
from autotune.measure.results import STDERR_TAIL_CHARS, InstanceResult, RunResult, combine

GO_LEAD_S = 0.1  # from sending `go` to the window's start: every child has read it by then
# Plans of a series built at the same time (`run_series`): on this 2-CPU machine a process builds on
# about one CPU (interpreter, imports, model), so two fill both CPUs; measured in the README.
SIDE_BY_SIDE = 2
# The share of the available memory that plans built together may hold at their peaks, added: the
# rest is for the page cache, autotune and whatever else the machine runs.
MEMORY_SHARE = 0.8
# The CPUs' snapshots at the start of a plan's window and when its last timed loop ended.
_Window = tuple[noise.Snapshot | None, noise.Snapshot | None]
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
    reaped: bool = False
    built_at: float | None = None  # when it said `built`

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
    return next(_run_group((plan,), timeout_s, dict(os.environ if parent_env is None else parent_env), on_phase))


def run_series(plans: Sequence[LaunchPlan], timeout_s: float, parent_env: Mapping[str, str] | None = None,
               available_mb: Callable[[], float] = lambda: psutil.virtual_memory().available / 2**20,
               expected_mb: Callable[[LaunchPlan], float | None] = lambda plan: None,
               ) -> Generator[RunResult, None, None]:
    """Each plan's result in turn, as `run_plan` gives it, building `SIDE_BY_SIDE` plans at a time
    where memory allows: their processes start together and build (imports, model, compiled
    artifact) side by side, then each plan in turn warms up and measures alone while the other
    waits, idle, at the protocol's `built` step (see `autotune.child.worker`). A plan's `timeout_s`
    counts its building and its own turn, not the wait; its `wall_s` is from the later of the
    group's start and the previous plan's end to its exit, so the results' walls add up to the
    series' wall. Plans are built together only when their peaks, added, fit in `MEMORY_SHARE` of
    `available_mb()`: a configuration must not fail for want of the memory its neighbour holds. A
    plan's peak is the one it recorded when it once succeeded in this series, else
    `expected_mb(plan)` (a benchmark's knowledge); unknown (None, the default), it runs alone."""
    env = dict(os.environ if parent_env is None else parent_env)
    peaks: dict[str, float] = {}  # each plan's peak memory, once it succeeded
    first = 0
    while first < len(plans):
        group = _next_group(plans[first:first + SIDE_BY_SIDE], peaks, available_mb, expected_mb)
        with contextlib.closing(_run_group(group, timeout_s, env, _ignore)) as results:  # closed early: killed
            for plan, result in zip(group, results, strict=True):
                if result.ok:
                    peaks[_key(plan)] = max(result.peak_rss_mb, result.setup_peak_rss_mb)
                yield result
        first += len(group)


def built_beside(processes: int, distinct: int) -> int:
    """How many of a series' `processes` are built beside an earlier one when memory allows: each
    of its `distinct` plans runs alone the first time, the rest `SIDE_BY_SIDE` at a time."""
    rest = max(processes - distinct, 0)
    return rest - math.ceil(rest / SIDE_BY_SIDE)


def _next_group(upcoming: Sequence[LaunchPlan], peaks: Mapping[str, float], available_mb: Callable[[], float],
                expected_mb: Callable[[LaunchPlan], float | None]) -> tuple[LaunchPlan, ...]:
    """The next plans to build together: all of `upcoming` when each one's peak is known (it ran
    before) or expected, and they fit in memory together; else the first alone."""
    known = [peaks.get(_key(plan), expected_mb(plan)) for plan in upcoming]
    if len(upcoming) > 1 and None not in known and sum(filter(None, known)) <= MEMORY_SHARE * available_mb():
        return tuple(upcoming)
    return tuple(upcoming[:1])


def _key(plan: LaunchPlan) -> str:
    """A plan's identity across a series: the same plan repeated in rounds is one key."""
    return json.dumps(dataclasses.asdict(plan), sort_keys=True, default=str)


@dataclass
class _Run:
    """One plan's processes in a group, or why they could not all start."""

    plan: LaunchPlan
    children: list[_Child]
    unstarted: InstanceResult | None = None

    def built_s(self, start: float) -> float:
        """Seconds from `start` until its last process said `built` (or now, if one did not, as a
        plan run alone never does: its turn is then the rest of its timeout)."""
        return max((c.built_at or time.monotonic() for c in self.children), default=start) - start

    def result(self, wall_s: float, window: _Window) -> RunResult:
        collected = tuple(_collect(c) for c in self.children)
        before, after = window
        disturbance = noise.noise(before, after, collected) if before and after else {}
        return combine((*collected, self.unstarted) if self.unstarted else collected, wall_s, disturbance)


def _run_group(plans: tuple[LaunchPlan, ...], timeout_s: float, env: Mapping[str, str],
               on_phase: PhaseCallback) -> Generator[RunResult, None, None]:
    """Start every plan of the group, wait until all of them built when there are several, then
    run each one's turn (warmup, barrier, window) and yield its result."""
    hold = len(plans) > 1
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=tempdirs.prefix("run")) as tmp:
        runs: list[_Run] = []
        try:
            for number, plan in enumerate(plans):
                runs.append(_start_plan(plan, Path(tmp, str(number)), env, hold))
            if hold:
                _build_together(runs, start + timeout_s, timeout_s)
            turn_start = start
            for run in runs:
                deadline = time.monotonic() + timeout_s - run.built_s(start)  # its build and its turn
                window = _turn(run, deadline, timeout_s, on_phase, hold) if not run.unstarted else (None, None)
                _kill_all(run.children)
                result = run.result(time.monotonic() - turn_start, window)
                turn_start = time.monotonic()
                yield result
        finally:
            for run in runs:
                _kill_all(run.children)


def _start_plan(plan: LaunchPlan, folder: Path, env: Mapping[str, str], hold: bool) -> _Run:
    """Start every instance; one that cannot start stops the others started before it."""
    folder.mkdir()
    run = _Run(plan, [])
    try:
        for instance in plan.instances:
            run.children.append(_start(instance, plan.binding, folder, env, hold))
    except OSError as exc:  # could not start an instance (e.g. a binding tool is missing)
        index = len(run.children)
        _stop_unfinished(run.children, f"stopped because instance {index} could not start")
        run.unstarted = InstanceResult(index, False, f"could not start: {exc}", None, "")
    return run


def _build_together(runs: list[_Run], deadline: float, timeout_s: float) -> None:
    """Wait until every started process said `built` or exited. Whatever is still building at the
    deadline is stopped."""
    children = [c for run in runs for c in run.children]
    if not _hear(children, b"built", deadline, stop_on_exit=False):
        _stop_unfinished([c for c in children if not c.said(b"built")], _timed_out_setup(timeout_s))


def _turn(run: _Run, deadline: float, timeout_s: float, on_phase: PhaseCallback, held: bool) -> _Window:
    """One plan's turn: release it (when held), barrier, window; the CPUs' snapshots around it."""
    children = run.children
    if held:
        failed = [c for c in children if not c.said(b"built")]
        if failed:
            _stop_unfinished(children, f"stopped because instance {failed[0].plan.index} failed")
            return None, None
        _tell(children, b"warm\n")
    if not _barrier(children, deadline, timeout_s, on_phase):
        return None, None
    return _measure(children, run.plan.bench.measure.duration_s, deadline, timeout_s, on_phase)


def _measure(children: list[_Child], duration_s: float, deadline: float, timeout_s: float,
             on_phase: PhaseCallback) -> _Window:
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


def _start(instance: InstancePlan, binding: Binding, tmp: Path, parent_env: Mapping[str, str],
           hold: bool = False) -> _Child:
    result_path = tmp / f"instance-{instance.index}.json"
    log_path = tmp / f"instance-{instance.index}.log"
    read_fd, write_fd = os.pipe()
    argv = [*instance.command, "--result", str(result_path), "--ready-fd", str(write_fd),
            "--parent-pid", str(os.getpid()), *(["--hold"] if hold else [])]
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
        _stop_unfinished(children, _timed_out_setup(timeout_s))
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
    if child.built_at is None and child.said(b"built"):
        child.built_at = time.monotonic()
    if not data:  # the child closed its end or exited
        selector.unregister(child.ready_fd)


def _timed_out_setup(timeout_s: float) -> str:
    return f"timed out after {timeout_s:g}s before measuring (model setup or warmup too slow, or hung)"


def _tell(children: list[_Child], line: bytes) -> None:
    """A line to every child's stdin; one that went away hears nothing (its exit is its result)."""
    for child in children:
        with contextlib.suppress(BrokenPipeError, OSError):
            assert child.proc.stdin is not None
            child.proc.stdin.write(line)
            child.proc.stdin.flush()


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
        if child.proc.poll() is None and not child.forced_reason:
            child.forced_reason = reason
            kill_group(child.proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill_all(children: list[_Child]) -> None:
    """Kill every child's process group, even of children that exited (their helpers may not), and
    reap it; once: a reaped child's pid may belong to another process by the next call."""
    for child in children:
        if not child.reaped:
            kill_group(child.proc)
            child.close_ready_fd()
    for child in children:
        if child.proc.stdin is not None and not child.proc.stdin.closed:
            with contextlib.suppress(OSError):
                child.proc.stdin.close()
        child.proc.wait()
        child.reaped = True


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
