"""Inside the benchmark child: `--profile K` runs K forward calls under `torch.profiler` instead of the
timed loop, writes the Chrome trace to `--trace` and returns the per-op table for the result file.

Only the forward calls are profiled (the span that latency times): a few batches are fetched before
the profiler starts and cycled, so the input pipeline's own ops do not mix into the model's table.
"""

from __future__ import annotations

import time
from typing import Any

PROFILED_BATCHES = 4  # inputs fetched up front and cycled: few, so a large batch does not hold K copies


def profiled_loop(forward: Any, batches: Any, start: float, iterations: int, trace: str) -> dict[str, Any]:
    """K forward calls from `start` (CLOCK_MONOTONIC) under the profiler; the op table, totals over K."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    inputs = [next(batches) for _ in range(min(iterations, PROFILED_BATCHES))]
    with torch.no_grad():
        time.sleep(max(start - time.monotonic(), 0.0))
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            began = time.perf_counter()
            for index in range(iterations):
                forward(inputs[index % len(inputs)])
            wall_ms = (time.perf_counter() - began) * 1e3
    prof.export_chrome_trace(trace)
    return {"profile": {"iterations": iterations, "wall_ms": wall_ms, "ops": op_table(prof.key_averages())}}


def op_table(averages: Any) -> list[dict[str, Any]]:
    """One row per op name: self and total CPU time in microseconds over all iterations, and calls."""
    return [{"name": str(event.key), "self_cpu_us": float(event.self_cpu_time_total),
             "cpu_total_us": float(event.cpu_time_total), "calls": int(event.count)} for event in averages]
