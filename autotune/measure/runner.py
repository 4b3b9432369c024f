"""Execute a `LaunchPlan`: start every instance, barrier, common window, kill and reap, collect.

The protocol with each child is documented in `autotune.child.worker`: after every child said
`ready`, each is sent the same window (`go START END`, CLOCK_MONOTONIC seconds a short lead from
now), and each says `done` when its timed loop ends; the noise snapshots span START to the last
`done`, the children's timed loops, not their result writing and exit. What each child is doing
(its `phase` lines before `ready`, then waiting and measuring) goes to an optional callback, for
live progress. A series of plans (`run_series`, a confirmation's rounds) builds two plans at a
time where memory allows: their children start together, say `built` and wait until their turn,
sent as `warm`.

Every outcome is a result: a crash, a non-zero exit, a hang past the timeout or a missing result
file becomes a failed `InstanceResult` with its reason and stderr tail. Each child runs in its own
session so that its whole process group (DataLoader workers included) is killed on the way out,
on success, failure, timeout and Ctrl-C alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from autotune.base import tempdirs
from autotune.host import cpustat
from autotune.measure import noise
from autotune.measure.children import (
    MEASURING,
    Child,
    PhaseCallback,
    barrier,
    collect,
    hear,
    ignore,
    kill_all,
    send_go,
    start_child,
    stop_unfinished,
    tell,
    timed_out_setup,
    wait_done,
)
from autotune.measure.plan import LaunchPlan
from autotune.measure.results import InstanceResult, RunResult, combine, stopped_by

# Plans of a series built at the same time (`run_series`): on this 2-CPU machine a process builds on
# about one CPU (interpreter, imports, model), so two fill both CPUs; measured in
# benchmarks/RESULTS.md ("Building two at a time").
SIDE_BY_SIDE = 2
# The share of the available memory that plans built together may hold at their peaks, added: the
# rest is for the page cache, autotune and whatever else the machine runs.
MEMORY_SHARE = 0.8
# The CPUs' snapshots at the start of a plan's window and when its last timed loop ended.
_Window = tuple[cpustat.Snapshot | None, cpustat.Snapshot | None]


def run_plan(plan: LaunchPlan, timeout_s: float, parent_env: Mapping[str, str] | None = None,
             on_phase: PhaseCallback = ignore) -> RunResult:
    """Run all instances together; a run where any instance fails has failed. `on_phase` hears
    what each instance is doing while it runs."""
    return next(_run_group((plan,), timeout_s, dict(os.environ if parent_env is None else parent_env), on_phase))


def run_series(plans: Sequence[LaunchPlan], timeout_s: float, parent_env: Mapping[str, str] | None = None,
               available_mb: Callable[[], float] = lambda: psutil.virtual_memory().available / 2**20,
               expected_mb: Callable[[LaunchPlan], float | None] = lambda plan: None,
               ) -> Generator[RunResult, None, None]:
    """Each plan's result in turn, as `run_plan` gives it, building `SIDE_BY_SIDE` plans at a time
    where memory allows: their processes start together and build (imports, model, compiled
    artifact) side by side, then each plan in turn warms up and measures alone while the other
    waits, idle, at the protocol's `built` step (see `autotune.child.worker`). A plan's `timeout_s`
    counts its building and its own turn, not the wait; its `wall_s` is from the later of the
    group's start and the previous plan's end to its exit, so the results' walls add up to the
    series' wall. Plans are built together only when their peaks, added, fit in `MEMORY_SHARE` of
    `available_mb()`: a configuration must not fail for want of the memory its neighbour holds. A
    plan's peak is the one it recorded when it once succeeded in this series, else
    `expected_mb(plan)` (a benchmark's knowledge); unknown (None, the default), it runs alone."""
    return Series(parent_env, available_mb, expected_mb)(plans, timeout_s)


class Series:
    """`run_series` over several calls: a plan that once succeeded in any of them keeps its peak,
    so that a confirmation that runs its rounds one call at a time builds each plan beside another
    from its second round on, as one long series would."""

    def __init__(self, parent_env: Mapping[str, str] | None = None,
                 available_mb: Callable[[], float] = lambda: psutil.virtual_memory().available / 2**20,
                 expected_mb: Callable[[LaunchPlan], float | None] = lambda plan: None) -> None:
        self.env = dict(os.environ if parent_env is None else parent_env)
        self.available_mb = available_mb
        self.expected_mb = expected_mb
        self.peaks: dict[str, float] = {}  # each plan's peak memory, once it succeeded

    def __call__(self, plans: Sequence[LaunchPlan], timeout_s: float) -> Generator[RunResult, None, None]:
        first = 0
        while first < len(plans):
            group = _next_group(plans[first:first + SIDE_BY_SIDE], self.peaks, self.available_mb, self.expected_mb)
            with contextlib.closing(_run_group(group, timeout_s, self.env, ignore)) as results:  # closed early: killed
                for plan, result in zip(group, results, strict=True):
                    if result.ok:
                        self.peaks[_key(plan)] = max(result.peak_rss_mb, result.setup_peak_rss_mb)
                    yield result
            first += len(group)


def built_beside(rounds: int, contenders: int) -> int:
    """How many processes of a confirmation's `rounds` rounds of `contenders` (each round a call of
    one `Series`) are built beside an earlier one when memory allows: each contender runs alone in
    the first round, then a round builds its runs `SIDE_BY_SIDE` at a time."""
    return max(rounds - 1, 0) * (contenders - math.ceil(contenders / SIDE_BY_SIDE))


def _next_group(upcoming: Sequence[LaunchPlan], peaks: Mapping[str, float], available_mb: Callable[[], float],
                expected_mb: Callable[[LaunchPlan], float | None]) -> tuple[LaunchPlan, ...]:
    """The next plans to build together: all of `upcoming` when each one's peak is known (it ran
    before) or expected, and they fit in memory together; else the first alone."""
    known = [peaks.get(_key(plan), expected_mb(plan)) for plan in upcoming]
    if len(upcoming) > 1 and None not in known and sum(filter(None, known)) <= MEMORY_SHARE * available_mb():
        return tuple(upcoming)
    return tuple(upcoming[:1])


def _key(plan: LaunchPlan) -> str:
    """A plan's identity across a series: the same plan repeated in rounds is one key."""
    return json.dumps(dataclasses.asdict(plan), sort_keys=True, default=str)


@dataclass
class _Run:
    """One plan's processes in a group, or why they could not all start."""

    plan: LaunchPlan
    children: list[Child]
    unstarted: InstanceResult | None = None

    def built_s(self, start: float) -> float:
        """Seconds from `start` until its last process said `built` (or now, if one did not, as a
        plan run alone never does: its turn is then the rest of its timeout)."""
        return max((c.built_at or time.monotonic() for c in self.children), default=start) - start

    def result(self, wall_s: float, window: _Window) -> RunResult:
        collected = tuple(collect(c) for c in self.children)
        before, after = window
        disturbance = noise.noise(before, after, collected) if before and after else {}
        return combine((*collected, self.unstarted) if self.unstarted else collected, wall_s, disturbance)


def _run_group(plans: tuple[LaunchPlan, ...], timeout_s: float, env: Mapping[str, str],
               on_phase: PhaseCallback) -> Generator[RunResult, None, None]:
    """Start every plan of the group, wait until all of them built when there are several, then
    run each one's turn (warmup, barrier, window) and yield its result."""
    hold = len(plans) > 1
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=tempdirs.prefix("run")) as tmp:
        runs: list[_Run] = []
        try:
            for number, plan in enumerate(plans):
                runs.append(_start_plan(plan, Path(tmp, str(number)), env, hold))
            if hold:
                _build_together(runs, start + timeout_s, timeout_s)
            turn_start = start
            for run in runs:
                deadline = time.monotonic() + timeout_s - run.built_s(start)  # its build and its turn
                window = _turn(run, deadline, timeout_s, on_phase, hold) if not run.unstarted else (None, None)
                kill_all(run.children)
                result = run.result(time.monotonic() - turn_start, window)
                turn_start = time.monotonic()
                yield result
        finally:
            for run in runs:
                kill_all(run.children)


def _start_plan(plan: LaunchPlan, folder: Path, env: Mapping[str, str], hold: bool) -> _Run:
    """Start every instance; one that cannot start stops the others started before it."""
    folder.mkdir()
    run = _Run(plan, [])
    try:
        for instance in plan.instances:
            run.children.append(start_child(instance, plan.binding, folder, env, hold))
    except OSError as exc:  # could not start an instance (e.g. a binding tool is missing)
        index = len(run.children)
        stop_unfinished(run.children, stopped_by(index, "could not start"))
        run.unstarted = InstanceResult(index, False, f"could not start: {exc}", None, "")
    return run


def _build_together(runs: list[_Run], deadline: float, timeout_s: float) -> None:
    """Wait until every started process said `built` or exited. Whatever is still building at the
    deadline is stopped."""
    children = [c for run in runs for c in run.children]
    if not hear(children, b"built", deadline, stop_on_exit=False):
        stop_unfinished([c for c in children if not c.said(b"built")], timed_out_setup(timeout_s))


def _turn(run: _Run, deadline: float, timeout_s: float, on_phase: PhaseCallback, held: bool) -> _Window:
    """One plan's turn: release it (when held), barrier, window; the CPUs' snapshots around it."""
    children = run.children
    if held:
        failed = [c for c in children if not c.said(b"built")]
        if failed:
            stop_unfinished(children, stopped_by(failed[0].plan.index))
            return None, None
        tell(children, b"warm\n")
    if not barrier(children, deadline, timeout_s, on_phase):
        return None, None
    return _measure(children, run.plan.bench.measure.duration_s, deadline, timeout_s, on_phase)


def _measure(children: list[Child], duration_s: float, deadline: float, timeout_s: float,
             on_phase: PhaseCallback) -> _Window:
    """Send the common window, snapshot the CPUs at its start and when the last timed loop ends."""
    window_start = send_go(children, duration_s)
    for child in children:
        on_phase(child.plan.index, MEASURING)
    time.sleep(max(window_start - time.monotonic(), 0.0))
    before = cpustat.snapshot()
    if not hear(children, b"done", deadline, stop_on_exit=False):
        stop_unfinished(children, f"timed out after {timeout_s:g}s while measuring")
    after = cpustat.snapshot()
    wait_done(children, deadline, timeout_s)
    return before, after


