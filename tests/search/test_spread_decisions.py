"""Decisions under spread (issue 68): a window wider than this host's floor, with no sign that
anything else ran, is read as the distribution it is. A stop whose median's 95% interval clears
the line it crossed stands (pruned); one whose interval reaches back over it decides nothing and is
measured again at most once. Disturbed windows (test_noisy_stops) never decide."""

from __future__ import annotations

import re
from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from autotune.base.thresholds import NOISY_RETRIES
from autotune.host import floor
from autotune.host.machine import Machine
from autotune.measure import replicates
from autotune.measure.plan import LaunchPlan
from autotune.measure.results import RunResult
from autotune.search import loop, opening, pruning
from autotune.study import records, undecided
from tests.search.test_give_up import gave_up
from tests.support.studies import fake_result, request

WARM = replicates.ReplicatePolicy(replicates=3, max_extra=0, in_process=True)
OFFSETS = (-1.0, 1.0, -0.5, 0.5, 0.0, -0.8, 0.8, -0.3, 0.3, 0.1)  # symmetric about 0: the median is the latency


class Wide:
    """test_noisy_stops' honest child on a quiet machine (other processes 1% of the CPUs) whose
    windows spread `width` either side of each configuration's latency: mkldnn reads 300 ms where
    the best reads 80, so it gives up after its first window (its limit is 2x the best)."""

    def __init__(self, width: float) -> None:
        self.width = width

    def __call__(self, plan: LaunchPlan, timeout_s: float) -> RunResult:
        config = plan.config
        latency = 100.0 - 20 * (config.get("allocator") == "jemalloc") + 60 * (config.get("omp_runtime") == "intel")
        latency += 200 * bool(config.get("mkldnn"))
        samples = [latency * (1 + self.width * OFFSETS[i % 10]) for i in range(30)]
        command = plan.instances[0].command
        given = command[command.index("--give-up-above-ms") + 1] if "--give-up-above-ms" in command else ""
        result = fake_result(samples)
        for windows, limit in enumerate((float(v) for v in given.split(",") if v), start=1):
            if latency > limit:
                result = gave_up(latency, limit, windows)
                result.instances[0].metrics["latencies_ms"] = samples[:10 * windows]  # type: ignore[index]
                break
        return RunResult(result.ok, result.reason, result.instances, result.wall_s, {"other_cpu_share": 0.01})


def search(tmp_path: Path, here: Machine, width: float, trials: int = 8) -> list[FrozenTrial]:
    """A search on a host whose floor, kept from 200 earlier windows, is 2%."""
    kept = floor.here(tmp_path / "cache", len(here.topology.usable_cores))
    floor.save(kept.adding([0.02] * 200))
    opened = opening.open_search(request(tmp_path, trials, replicates=WARM), here)
    loop.run_search(opened, here, lambda event: None, runner=Wide(width))
    return opened.study.get_trials()


def test_a_wide_window_whose_interval_clears_the_line_is_pruned_not_left_undecided(tmp_path: Path,
                                                                                  here: Machine) -> None:
    trials = search(tmp_path, here, 0.3)
    slow = [t for t in trials if t.user_attrs.get("latency_p50_ms", 0) > 250]  # mkldnn: 300 ms, its line 200
    assert slow and not [t.user_attrs["fail_reason"] for t in slow if records.fail_cause(t) == records.UNDECIDED]
    pruned = [t for t in trials if t.state == TrialState.PRUNED and "wider than this host's floor" in
              t.user_attrs.get("prune_reason", t.user_attrs.get("fail_reason", ""))]
    assert pruned, "mkldnn gave up on a window wider than the floor"
    for t in pruned:
        reason = t.user_attrs.get("prune_reason", t.user_attrs.get("fail_reason", ""))
        assert re.search(r"its median's 95% CI over \d+ samples, [\d.]+-[\d.]+ ms, lies above [\d.]+ ms", reason)
        assert t.user_attrs["noisy"] and not t.user_attrs["disturbed"]


def test_a_wide_window_whose_interval_reaches_back_is_measured_again_at_most_once(tmp_path: Path,
                                                                                 here: Machine) -> None:
    trials = search(tmp_path, here, 0.9)
    stops = [t for t in trials if records.fail_cause(t) == records.UNDECIDED]
    assert stops, "mkldnn gave up on a window too wide to say it is slower"
    for t in stops:
        assert "> this host's floor" in t.user_attrs["fail_reason"]  # 2%, then what the search taught it
        assert len(t.user_attrs.get(undecided.ATTEMPTS, [])) <= NOISY_RETRIES
    assert not [t for t in trials if t.state == TrialState.PRUNED and "wider than this host's floor"
                in t.user_attrs.get("prune_reason", "")]


def test_a_search_teaches_the_floor_its_undisturbed_windows(tmp_path: Path, here: Machine) -> None:
    search(tmp_path, here, 0.3, trials=4)
    learned = floor.here(tmp_path / "cache", len(here.topology.usable_cores))
    assert len(learned.spreads) > 200 and max(learned.spreads) > 0.2


def test_clear_under_spread_reads_the_stopped_instances_samples_against_its_windows_limit() -> None:
    limit = pruning.GiveUp((200.0, 150.0), 0, 100.0, "latency_p50_ms")
    far = replicates.Measurement((gave_up(300.0, 200.0),), stopped_early=True, floor=0.02)
    far.runs[0].instances[0].metrics["latencies_ms"] = [300 * (1 + 0.3 * o) for o in OFFSETS]  # type: ignore[index]
    assert "lies above 200.00 ms" in pruning.clear_under_spread(far, limit, _no_prune())
    near = replicates.Measurement((gave_up(210.0, 200.0),), stopped_early=True, floor=0.02)
    near.runs[0].instances[0].metrics["latencies_ms"] = [210 * (1 + 0.3 * o) for o in OFFSETS]  # type: ignore[index]
    assert pruning.clear_under_spread(near, limit, _no_prune()) == ""


def _no_prune() -> pruning.PruneCheck:
    check = pruning.PruneCheck.__new__(pruning.PruneCheck)
    check.best_values, check.metric = [], "latency_p50_ms"
    return check
