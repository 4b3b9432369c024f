"""How one PostgreSQL study scales with workers: per-trial overhead of claiming (sampler
included) and recording, the sampler's and the study lock's time as the study grows, the server's
connections, the workers' memory.

Each worker is tests/support/fleet_worker.py (the search loop with a fake measurement: no torch, a fixed
trial duration). A real server is started as in the tests (tests/support/pg.py), with max_connections for
the most workers asked (CONNECTIONS_PER_WORKER each, unless --max-connections says otherwise).

--seconds takes one duration, or one per worker count. Each run prints one JSON line (also in
OUT/fleet_scale.jsonl), then its RESULTS.md table row (also in OUT/fleet_scale.md); the workers'
stderr and timings stay in OUT. Takes 5 min for 16 workers x 1000 trials of 0.5 s, 9 min for 64
workers, 13 min for 64 workers x 1000 trials of 30 s (on 2 cores); --quick (1 and 4 workers, 20 and
40 trials of 0.2 s) is meant to take a minute. A worker that fails (e.g. refused a connection: "too
many clients") counts in `failed_workers` with its last stderr line, and the others go on;
--stop-after S interrupts a run's workers after S seconds (their trials so far are kept and the row
says "stopped"). The connection watcher holds one connection of its own from before the workers
start, so a full server cannot lock it out, and never waits on the server for long.

    .venv/bin/python benchmarks/fleet_scale.py --workers 1,4,16 --trials 200,200,1000 --seconds 0.5
    .venv/bin/python benchmarks/fleet_scale.py --workers 64 --trials 1000 --seconds 30 --stop-after 1500
    .venv/bin/python benchmarks/fleet_scale.py --quick
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from lib import common

sys.path.insert(0, str(common.REPO))  # the tests' server and worker, as the fleet tests start them

from tests.support.pg import Server, server

WORKER = common.REPO / "tests" / "support" / "fleet_worker.py"
SPACE = common.REPO / "search_spaces" / "default.yaml"
FULL = {"workers": "1,4,16,64", "trials": "1000,1000,1000,1000", "seconds": "0.5"}
QUICK = {"workers": "1,4", "trials": "20,40", "seconds": "0.2"}
# A worker's main thread holds the study lock's connection and its storage's at once, its heartbeat
# thread one more, and its pool keeps idle ones: 64 workers held 136 (2.1 each, at most 4 in one) at
# 10f4145. The watcher and creating the database need a few beside.
CONNECTIONS_PER_WORKER = 4
SPARE_CONNECTIONS = 10
POLL_S = 0.5
WATCH_TIMEOUT_S = 5  # connect and statement timeout of the watcher: it never waits longer on the server
STOP_GRACE_S = 30  # after SIGINT at --stop-after, before SIGKILL
BUCKET = 250  # study sizes are grouped by this many trials
PR_SET_PDEATHSIG = 1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


class Watcher(threading.Thread):
    """Every POLL_S: the database's client connections (in all, and per worker by application
    name), the workers' resident memory, the machine's available memory. Its own connection is
    opened before the workers start; a poll the server does not answer is counted, not waited on."""

    def __init__(self, pg: Server, database: str) -> None:
        super().__init__(daemon=True)
        self.pg, self.database, self.stop = pg, database, threading.Event()
        self.pids: list[int] = []
        self.peak = self.peak_per_worker = self.peak_workers = self.failed_polls = 0
        self.peak_rss_mb = 0.0
        self.worker_peak_rss_mb: dict[int, float] = {}
        self.lowest_available_mb = float("inf")
        self.conn = self._connect()

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(host=self.pg.host, port=self.pg.port, user=self.pg.user, dbname="postgres",
                               autocommit=True, connect_timeout=WATCH_TIMEOUT_S,
                               options=f"-c statement_timeout={WATCH_TIMEOUT_S * 1000}")

    def run(self) -> None:
        while not self.stop.wait(POLL_S):
            self._poll_server()
            self._poll_memory()

    def _poll_server(self) -> None:
        try:
            if self.conn.closed:
                self.conn = self._connect()
            rows = self.conn.execute("SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s "
                                     "GROUP BY application_name", (self.database,)).fetchall()
        except Exception:  # counted: the table says how often the server did not answer
            self.failed_polls += 1
            return
        per_worker = [int(n) for name, n in rows if str(name).startswith("w")]
        self.peak = max(self.peak, sum(int(n) for _, n in rows))
        self.peak_per_worker = max([self.peak_per_worker, *per_worker])
        self.peak_workers = max(self.peak_workers, len(per_worker))

    def _poll_memory(self) -> None:
        total = 0.0
        for pid in self.pids:
            status = _status(pid)
            if "VmRSS" in status:
                total += status["VmRSS"]
                self.worker_peak_rss_mb[pid] = max(self.worker_peak_rss_mb.get(pid, 0.0), status.get("VmHWM", 0.0))
        self.peak_rss_mb = max(self.peak_rss_mb, total)
        meminfo = _kb_fields(Path("/proc/meminfo"))
        if "MemAvailable" in meminfo:
            self.lowest_available_mb = min(self.lowest_available_mb, meminfo["MemAvailable"])

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=2 * WATCH_TIMEOUT_S + POLL_S)
        self.conn.close()


def _status(pid: int) -> dict[str, float]:
    return _kb_fields(Path(f"/proc/{pid}/status"))


def _kb_fields(path: Path) -> dict[str, float]:
    """The "Name:  123 kB" lines of a /proc file, in MB (empty once the process is gone)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        name, _, value = line.partition(":")
        if value.strip().endswith(" kB"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def _die_with_parent() -> None:
    """A worker is killed if the benchmark dies, however it dies: no orphan keeps the server busy."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def run(pg: Server, workers: int, trials: int, seconds: float, folder: Path, stop_after: float | None,
        heartbeat_s: int = 10) -> dict[str, Any]:
    url = pg.new_database()
    database = url.rsplit("/", 1)[1]
    watcher = Watcher(pg, database)
    started = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    interrupted: set[int] = set()
    try:
        for i in range(workers):  # before the watcher's thread starts: preexec_fn and threads do not mix
            with (folder / f"{workers}-{i}.err").open("wb") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, str(WORKER), f"{url}?application_name=w{i}", "scale", str(trials),
                     "--seconds", str(seconds), "--space", str(SPACE), "--heartbeat", str(heartbeat_s),
                     "--timings", str(folder / f"{workers}-{i}.jsonl")],
                    env={**os.environ, "AUTOTUNE_TEST_HOST_ID": f"h{i}"}, stdout=subprocess.DEVNULL, stderr=err,
                    preexec_fn=_die_with_parent))
        watcher.pids = [p.pid for p in procs]
        watcher.start()
        interrupted = _wait(procs, None if stop_after is None else started + stop_after)
    finally:
        for p in procs:  # only after an error or a signal: the workers have ended otherwise
            if p.poll() is None:
                p.kill()
                p.wait()
        watcher.finish()
    wall = time.monotonic() - started
    timings = [json.loads(line) for i in range(workers) if (folder / f"{workers}-{i}.jsonl").is_file()
               for line in (folder / f"{workers}-{i}.jsonl").read_text().splitlines()]
    failures = collections.Counter(_last_line(folder / f"{workers}-{i}.err").replace(f"?application_name=w{i}", "")
                                   for i, p in enumerate(procs)
                                   if p.returncode != 0 and i not in interrupted)
    return {**summarise(workers, trials, seconds, wall, timings),
            "stopped_after_s": stop_after if interrupted else None, "stopped_workers": len(interrupted),
            "failed_workers": sum(failures.values()), "failures": dict(failures),
            "exit_codes": sorted({p.returncode for p in procs}), "max_connections": pg.max_connections,
            "peak_connections": watcher.peak, "peak_connections_per_worker": watcher.peak_per_worker,
            "peak_workers_connected": watcher.peak_workers, "unanswered_polls": watcher.failed_polls,
            "peak_workers_rss_mb": round(watcher.peak_rss_mb),
            "peak_worker_rss_mb": round(max(watcher.worker_peak_rss_mb.values(), default=0.0)),
            "lowest_mem_available_mb": round(watcher.lowest_available_mb)}


def _wait(procs: list[subprocess.Popen[bytes]], deadline: float | None) -> set[int]:
    """Wait for the workers; at the deadline interrupt those still running (their trials are
    recorded failed, their timings so far kept), then kill what is left. Returns the interrupted
    workers' indexes."""
    while any(p.poll() is None for p in procs):
        if deadline is not None and time.monotonic() > deadline:
            interrupted = {i for i, p in enumerate(procs) if p.poll() is None}
            for i in interrupted:
                procs[i].send_signal(signal.SIGINT)
            end = time.monotonic() + STOP_GRACE_S
            while any(p.poll() is None for p in procs) and time.monotonic() < end:
                time.sleep(0.2)
            return interrupted
        time.sleep(0.2)
    return set()


def _last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
    return lines[-1][:300] if lines else "(nothing on stderr)"


def summarise(workers: int, trials: int, seconds: float, wall: float,
              timings: list[dict[str, float]]) -> dict[str, Any]:
    done = [t for t in timings if "store_s" in t]
    overhead = [t["claim_s"] + t["store_s"] for t in done]
    by_size: dict[int, list[dict[str, float]]] = {}
    for t in done:
        by_size.setdefault(int(t["trials"]) // BUCKET * BUCKET, []).append(t)

    def by_study_size(key: str, scale: float = 1000.0) -> dict[str, float]:
        """The median per bucket of study sizes (in ms for seconds)."""
        return {f"{k}-{k + BUCKET - 1}": round(statistics.median(t.get(key, 0.0) for t in v) * scale, 1)
                for k, v in sorted(by_size.items())}

    return {"workers": workers, "trials": len(done), "target": trials, "seconds_per_trial": seconds,
            "wall_s": round(wall, 1), "trials_per_min": round(len(done) / wall * 60, 1),
            "ideal_trials_per_min": round(workers * 60 / seconds, 1),
            "overhead_p50_ms": round(percentile(overhead, 0.5) * 1000, 1),
            "overhead_p99_ms": round(percentile(overhead, 0.99) * 1000, 1),
            "claim_p50_ms": round(percentile([t["claim_s"] for t in done], 0.5) * 1000, 1),
            "store_p50_ms": round(percentile([t["store_s"] for t in done], 0.5) * 1000, 1),
            "lock_wait_p50_ms": round(percentile([t.get("wait_s", 0.0) for t in done], 0.5) * 1000, 1),
            "sampler_ms_by_study_size": by_study_size("sampler_s"),
            "lock_held_ms_by_study_size": by_study_size("held_s"),
            "lock_held_cpu_ms_by_study_size": by_study_size("held_cpu_s"),
            "queries_in_lock_by_study_size": by_study_size("read_queries", 1),
            "trials_read_in_lock_by_study_size": by_study_size("read_trials", 1),
            "lock_wait_ms_by_study_size": by_study_size("wait_s"),
            "trials_per_min_by_study_size": _rate_by_size(done)}


def _rate_by_size(done: list[dict[str, float]]) -> dict[str, float]:
    """Trials recorded per minute while the study grew through each bucket of sizes."""
    ends = sorted(t["at"] for t in done if "at" in t)
    rates = {}
    for k in range(0, len(ends), BUCKET):
        chunk = ends[k:k + BUCKET]
        if len(chunk) > 1 and chunk[-1] > chunk[0]:
            rates[f"{k}-{k + len(chunk) - 1}"] = round((len(chunk) - 1) / (chunk[-1] - chunk[0]) * 60, 1)
    return rates


def row(result: dict[str, Any]) -> str:
    """The table row of benchmarks/RESULTS.md."""
    workers = f"{result['workers']} ({result['seconds_per_trial']:g} s trials)"
    if result["failed_workers"]:
        workers += f", {result['failed_workers']} failed"
    trials = f"{result['trials']}" + (f" of {result['target']}, stopped" if result["stopped_after_s"] else "")
    sampler = ", ".join(f"{ms:.0f} ({size})" for size, ms in result["sampler_ms_by_study_size"].items())
    return (f"| {workers} | {trials} | {result['trials_per_min']:.0f} ({result['ideal_trials_per_min']:.0f}) "
            f"| {result['overhead_p50_ms']:.0f} / {result['overhead_p99_ms']:.0f} "
            f"| {result['claim_p50_ms']:.0f} / {result['store_p50_ms']:.0f} | {sampler} "
            f"| {result['peak_connections']} of {result['max_connections']} |")


def main() -> None:
    args = parse()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `timeout` still stops the workers and the server
    counts, totals = [int(w) for w in args.workers.split(",")], [int(t) for t in args.trials.split(",")]
    durations = [float(s) for s in args.seconds.split(",")]
    durations = durations * len(counts) if len(durations) == 1 else durations
    connections = args.max_connections or max(counts) * CONNECTIONS_PER_WORKER + SPARE_CONNECTIONS
    found = common.provenance(args.out)
    rows = [common.provenance_line(found), "",
            "| workers | trials | trials/min (ideal) | overhead per trial p50 / p99 ms | of it: claim p50 / record "
            "p50 ms | sampler ms by study size | peak connections |", "|---|---|---|---|---|---|---|"]
    with server(max_connections=connections) as pg, open(args.out / "fleet_scale.jsonl", "a") as log:
        for workers, trials, seconds in zip(counts, totals, durations, strict=True):
            result = run(pg, workers, trials, seconds, args.out, args.stop_after)
            print(json.dumps(result), flush=True)
            print(json.dumps(result), file=log, flush=True)
            print(row(result), flush=True)
            rows.append(row(result))
    (args.out / "fleet_scale.md").write_text("\n".join(rows) + "\n")


def parse() -> argparse.Namespace:
    p = common.parser(__doc__, f"{QUICK['workers']} workers, {QUICK['trials']} trials of {QUICK['seconds']} s")
    p.add_argument("--workers", help=f"worker counts, one run each (default {FULL['workers']})")
    p.add_argument("--trials", help=f"total trials per worker count (default {FULL['trials']})")
    p.add_argument("--seconds", help=f"fixed duration of one fake trial, or one per worker count (default "
                   f"{FULL['seconds']})")
    p.add_argument("--stop-after", type=float, help="interrupt a run's workers after this many seconds")
    p.add_argument("--max-connections", type=int,
                   help=f"the server's (default: {CONNECTIONS_PER_WORKER} per worker + {SPARE_CONNECTIONS})")
    args = p.parse_args()
    common.fill(args, FULL, QUICK)
    args.out = common.out_folder(args.out, "autotune-fleet-scale-")
    return args


if __name__ == "__main__":
    main()
