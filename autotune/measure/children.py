"""The instances of one run, each a measuring child: starting it bound and in its own session,
speaking the protocol (`autotune.child.worker`: ready, go, done), killing its process group, and
turning whatever it left (a result file, an exit code, a signal, its stderr) into an InstanceResult.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.measure.plan import Binding, InstancePlan, child_environment
from autotune.measure.results import STDERR_TAIL_CHARS, InstanceResult, stopped_by

# What a child is doing, told as it changes: (instance index, phase), e.g. (0, "compiling").
PhaseCallback = Callable[[int, str], None]
WAITING, MEASURING = "waiting for the other instances", "measuring"


def ignore(index: int, phase: str) -> None:
    pass

GO_LEAD_S = 0.1  # from sending `go` to the window's start: every child has read it by then


@dataclass
class Child:
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


def start_child(instance: InstancePlan, binding: Binding, tmp: Path, parent_env: Mapping[str, str],
           hold: bool = False) -> Child:
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
    return Child(instance, proc, read_fd, result_path, log_path)


def barrier(children: list[Child], deadline: float, timeout_s: float, on_phase: PhaseCallback) -> bool:
    """Wait until every child is warm. False (and the rest stopped) if one fails or time runs out."""
    if not hear(children, b"ready", deadline, stop_on_exit=True, on_phase=on_phase):
        stop_unfinished(children, timed_out_setup(timeout_s))
        return False
    dead = [c for c in children if not c.said(b"ready") and c.proc.poll() is not None]
    if dead:
        stop_unfinished(children, stopped_by(dead[0].plan.index))
        return False
    return True


def hear(children: list[Child], word: bytes, deadline: float, stop_on_exit: bool,
          on_phase: PhaseCallback = ignore) -> bool:
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


def _listen(child: Child, selector: selectors.BaseSelector) -> None:
    try:
        data = os.read(child.ready_fd, 64)
    except BlockingIOError:
        return
    child.heard += data
    if child.built_at is None and child.said(b"built"):
        child.built_at = time.monotonic()
    if not data:  # the child closed its end or exited
        selector.unregister(child.ready_fd)


def timed_out_setup(timeout_s: float) -> str:
    return f"timed out after {timeout_s:g}s before measuring (model setup or warmup too slow, or hung)"


def tell(children: list[Child], line: bytes) -> None:
    """A line to every child's stdin; one that went away hears nothing (its exit is its result)."""
    for child in children:
        with contextlib.suppress(BrokenPipeError, OSError):
            assert child.proc.stdin is not None
            child.proc.stdin.write(line)
            child.proc.stdin.flush()


def send_go(children: list[Child], duration_s: float) -> float:
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


def wait_done(children: list[Child], deadline: float, timeout_s: float) -> None:
    while any(c.proc.poll() is None for c in children):
        if time.monotonic() > deadline:
            stop_unfinished(children, f"timed out after {timeout_s:g}s while measuring")
            return
        time.sleep(0.05)


def stop_unfinished(children: list[Child], reason: str) -> None:
    for child in children:
        if child.proc.poll() is None and not child.forced_reason:
            child.forced_reason = reason
            kill_group(child.proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_all(children: list[Child]) -> None:
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


def collect(child: Child) -> InstanceResult:
    code = child.proc.returncode
    tail = _tail(child.log_path)
    payload = _read_result(child.result_path)
    index = child.plan.index
    if child.forced_reason:
        return InstanceResult(index, False, child.forced_reason, code, tail)
    if payload is not None and payload.get("status") == "error":
        return InstanceResult(index, False, str(payload.get("reason")), code, tail,
                              wrong_answers=payload.get("wrong_answers") is True)
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
