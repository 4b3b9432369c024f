"""Execute a `LaunchPlan`: start every instance, barrier, common window, kill and reap, collect.

Every outcome is a result: a crash, a non-zero exit, a hang past the timeout or a missing result
file becomes a failed `InstanceResult` with its reason and stderr tail. Each child runs in its own
session so that its whole process group (DataLoader workers included) is killed on the way out,
on success, failure, timeout and Ctrl-C alike.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from autotune.launch import InstancePlan, LaunchPlan, child_environment
from autotune.stats import percentile

STDERR_TAIL_CHARS = 2000


@dataclass(frozen=True)
class InstanceResult:
    index: int
    ok: bool
    reason: str
    returncode: int | None
    stderr_tail: str
    metrics: Mapping[str, Any] = field(default_factory=dict)

    def percentile(self, q: float) -> float:
        return percentile(self.metrics["latencies_ms"], q)


@dataclass(frozen=True)
class RunResult:
    """One execution of a plan; aggregated metrics exist only when every instance succeeded."""

    ok: bool
    reason: str
    instances: tuple[InstanceResult, ...]
    wall_s: float
    noise: Mapping[str, float] = field(default_factory=dict)

    @property
    def latency_p50_ms(self) -> float:
        return statistics.median(i.percentile(50) for i in self.instances)

    @property
    def latency_p90_ms(self) -> float:
        return statistics.median(i.percentile(90) for i in self.instances)

    @property
    def throughput_ips(self) -> float:
        return sum(float(i.metrics["throughput_ips"]) for i in self.instances)

    @property
    def peak_rss_mb(self) -> float:
        return sum(float(i.metrics["peak_rss_mb"]) for i in self.instances)

    def summary(self) -> dict[str, Any]:
        """Aggregated metrics, or the failure, as plain data for JSON and the study."""
        out: dict[str, Any] = {"ok": self.ok, "reason": self.reason, "wall_s": round(self.wall_s, 3),
                               "noise": dict(self.noise)}
        if self.ok:
            out.update(latency_p50_ms=self.latency_p50_ms, latency_p90_ms=self.latency_p90_ms,
                       throughput_ips=self.throughput_ips, peak_rss_mb=self.peak_rss_mb)
        out["instances"] = [instance_summary(i) for i in self.instances]
        return out


def instance_summary(result: InstanceResult) -> dict[str, Any]:
    out: dict[str, Any] = {"index": result.index, "ok": result.ok, "reason": result.reason,
                           "returncode": result.returncode}
    if result.ok:
        m = result.metrics
        out.update(latency_p50_ms=result.percentile(50), latency_p90_ms=result.percentile(90),
                   throughput_ips=m["throughput_ips"], peak_rss_mb=m["peak_rss_mb"],
                   samples=len(m["latencies_ms"]), window_s=m["window_s"],
                   setup=m.get("setup", {}), runtime=m.get("runtime", {}))
    else:
        out["stderr_tail"] = result.stderr_tail
    return out


@dataclass
class _Child:
    plan: InstancePlan
    proc: subprocess.Popen[bytes]
    ready_fd: int
    result_path: Path
    log_path: Path
    ready: bool = False
    forced_reason: str = ""
    fd_open: bool = True

    def close_ready_fd(self) -> None:
        if self.fd_open:
            os.close(self.ready_fd)
            self.fd_open = False


def run_plan(plan: LaunchPlan, timeout_s: float, parent_env: Mapping[str, str] | None = None) -> RunResult:
    """Run all instances together; a run where any instance fails has failed."""
    env = dict(os.environ if parent_env is None else parent_env)
    start = time.monotonic()
    deadline = start + timeout_s
    with tempfile.TemporaryDirectory(prefix="autotune-run-") as tmp:
        children: list[_Child] = []
        after: _Snapshot | None = None
        before = after
        try:
            for instance in plan.instances:
                children.append(_start(instance, plan.binding, Path(tmp), env))
            if _barrier(children, deadline, timeout_s):
                before = _machine_snapshot()
                _go(children)
                _wait(children, deadline, timeout_s)
                after = _machine_snapshot()
        except OSError as exc:  # could not start an instance (e.g. a binding tool is missing)
            index = len(children)
            _stop_unfinished(children, f"stopped because instance {index} could not start")
            unstarted = InstanceResult(index, False, f"could not start: {exc}", None, "")
            return _result((*(_collect(c) for c in _finish(children)), unstarted), start)
        finally:
            _kill_all(children)
        results = tuple(_collect(c) for c in children)
        noise = _noise(before, after, results) if before and after else {}
        return _result(results, start, noise)


@dataclass(frozen=True)
class _Snapshot:
    at: float
    busy_s: float
    steal_s: float
    load1: float


def _machine_snapshot() -> _Snapshot:
    """CPU time of the CPUs this process may use (not a container host's other cores)."""
    per_cpu = psutil.cpu_times(percpu=True)
    mine = [per_cpu[c] for c in sorted(os.sched_getaffinity(0)) if c < len(per_cpu)] or per_cpu
    busy = steal = 0.0
    for times in mine:
        cpu_steal = getattr(times, "steal", 0.0)
        busy += sum(times) - times.idle - getattr(times, "iowait", 0.0) - cpu_steal
        steal += cpu_steal
    return _Snapshot(time.monotonic(), busy, steal, os.getloadavg()[0])


def _noise(before: _Snapshot, after: _Snapshot, results: Sequence[InstanceResult]) -> dict[str, float]:
    """What else used the machine while the instances measured: other processes' CPU (busy time
    not spent by our children), hypervisor steal, and the load average on both sides."""
    window = max(after.at - before.at, 1e-9)
    ours = sum(float(r.metrics.get("cpu_s", 0.0)) for r in results if r.ok)
    cpus = len(os.sched_getaffinity(0))
    other = max(after.busy_s - before.busy_s - ours, 0.0)
    return {"window_s": round(window, 3), "own_cpu_s": round(ours, 3), "other_cpu_s": round(other, 3),
            "other_cpu_share": round(other / (window * cpus), 4),
            "steal_share": round((after.steal_s - before.steal_s) / (window * cpus), 4),
            "load_before": before.load1, "load_after": after.load1}


def _finish(children: list[_Child]) -> list[_Child]:
    _kill_all(children)
    return children


def _result(results: tuple[InstanceResult, ...], start: float,
            noise: Mapping[str, float] | None = None) -> RunResult:
    failed = [r for r in results if not r.ok]
    reason = "" if not failed else f"instance {failed[0].index}: {failed[0].reason}"
    return RunResult(ok=not failed, reason=reason, instances=results, wall_s=time.monotonic() - start,
                     noise=noise or {})


def _start(instance: InstancePlan, binding: str, tmp: Path, parent_env: Mapping[str, str]) -> _Child:
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


def _barrier(children: list[_Child], deadline: float, timeout_s: float) -> bool:
    """Wait until every child is warm. False (and the rest stopped) if one fails or time runs out."""
    selector = selectors.DefaultSelector()
    for child in children:
        selector.register(child.ready_fd, selectors.EVENT_READ, child)
    try:
        while not all(c.ready for c in children):
            if time.monotonic() > deadline:
                _stop_unfinished(children, f"timed out after {timeout_s:g}s before measuring "
                                           "(model setup or warmup too slow, or hung)")
                return False
            for key, _ in selector.select(timeout=0.1):
                child = key.data
                data = os.read(child.ready_fd, 64)
                child.ready = child.ready or data.startswith(b"ready")
                if not data:
                    selector.unregister(child.ready_fd)
            dead = [c for c in children if not c.ready and c.proc.poll() is not None]
            if dead:
                _stop_unfinished(children, f"stopped because instance {dead[0].plan.index} failed")
                return False
        return True
    finally:
        selector.close()
        for child in children:
            child.close_ready_fd()


def _go(children: list[_Child]) -> None:
    for child in children:
        try:
            assert child.proc.stdin is not None
            child.proc.stdin.write(b"go\n")
            child.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass


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
            _kill_group(child.proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill_all(children: list[_Child]) -> None:
    """Kill every child's process group, even of children that exited (their helpers may not)."""
    for child in children:
        _kill_group(child.proc)
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
    return InstanceResult(index, True, "", code, tail, payload)


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


def run_foreground(launches: Sequence[tuple[Sequence[str], Mapping[str, str], Sequence[int]]]) -> int:
    """`autotune run`: start every instance of the user's command, wait, pass their output through.

    Returns the first non-zero exit code (128 + signal for a signal), else 0. Ctrl-C kills them all.
    """
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for argv, env, cpus in launches:
            procs.append(subprocess.Popen(list(argv), env=dict(env), start_new_session=True,
                                          preexec_fn=_user_child(set(cpus))))
        codes = [p.wait() for p in procs]
    finally:
        for proc in procs:
            _kill_group(proc)
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


def probe(plan: LaunchPlan, timeout_s: float) -> str:
    """Build the model and run one checked forward in a child, unbound; '' when that works,
    else the reason. Catches a broken user model before any measurement is spent on it."""
    first = plan.instances[0]
    command = first.command[first.command.index("-m") - 1:] if "-m" in first.command else first.command
    trial = InstancePlan(0, first.cpus, first.numa_node, first.env, (*command, "--probe"))
    result = run_plan(LaunchPlan(plan.config, plan.bench, "none", (trial,)), timeout_s)
    return result.reason.removeprefix("instance 0: ")
