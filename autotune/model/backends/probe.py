"""The kernel probe's child: which precisions each runtime runs on this CPU, whether they agree with
fp32, and how fast, measured rather than read off a table of CPU flags (docs/probe.md).

For every runtime of the registry (its first backend runs the operations: `Backend.probe_kernel`)
and every precision its backends take, on the operations of `autotune.model.kernels`: whether it
runs (else the failure, in one line), its relative error against fp32 on the same inputs, what the
runtime says it ran in, and GOP/s at each thread count asked for. int8 is also checked against
exact integer arithmetic (`autotune.model.saturation`), and where sums saturate the conversion's remedy is what is
measured (`Backend.int8_remedy`). Then the memory bandwidth.

Protocol: `python -m autotune.model.backends.probe --out FILE --threads 1,2`; the result file is
rewritten after every kernel with the one it is about to run as `running`, so that a crash names its
kernel and a rerun with `--skip` goes on past it. The runtimes are imported only for their kernels.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.model import backends, saturation
from autotune.model.batches import explain
from autotune.model.cpu import isa_limits
from autotune.model.files import write_atomically
from autotune.model.kernels import Kernel, bandwidth, fp32, rel_error, seconds_per_call, threads_kept, work

FORMAT = 1  # of the probe's result; bumped when what it measures changes, so kept probes are measured again


@dataclass
class Measured:
    """What one kernel gave: `gops` per thread count (as text: a JSON key) when it runs."""

    runtime: str
    precision: str
    op: str
    runs: bool = False
    error: str = ""
    rel_error: float | None = None  # against fp32 on the same inputs
    exact_error: float | None = None  # int8: against exact integer arithmetic at the full uint8 range
    saturates: bool | None = None
    remedy: str = ""  # int8 where it saturates: how the conversion avoids it, as measured
    ran_as: str = ""  # what the runtime reports it ran the operation in, where it says
    gops: dict[str, float] = field(default_factory=dict)


def probed() -> dict[str, tuple[str, ...]]:
    """Each runtime and the precisions its backends take, in the registry's order."""
    found: dict[str, list[str]] = {}
    for backend in backends.REGISTRY:
        taken = found.setdefault(backend.runtime, [])
        taken += [p for p in backend.precisions if p not in taken]
    order = {p: i for i, p in enumerate(("fp32", "bf16", "int8", "int8_dynamic", "int8_weight_only"))}
    return {runtime: tuple(sorted(precisions, key=order.__getitem__)) for runtime, precisions in found.items()}


def all_kernels(runtimes: Sequence[str] | None = None) -> list[Kernel]:
    """Every kernel the probe measures, of `runtimes` (all by default)."""
    wanted = probed() if runtimes is None else {r: p for r, p in probed().items() if r in runtimes}
    return [Kernel(runtime, precision, op) for runtime, precisions in wanted.items() for precision in precisions
            for op in backends.of_runtime(runtime).probe_ops(precision)]  # type: ignore[arg-type]


def measure(kernel: Kernel, threads: Sequence[int]) -> Measured:
    """One kernel: ready it, check its output, time it at each thread count; a failure is its result."""
    import torch

    found = Measured(kernel.runtime, kernel.precision, kernel.op)
    owner = backends.of_runtime(kernel.runtime)
    try:
        if kernel.precision == "int8":
            found.exact_error, found.saturates = saturation.exact_error(owner, kernel.op), saturation.saturates(owner)
            found.remedy = owner.int8_remedy if found.saturates else ""
        at, found.ran_as = owner.probe_kernel(kernel, bool(found.remedy))
        with torch.no_grad(), threads_kept():
            found.rel_error = rel_error(at(max(threads))(), fp32(kernel.op))
            found.gops = {str(t): work(kernel.op) / seconds_per_call(at(t)) / 1e9 for t in threads}
    except Exception as exc:
        found.error = one_line(exc)
        return found
    found.runs = True
    return found


def one_line(exc: BaseException) -> str:
    """A runtime's failure in one line: OpenVINO's source locations ("Exception from FILE:LINE:") dropped."""
    text = " ".join(re.sub(r"Exception from \S+:\d+:\s*", "", str(exc)).split())
    return explain(RuntimeError(text)).replace("RuntimeError", type(exc).__name__, 1)


def versions() -> dict[str, str | None]:
    """The versions of what runs the kernels: torch, torchao, and each runtime of the registry."""
    found: dict[str, str | None] = {}
    names = ("torch", "torchao", *(b.packages.distributions[0] for b in backends.REGISTRY if b.packages))
    for name in dict.fromkeys(names):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="autotune.model.backends.probe")
    p.add_argument("--out", required=True, help="the result file (JSON), rewritten after every kernel")
    p.add_argument("--threads", required=True, help="thread counts N,N,...")
    p.add_argument("--runtimes", default="", help="runtimes to probe R,R,... (default: every one registered)")
    p.add_argument("--skip", default="", help="kernels not to run (runtime:precision:op,...): a rerun after a crash")
    p.add_argument("--no-bandwidth", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    threads = sorted({int(t) for t in args.threads.split(",")})
    skip = set(filter(None, args.skip.split(",")))
    start = time.perf_counter()
    result: dict[str, Any] = {"format": FORMAT, "threads": threads, "versions": versions(),
                              "isa_limits": isa_limits(), "kernels": [], "bandwidth": {}, "running": ""}
    for kernel in all_kernels(args.runtimes.split(",") if args.runtimes else None):
        if kernel.name in skip:
            continue
        write_atomically(args.out, json.dumps(result | {"running": kernel.name}))
        result["kernels"].append(asdict(measure(kernel, threads)))
    if not args.no_bandwidth:
        write_atomically(args.out, json.dumps(result | {"running": "bandwidth"}))
        result["bandwidth"] = bandwidth(threads)
    result["probe_s"] = time.perf_counter() - start
    write_atomically(args.out, json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
