"""A stand-in benchmark child that speaks the runner's protocol (see autotune.child.worker) and
misbehaves on request. It measures nothing, but keeps the window it was sent and reports the
OpenMP and malloc libraries this process really resolved, as the real child does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from autotune.child.worker import die_with_parent, symbol_owner

# With `--profile K`: per-call self and total CPU microseconds and calls of made-up ops, by
# behaviour, reported as totals over the K calls the way the real child does.
FAKE_OPS = {
    "profile-eager": [("aten::mkldnn_convolution", 4000.0, 4500.0, 2), ("aten::relu_", 1000.0, 1000.0, 2),
                      ("aten::addmm", 500.0, 600.0, 1)],
    "profile-fused": [("aten::mkldnn_convolution", 2000.0, 2200.0, 2), ("cpp_fused_relu_0", 1500.0, 1500.0, 1),
                      ("aten::addmm", 500.0, 600.0, 1)],
    "profile-hidden": [("aten::empty", 100.0, 100.0, 5)],  # an AOTInductor package: its kernels record no ops
}
WALL_OVER_OPS = {"profile-hidden": 40.0}  # wall time per call over the ops' self time


def profiled(behaviour: str, calls: int, trace: str) -> dict[str, object]:
    ops = FAKE_OPS.get(behaviour, FAKE_OPS["profile-eager"])
    with open(trace, "w") as f:
        json.dump({"traceEvents": [{"name": name, "ph": "X", "ts": 0, "dur": self_us} for name, self_us, _, _ in ops]},
                  f)
    wall_ms = calls * sum(op[1] for op in ops) / 1e3 * WALL_OVER_OPS.get(behaviour, 1.1)
    return {"iterations": calls, "wall_ms": wall_ms,
            "ops": [{"name": name, "self_cpu_us": self_us * calls, "cpu_total_us": total_us * calls,
                     "calls": count * calls} for name, self_us, total_us, count in ops]}


def start_helper() -> None:
    """A process of this one's group that never ends by itself; its pid goes to GRANDCHILD_PIDFILE."""
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(os.environ["GRANDCHILD_PIDFILE"], "w") as f:
        f.write(str(helper.pid))


def main() -> None:
    behaviour = sys.argv[1]
    if behaviour.endswith("-when-held"):  # misbehaves only when built beside another plan
        behaviour = behaviour.removesuffix("-when-held") if "--hold" in sys.argv else "ok"
    args = dict(zip(sys.argv[2::2], sys.argv[3::2], strict=False))  # `--hold`, a flag, comes last
    result, ready_fd = args["--result"], int(args["--ready-fd"])
    die_with_parent(int(args.get("--parent-pid", "-1")))  # as the real child: a killed autotune leaves no fake behind
    if behaviour == "crash-early":
        os.kill(os.getpid(), signal.SIGSEGV)
    if behaviour in ("helper-left", "grandchild-hang"):  # the first succeeds, as a child that skips teardown may
        start_helper()
    if behaviour in ("hang-early", "grandchild-hang"):
        time.sleep(3600)
    if behaviour == "phases":  # what the real child says while it builds (worker docstring, step 1)
        os.write(ready_fd, b"phase building\nphase compil")
        time.sleep(0.05)  # a line split across two reads is passed on once, whole
        os.write(ready_fd, b"ing\n")
    if behaviour == "slow-build":
        time.sleep(1.0)
    built_at = released_at = time.monotonic()
    if "--hold" in sys.argv:  # step 1's wait for its turn
        os.write(ready_fd, b"built\n")
        if sys.stdin.readline().strip() != "warm":
            sys.exit(1)
        released_at = time.monotonic()
    if behaviour == "crash-at-warmup":
        os.kill(os.getpid(), signal.SIGSEGV)
    os.write(ready_fd, b"ready\n")
    words = sys.stdin.readline().split()
    if len(words) != 3 or words[0] != "go":
        sys.exit(1)
    start, end = float(words[1]), float(words[2])
    time.sleep(max(start - time.monotonic(), 0.0))
    late = time.monotonic() - start
    if behaviour == "crash-late":
        print("about to crash", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGABRT)
    if behaviour == "exit-7":
        print("something went wrong", file=sys.stderr)
        sys.exit(7)
    if behaviour == "no-result":
        sys.exit(0)
    if behaviour == "hang-late":
        time.sleep(3600)
    time.sleep(max(end - time.monotonic(), 0.0))
    os.write(ready_fd, b"done\n")
    if behaviour == "slow-exit":  # result writing and exit are not part of the window
        time.sleep(1.0)
    runtime = {"env": dict(os.environ), "openmp_library": symbol_owner("omp_get_max_threads"),
               "malloc_library": symbol_owner("malloc")}
    payload = {"status": "ok", "latencies_ms": [10.0, 11.0, 12.0, 30.0],
               "iterations_ms": [11.0, 12.0, 13.0, 31.0], "cpu_s": 0.5, "items": 4, "window_s": 1.0, "span_s": 1.0,
               "window": {"start": start, "end": end}, "late_start_s": late, "throughput_ips": 4.0,
               "peak_rss_mb": 100.0, "setup_peak_rss_mb": 150.0, "runtime": runtime,
               "setup": {"built_at": built_at, "released_at": released_at}}
    if "--profile" in args:
        payload["profile"] = profiled(behaviour, int(args["--profile"]), args["--trace"])
    if behaviour == "bench-error":
        payload = {"status": "error", "reason": "mkldnn: aten::foo has no mkldnn kernel", "wrong_answers": False}
    if behaviour == "wrong-answers":
        payload = {"status": "error", "reason": "wrong answers: max relative error 0.2 > tolerance 0.001",
                   "wrong_answers": True}
    with open(result, "w") as f:
        json.dump(payload, f)
    sys.exit(3 if payload["status"] == "error" else 0)


if __name__ == "__main__":
    main()
