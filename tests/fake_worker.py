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

from autotune.child.worker import symbol_owner


def main() -> None:
    behaviour = sys.argv[1]
    args = dict(zip(sys.argv[2::2], sys.argv[3::2], strict=False))
    result, ready_fd = args["--result"], int(args["--ready-fd"])
    if behaviour == "crash-early":
        os.kill(os.getpid(), signal.SIGSEGV)
    if behaviour == "hang-early":
        time.sleep(3600)
    if behaviour == "grandchild-hang":
        pidfile = os.environ["GRANDCHILD_PIDFILE"]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(pidfile, "w") as f:
            f.write(str(child.pid))
        time.sleep(3600)
    if behaviour == "phases":  # what the real child says while it builds (worker docstring, step 1)
        os.write(ready_fd, b"phase building\nphase compil")
        time.sleep(0.05)  # a line split across two reads is passed on once, whole
        os.write(ready_fd, b"ing\n")
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
               "iterations_ms": [11.0, 12.0, 13.0, 31.0], "cpu_s": 0.5, "items": 4, "window_s": 1.0,
               "window": {"start": start, "end": end}, "late_start_s": late, "throughput_ips": 4.0,
               "peak_rss_mb": 100.0, "setup_peak_rss_mb": 150.0, "runtime": runtime}
    if behaviour == "bench-error":
        payload = {"status": "error", "reason": "mkldnn: aten::foo has no mkldnn kernel"}
    with open(result, "w") as f:
        json.dump(payload, f)
    sys.exit(3 if behaviour == "bench-error" else 0)


if __name__ == "__main__":
    main()
