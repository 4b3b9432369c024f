"""One worker of a shared study, as `autotune search --storage URL --study S` runs it, with a fake
measurement instead of the benchmark child: no torch, a fixed trial duration, and a latency that
is a fixed function of the configuration times this host's speed. For tests/search/test_fleet.py and
benchmarks/fleet_scale.py.

    python tests/support/fleet_worker.py URL STUDY TRIALS [--seconds S] [--speed F] [--lscpu NAME]
        [--space PATH] [--allow-mixed] [--timings FILE] [--heartbeat S]

The host is named by AUTOTUNE_TEST_HOST_ID (the tests' host identity). Exit code 2 with one line
on stderr for a user-facing error, as the CLI does. --timings appends one JSON line per trial as
soon as it is recorded (a worker stopped midway keeps what it did): the study's size when it was
claimed, the seconds spent claiming it (waiting for the study's lock, then holding it; the sampler
within), and recording it, and when it was recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from autotune.base.errors import AutotuneError  # noqa: E402
from autotune.config import models  # noqa: E402
from autotune.host import machine  # noqa: E402
from autotune.host.libs import Libraries  # noqa: E402
from autotune.host.topology import from_lscpu_file  # noqa: E402
from autotune.measure.plan import LaunchPlan  # noqa: E402
from autotune.measure.replicates import ReplicatePolicy  # noqa: E402
from autotune.measure.results import InstanceResult, RunResult  # noqa: E402
from autotune.search import (  # noqa: E402
    fleet,
    loop,
    opening,
    proposals,
    trial_outcome,
)
from autotune.study import (  # noqa: E402
    claims,
    storage,
)
from tests.support import probes  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
VERSIONS = {"torch": "2.14.1+fake", "onednn": "3.9", "mkldnn_available": "true"}
TIMINGS: list[dict[str, float]] = []
READ = {"queries": 0, "trials": 0}  # trial reads from the server (Optuna's cache asks for new and unfinished ones)


def latency_ms(describe: str, speed: float) -> float:
    """A fixed landscape: each configuration's latency in 50..150 ms, divided by the host's speed."""
    digest = int(hashlib.sha256(describe.encode()).hexdigest()[:8], 16)
    return (100.0 if describe == "defaults" else 50.0 + digest % 10_000 / 100.0) / speed


def runner(seconds: float, speed: float) -> loop.PlanRunner:
    def run(plan: LaunchPlan, timeout_s: float) -> RunResult:
        time.sleep(seconds)
        base = latency_ms(plan.config.describe() if plan.config.values else "defaults", speed)
        latencies = [base * (1 + jitter) for jitter in (-0.01, -0.005, 0.0, 0.005, 0.01)]
        metrics = {"latencies_ms": latencies, "iterations_ms": latencies, "throughput_ips": 1000 / base,
                   "peak_rss_mb": 100.0, "window_s": seconds, "items": len(latencies), "cpu_s": seconds,
                   "setup_peak_rss_mb": 100.0}
        return RunResult(True, "", (InstanceResult(0, True, "", 0, "", metrics),), seconds)

    return run


def without_torch() -> None:
    """The fake host reports fixed torch versions and knows resnet18 without importing torch (a
    worker stays ~100 MB instead of ~450 MB: 64 of them fit in memory)."""
    machine.torch_versions = lambda: dict(VERSIONS)  # type: ignore[assignment]
    opening.torch_versions = machine.torch_versions  # type: ignore[attr-defined]
    claims.host_fingerprint = lambda m: {"hostname": machine.host_name(), **machine.fingerprint(m)}
    models.classification_models = lambda: ("resnet18",)  # type: ignore[assignment]  # not torchvision's


def timed(path: Path) -> None:
    """Seconds spent in claiming (waiting for the study's lock, holding it: in all, on this
    thread's CPU, and the sampler within; and the trial reads from the server meanwhile) and in
    recording, per trial: one line appended to `path` when the trial is recorded."""
    claim, store, propose, exclusive = fleet.claim, trial_outcome.store, proposals.Proposer.next, storage.exclusive
    get_trials = optuna.storages.RDBStorage._get_trials
    path.write_text("")

    def timed_claim(worker: Any) -> Any:
        TIMINGS.append({"sampler_s": 0.0, "trials": float(len(worker.study.get_trials(deepcopy=False)))})
        start = time.perf_counter()
        result = claim(worker)
        TIMINGS[-1]["claim_s"] = time.perf_counter() - start
        return result

    @contextlib.contextmanager
    def timed_exclusive(study: Any) -> Iterator[None]:
        if not TIMINGS or "claim_s" in TIMINGS[-1]:  # the lock outside a claim (opening the study, accounting)
            with exclusive(study):
                yield
            return
        start = time.perf_counter()
        with exclusive(study):
            got, cpu, read = time.perf_counter(), time.thread_time(), dict(READ)
            TIMINGS[-1]["wait_s"] = got - start
            try:
                yield
            finally:
                TIMINGS[-1].update(held_s=time.perf_counter() - got, held_cpu_s=time.thread_time() - cpu,
                                   read_queries=READ["queries"] - read["queries"],
                                   read_trials=READ["trials"] - read["trials"])

    def counted_get_trials(self: Any, *args: Any, **kwargs: Any) -> Any:
        trials = get_trials(self, *args, **kwargs)
        READ["queries"] += 1
        READ["trials"] += len(trials)
        return trials

    def timed_store(*args: Any) -> None:
        start = time.perf_counter()
        store(*args)
        TIMINGS[-1]["store_s"] = time.perf_counter() - start
        TIMINGS[-1]["at"] = time.time()
        with path.open("a") as out:
            out.write(json.dumps(TIMINGS[-1]) + "\n")

    def timed_propose(self: Any, *args: Any) -> Any:
        start = time.perf_counter()
        result = propose(self, *args)
        TIMINGS[-1]["sampler_s"] += time.perf_counter() - start
        return result

    fleet.claim = timed_claim  # type: ignore[assignment]
    storage.exclusive = timed_exclusive  # type: ignore[assignment]
    optuna.storages.RDBStorage._get_trials = counted_get_trials  # type: ignore[method-assign]
    trial_outcome.store = timed_store  # type: ignore[assignment]
    proposals.Proposer.next = timed_propose  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("url", "study"):
        parser.add_argument(name)
    parser.add_argument("trials", type=int)
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--lscpu", default="amd_1s_smt")
    parser.add_argument("--space", default=str(ROOT / "search_spaces" / "quick.yaml"))
    parser.add_argument("--allow-mixed", action="store_true")
    parser.add_argument("--timings")
    parser.add_argument("--heartbeat", type=int, default=1)
    args = parser.parse_args()
    storage.HEARTBEAT_INTERVAL_S, storage.GRACE_PERIOD_S = args.heartbeat, 3 * args.heartbeat
    without_torch()
    if args.timings:
        timed(Path(args.timings))
    libs = Libraries(paths={name: Path(f"/opt/fake/{name}.so") for name in ("libiomp5", "libomp", "jemalloc",
                                                                           "tcmalloc")},
                     numactl=Path("/usr/bin/numactl"), numactl_usable=True, taskset=Path("/usr/bin/taskset"))
    here = machine.Machine(from_lscpu_file(FIXTURES / "lscpu" / f"{args.lscpu}.txt"), libs)
    request = opening.SearchRequest(model="resnet18", trials=args.trials, space=Path(args.space),
                                        study=args.study, storage=args.url, allow_mixed=args.allow_mixed,
                                        replicates=ReplicatePolicy(replicates=1), studies_dir=Path("/nonexistent"))
    try:
        opened = opening.open_search(request, here, probe=probes.everything_runs())  # its measurements are made up too
        loop.run_search(opened, here, lambda event: None, runner=runner(args.seconds, args.speed))
    except AutotuneError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
