"""How one PostgreSQL study scales with workers: per-trial overhead of claiming (sampler
included) and recording, the sampler's time as the study grows, the server's connections.

Each worker is tests/fleet_worker.py (the search loop with a fake measurement: no torch, a fixed
trial duration). A real server is started as in the tests (tests/pg.py).

    python benchmarks/fleet_scale.py --workers 1,4,16 --trials 200,200,1000 --seconds 0.5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.pg import Server, server  # noqa: E402

WORKER = ROOT / "tests" / "fleet_worker.py"
SPACE = ROOT / "search_spaces" / "default.yaml"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def run(pg: Server, workers: int, trials: int, seconds: float, folder: Path) -> dict[str, Any]:
    url = pg.new_database()
    database = url.rsplit("/", 1)[1]
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.wait(0.5):
            peak[0] = max(peak[0], pg.connections(database))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, str(WORKER), url, "scale", str(trials), "--seconds", str(seconds),
                               "--space", str(SPACE), "--timings", str(folder / f"{workers}-{i}.jsonl"),
                               "--heartbeat", "10"], env={**os.environ, "AUTOTUNE_TEST_HOST_ID": f"h{i}"})
             for i in range(workers)]
    codes = [p.wait() for p in procs]
    wall = time.monotonic() - started
    stop.set()
    watcher.join()
    timings = [json.loads(line) for i in range(workers)
               for line in (folder / f"{workers}-{i}.jsonl").read_text().splitlines()]
    return summarise(workers, trials, seconds, wall, codes, peak[0], timings)


def summarise(workers: int, trials: int, seconds: float, wall: float, codes: list[int], peak: int,
              timings: list[dict[str, float]]) -> dict[str, Any]:
    done = [t for t in timings if "store_s" in t]
    overhead = [t["claim_s"] + t["store_s"] for t in done]
    by_size: dict[int, list[float]] = {}
    for t in done:
        by_size.setdefault(int(t["trials"]) // 250 * 250, []).append(t["sampler_s"])
    return {"workers": workers, "trials": len(done), "target": trials, "seconds_per_trial": seconds,
            "exit_codes": sorted(set(codes)), "wall_s": round(wall, 1),
            "trials_per_min": round(len(done) / wall * 60, 1),
            "ideal_trials_per_min": round(workers * 60 / seconds, 1),
            "overhead_p50_ms": round(percentile(overhead, 0.5) * 1000, 1),
            "overhead_p99_ms": round(percentile(overhead, 0.99) * 1000, 1),
            "claim_p50_ms": round(percentile([t["claim_s"] for t in done], 0.5) * 1000, 1),
            "store_p50_ms": round(percentile([t["store_s"] for t in done], 0.5) * 1000, 1),
            "sampler_ms_by_study_size": {f"{k}-{k + 249}": round(statistics.median(v) * 1000, 1)
                                         for k, v in sorted(by_size.items())},
            "peak_connections": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,4,16,64")
    parser.add_argument("--trials", default="1000,1000,1000,1000", help="total trials per worker count")
    parser.add_argument("--seconds", type=float, default=0.5, help="fixed duration of one fake trial")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `timeout` still stops the server
    counts, totals = [int(w) for w in args.workers.split(",")], [int(t) for t in args.trials.split(",")]
    with server() as pg, tempfile.TemporaryDirectory() as folder:
        for workers, trials in zip(counts, totals, strict=True):
            print(json.dumps(run(pg, workers, trials, args.seconds, Path(folder))), flush=True)


if __name__ == "__main__":
    main()
