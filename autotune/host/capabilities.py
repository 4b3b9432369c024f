"""What this CPU runs and how fast, measured: the kernel probe (`autotune.model.backends.probe`) run in a
child process once per host, instruction-set limits and library versions, kept in the cache, and
read into the decisions a search and `bench` make and the peaks `doctor` shows.

A precision is refused for a runtime only when its probe says so, in the probe's words: it failed
(the runtime's own message), the runtime ran it in another precision (OpenVINO runs bf16 as f32
where the CPU lacks it), it disagreed with fp32 on the same inputs, or it measured more than
`PROBE_SLOWER` times slower than fp32 at every thread count probed. No CPU flag is read, so a CPU
the project never saw (an AVX2-only EPYC, an AArch64 Graviton) is judged by what it does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.base.errors import AutotuneError
from autotune.base.thresholds import NOISY_RETRY_WAIT, PROBE_AGREES, PROBE_RETRIES, PROBE_SLOWER
from autotune.host import cpustat
from autotune.model import backends, cpu, schema
from autotune.model.backends import probe as kernel_probe
from autotune.model.files import NotAFile, read_text, unwritable, write_atomically

# Where probes are kept when not under the cache folder: one folder for every study of a machine
# (the tests point their autotune processes at one, so that the suite probes once).
PROBE_DIR_ENV = "AUTOTUNE_PROBE_DIR"
TIMEOUT_S = 300.0  # for the whole probe; a kernel that hangs is recorded as such, and the rest go on
# What a runtime that reports its precision must say it ran for the precision to count as run.
RAN_AS = {"bf16": ("bf16", "bfloat16"), "int8": ("u8", "i8")}
Refused = Mapping[tuple[str, str], str]  # (backend, precision) -> why this CPU's probe refused it


# What a kept probe holds (what `run_child` writes, with its key and time): read only through it.
KERNEL = schema.record(
    {"runtime": schema.text, "precision": schema.text, "op": schema.text, "runs": schema.flag},
    {"error": schema.text, "rel_error": schema.optional(schema.real), "exact_error": schema.optional(schema.real),
     "saturates": schema.optional(schema.flag), "remedy": schema.text, "ran_as": schema.text,
     "gops": schema.optional(schema.map_of(schema.number, key=schema.numbered))})
SCHEMA = schema.record(
    {"kernels": schema.list_of(KERNEL), "threads": schema.list_of(schema.positive)},
    {"bandwidth": schema.optional(schema.map_of(schema.record({"copy_gbs": schema.number, "triad_gbs": schema.number}),
                                                key=schema.numbered)),
     "key": schema.optional(schema.map_of(schema.anything)), "measured_at": schema.text, "probe_s": schema.number})


class ProbeError(AutotuneError):
    """The probe could not run at all (no result, or its folder cannot be written)."""


@dataclass(frozen=True)
class Peak:
    """The most a precision's operation gave on this machine: `instances` x `threads` filling the cores."""

    gops: float
    threads: int
    instances: int

    def describe(self, unit: str) -> str:
        arranged = f"{self.threads} thread{'s' * (self.threads > 1)}"
        if self.instances > 1:
            arranged = f"{self.instances} x {arranged}"
        return f"{self.gops:.0f} {unit} ({arranged})"


@dataclass(frozen=True)
class KernelResult:
    runtime: str
    precision: str
    op: str
    runs: bool
    error: str = ""
    rel_error: float | None = None
    exact_error: float | None = None
    saturates: bool | None = None
    remedy: str = ""
    ran_as: str = ""
    gops: tuple[tuple[int, float], ...] = ()  # (threads, GOP/s)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KernelResult:
        """One kernel of a probe that `SCHEMA` passed."""
        gops = tuple(sorted((int(t), float(g)) for t, g in dict(data.get("gops") or {}).items()))
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "gops"}
        return cls(**fields, gops=gops)

    def peak(self, cores: int) -> Peak | None:
        arranged = [Peak(g * max(1, cores // t), t, max(1, cores // t)) for t, g in self.gops if t <= cores]
        return max(arranged, key=lambda p: p.gops, default=None)


@dataclass(frozen=True)
class Probe:
    kernels: tuple[KernelResult, ...]
    bandwidth: tuple[tuple[int, float, float], ...]  # (threads, copy GB/s, triad GB/s)
    threads: tuple[int, ...]
    key: Mapping[str, Any]
    measured_at: str = ""
    probe_s: float = 0.0
    path: str = ""

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Probe:
        """A probe as JSON values; SchemaError naming what is wrong where it is not one (`SCHEMA`)."""
        data = SCHEMA(data, "")
        bandwidth = tuple(sorted((int(t), float(b["copy_gbs"]), float(b["triad_gbs"]))
                                 for t, b in dict(data.get("bandwidth") or {}).items()))
        return cls(tuple(KernelResult.from_json(k) for k in data["kernels"]), bandwidth,
                   tuple(int(t) for t in data["threads"]), dict(data.get("key") or {}),
                   str(data.get("measured_at", "")), float(data.get("probe_s", 0.0)), path)

    def kernel(self, runtime: str, precision: str, op: str) -> KernelResult | None:
        """The kernel of `op`, else the precision's other one (int8_dynamic has only a matmul)."""
        found = [k for k in self.kernels if (k.runtime, k.precision) == (runtime, precision)]
        return next((k for k in found if k.op == op), found[0] if found else None)

    def failure(self, runtime: str, precision: str, op: str) -> str:
        """Why `runtime` cannot run `precision` on this CPU, as its probe found ("" when it can): it
        failed, ran another precision, or disagreed with fp32. `op`: the operation the model spends
        its time in (conv or matmul)."""
        found = self.kernel(runtime, precision, op)
        if found is None:
            return ""  # not probed (a runtime installed since, a precision it does not take): the trial tells
        if not found.runs:
            return f"its probe failed: {found.error}"
        wanted = RAN_AS.get(_family(precision), ())
        if found.ran_as and wanted and found.ran_as not in wanted:
            return f"{runtime} ran it in {found.ran_as} in its probe"
        return _disagrees(found)

    def refusal(self, runtime: str, precision: str, op: str) -> str:
        """Why a search does not offer `runtime` `precision` here ("" when it does): its `failure`,
        or it measured far slower than fp32."""
        return self.failure(runtime, precision, op) or self.slower(runtime, precision, op)

    def slower(self, runtime: str, precision: str, op: str) -> str:
        """"" unless `precision` measured more than PROBE_SLOWER times slower than fp32 at every thread count."""
        found = self.kernel(runtime, precision, op)
        best = self.over_fp32(found) if found is not None and found.runs and precision != "fp32" else None
        if best is not None and best < 1 / PROBE_SLOWER:
            return f"it measured {1 / best:.1f}x slower than fp32 in its probe ({found.op})"  # type: ignore[union-attr]
        return ""

    def peak(self, runtime: str, precision: str, op: str, cores: int) -> Peak | None:
        found = self.kernel(runtime, precision, op)
        return found.peak(cores) if found and found.runs else None

    def bandwidth_gbs(self) -> float | None:
        """The most memory bandwidth measured (STREAM triad, any thread count)."""
        return max((triad for _, _, triad in self.bandwidth), default=None)

    def summary(self, cores: int) -> dict[str, Any]:
        """What a study keeps of the probe: each kernel's peak on `cores` (runtime:precision:op ->
        GOP/s, threads, instances), the memory bandwidth, when and where it was measured."""
        peaks = {f"{k.runtime}:{k.precision}:{k.op}": vars(peak) for k in self.kernels
                 if k.runs and (peak := k.peak(cores)) is not None}
        return {"measured_at": self.measured_at, "path": self.path, "peaks": peaks,
                "bandwidth_gbs": self.bandwidth_gbs()}

    def over_fp32(self, found: KernelResult) -> float | None:
        """`found`'s GOP/s over its runtime's fp32 on the same operation, at the best thread count."""
        fp32 = self.kernel(found.runtime, "fp32", found.op)
        base = dict(fp32.gops) if fp32 is not None else {}
        ratios = [g / base[t] for t, g in found.gops if base.get(t)]
        return max(ratios, default=None)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "measured_at": self.measured_at, "probe_s": round(self.probe_s, 1),
                "threads": list(self.threads), "key": dict(self.key),
                "kernels": [{**{k: v for k, v in vars(r).items() if k != "gops"},
                             "gops": {str(t): round(g, 1) for t, g in r.gops},
                             "over_fp32": _rounded(self.over_fp32(r)),
                             "refusal": self.refusal(r.runtime, r.precision, r.op)} for r in self.kernels],
                "bandwidth": {str(t): {"copy_gbs": round(c, 1), "triad_gbs": round(tr, 1)}
                              for t, c, tr in self.bandwidth}}


def precision_peak(peaks: Mapping[str, Mapping[str, Any]], precision: str,
                   op: str) -> tuple[str, Mapping[str, Any]] | None:
    """This machine's one peak for `precision` (from `Probe.summary`'s peaks): the most any runtime's
    kernel measured, on `op` where one ran it, else on the precision's other operation (int8_dynamic
    has a matmul alone); as (runtime:precision:op, the peak), None where no runtime ran it. One
    figure per precision, whichever runtime a trial ran: a share of it says how much is left."""
    ran = [(key, peak) for key, peak in peaks.items() if key.split(":")[1:2] == [precision]]
    on_op = [(key, peak) for key, peak in ran if key.split(":")[2:] == [op]] or ran
    return max(on_op, key=lambda found: float(found[1]["gops"]), default=None)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _family(precision: str) -> str:
    return "bf16" if precision == "bf16" else "int8" if precision.startswith("int8") else precision


def _disagrees(found: KernelResult) -> str:
    allowed = PROBE_AGREES.get(_family(found.precision))
    if allowed is None or found.rel_error is None or found.rel_error <= allowed:
        return ""
    return (f"it disagrees with fp32 in its probe (relative error {found.rel_error:.3f} on the same inputs, "
            f"at most {allowed:g} allowed)")


def refusals(probe: Probe, op: str, slow: bool = True) -> Refused:
    """(backend, precision) -> why this CPU's probe refuses it (`Probe.refusal`; with `slow` False,
    only what cannot run: `Probe.failure`)."""
    judge = probe.refusal if slow else probe.failure
    found: dict[tuple[str, str], str] = {}
    for backend in backends.REGISTRY:
        for precision in backend.precisions:
            why = judge(backend.runtime, precision, op)
            if why:
                found[(backend.name, precision)] = why
    return found


def thread_counts(cores: int) -> tuple[int, ...]:
    """The thread counts probed: 1, 2, 4, ... and every core, as the search's omp_threads range reaches."""
    counts = {1, max(1, cores)}
    power = 2
    while power < cores:
        counts.add(power)
        power *= 2
    return tuple(sorted(counts))


def key(cores: int) -> dict[str, Any]:
    """What a probe holds for: the CPU and the limits set on it, the libraries that run the kernels,
    the thread counts."""
    return {"format": kernel_probe.FORMAT, "cpu_model": cpu.cpuinfo()[0], "isa": list(cpu.isa()),
            "versions": kernel_probe.versions(), "threads": list(thread_counts(cores))}


def probe_dir(cache_dir: Path) -> Path:
    return Path(os.environ.get(PROBE_DIR_ENV) or cache_dir / "probe")


def probe_path(cache_dir: Path, wanted: Mapping[str, Any]) -> Path:
    import hashlib

    digest = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]
    return probe_dir(cache_dir) / f"probe-{digest}.json"


Runner = Callable[[Sequence[int], Path], dict[str, Any]]


def load(cache_dir: Path, cores: int, rerun: bool = False, say: Callable[[str], None] = lambda _: None,
         runner: Runner | None = None, wait: Callable[[float], None] = time.sleep) -> Probe:
    """This machine's probe: the kept one, unless `rerun` or none is kept for this host, its limits
    and versions; then the probe runs (`runner`: the child, or a fake) and is kept. A probe that ran
    beside other work (`disturbed`) runs again after a pause, at most PROBE_RETRIES times; one
    disturbed every time is used by this command only and not kept, so the next probes again: a
    neighbour's share of the CPUs is not this host's speed (the noisy-neighbour benchmark's probe
    read 2 threads 35 times slower than 1)."""
    wanted = key(cores)
    path = probe_path(cache_dir, wanted)
    kept = read(path, say if not rerun else lambda _: None)  # a folder there is refused before probing
    if kept is not None and not rerun:
        return kept
    check_writable(path.parent)
    say(f"probing what this CPU runs and how fast (once per host and library versions; {path})")
    for attempt in range(PROBE_RETRIES + 1):
        result = (runner or run_child)(thread_counts(cores), path.parent)
        shared = disturbed(result)
        if not shared:
            break
        if attempt < PROBE_RETRIES:
            say(f"the probe ran beside other work ({shared}); probing again in {NOISY_RETRY_WAIT} s")
            wait(NOISY_RETRY_WAIT)
    result |= {"key": wanted, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        probe = Probe.from_json(result, str(path))
    except schema.SchemaError as exc:
        raise ProbeError(f"the kernel probe wrote a result this autotune cannot read ({exc}); run `python -m "
                         f"autotune.model.backends.probe --out probe.json --threads 1` to see why") from None
    if shared:
        say(f"the probe ran beside other work every time ({shared}): this command uses it, but it is not kept, "
            f"and the next command probes again; for figures of this host alone, stop what else runs")
        return replace(probe, path="")
    write_atomically(path, json.dumps(result, indent=1))
    return probe


def disturbed(result: Mapping[str, Any]) -> str:
    """Why a probe's result is not this host's alone (other processes' or the hypervisor's share of
    the CPUs while it ran, `run_child`'s `noise`), or ""."""
    noise = result.get("noise")
    if not isinstance(noise, Mapping):
        return ""
    return cpustat.busy_reason(float(noise.get("other_cpu_share", 0.0)), float(noise.get("steal_share", 0.0)))


def read(path: Path, say: Callable[[str], None]) -> Probe | None:
    """The probe kept at `path`, or None when there is none to use: none kept, or one that cannot
    be read or is not a probe (`SCHEMA`), said in a note, to be probed again and replaced.
    Something at `path` that is not a file (a folder, a named pipe) cannot be replaced: refused
    before anything is probed."""
    try:
        return Probe.from_json(schema.loads(read_text(path), schema.anything), str(path))
    except FileNotFoundError:
        return None
    except NotAFile as exc:
        raise ProbeError(f"the kept probe {path} cannot be used: {exc.strerror}; remove it, or point "
                         f"{PROBE_DIR_ENV} or --cache-dir at another folder") from None
    except (OSError, UnicodeDecodeError, schema.SchemaError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not text" if isinstance(exc, UnicodeDecodeError) \
            else str(exc)
        say(f"the kept probe {path} cannot be used ({why}); probing again")
        return None


def check_writable(folder: Path) -> None:
    """Refuse a folder the probe cannot be kept in, before anything runs."""
    why = unwritable(folder)
    if why:
        raise ProbeError(f"cannot write the kernel probe into {folder} ({why}); make the cache folder writable "
                         f"or choose another with --cache-dir")


def run_child(threads: Sequence[int], folder: Path) -> dict[str, Any]:
    """Run the probe's child until every kernel has a result: a kernel that crashes its process or
    hangs is recorded as failed with what happened, and a new child goes on after it."""
    deadline = time.monotonic() + TIMEOUT_S
    done: list[dict[str, Any]] = []
    before, spent = cpustat.snapshot(), cpustat.children_cpu_s()
    with tempfile.TemporaryDirectory(dir=folder, prefix=".probe-") as tmp:
        out = Path(tmp) / "result.json"
        for _ in range(len(kernel_probe.all_kernels()) + 2):
            skip = [f"{k['runtime']}:{k['precision']}:{k['op']}" for k in done]
            code, why = _child(threads, out, skip, max(1.0, deadline - time.monotonic()))
            partial = _partial(out)
            done += partial.get("kernels", [])
            if code == 0 and partial:
                return partial | {"kernels": done} | _noise(before, spent)
            running = str(partial.get("running", ""))
            if running == "bandwidth":  # every kernel measured: the probe stands without it
                return partial | {"kernels": done, "bandwidth": {}, "bandwidth_error": why} | _noise(before, spent)
            if not running:
                raise ProbeError(f"the kernel probe failed ({why}) before it measured anything; run `python -m "
                                 f"autotune.model.backends.probe --out probe.json --threads 1` to see why")
            done.append(_crashed(running, why))
    raise ProbeError("the kernel probe kept failing; run `autotune doctor --probe` to try again")


def _noise(before: cpustat.Snapshot | None, spent: float) -> dict[str, Any]:
    """What other processes and the hypervisor took of the CPUs while the probe's children ran
    (their own CPU time is theirs), as `disturbed` reads it; nothing where /proc/stat is unreadable."""
    after = cpustat.snapshot()
    if before is None or after is None:
        return {}
    other, steal = cpustat.others(before, after, cpustat.children_cpu_s() - spent)
    return {"noise": {"other_cpu_share": round(other, 4), "steal_share": round(steal, 4)}}


def _child(threads: Sequence[int], out: Path, skip: Sequence[str], timeout_s: float) -> tuple[int, str]:
    argv = [sys.executable, "-m", "autotune.model.backends.probe", "--out", str(out),
            "--threads", ",".join(map(str, threads)), "--skip", ",".join(skip)]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        _, err = process.communicate(timeout=timeout_s)
    except BaseException as exc:  # a timeout, or Ctrl-C: no probe outlives autotune
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        return -1, f"no result within {timeout_s:.0f} s"
    code = process.returncode
    last = (err.decode(errors="replace").strip().splitlines() or [""])[-1]
    return code, (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}: {last}"[:300])


def _partial(out: Path) -> dict[str, Any]:
    try:
        data = json.loads(out.read_text())
    except (OSError, ValueError):
        return {}
    with contextlib.suppress(OSError):
        out.unlink()
    return data if isinstance(data, dict) else {}


def _crashed(name: str, why: str) -> dict[str, Any]:
    runtime, precision, op = name.split(":")
    return {"runtime": runtime, "precision": precision, "op": op, "runs": False,
            "error": f"the probe's process died running it ({why})"}
