"""A search that claims two trials at a time and hands their first processes to a series (built
side by side by `orchestrate.run_series`, each measured alone), with fakes for the processes."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune import budget, records, search_loop
from autotune.launch import LaunchPlan
from autotune.libs import Libraries
from autotune.machine import Machine
from autotune.replicates import one_by_one
from autotune.results import RunResult
from tests.conftest import lscpu
from tests.test_study import fake_runner, request


@pytest.fixture
def here(fake_libs: Libraries) -> Machine:
    return Machine(lscpu("amd_1s_smt"), fake_libs)


class FakeSeries:
    """Runs each plan through `fake_runner`, one by one, and notes what every call was given: the
    plans' configurations, what the search expected each to hold, and the trials running then."""

    def __init__(self, study: Callable[[], optuna.Study], stop_at: int | None = None) -> None:
        self.study, self.stop_at = study, stop_at
        self.calls: list[dict[str, object]] = []
        self.results = 0

    def __call__(self, plans: Sequence[LaunchPlan], timeout_s: float,
                 expected_mb: Callable[[LaunchPlan], float | None]) -> Generator[RunResult, None, None]:
        running = [t.number for t in self.study().get_trials(states=(TrialState.RUNNING,))]
        self.calls.append({"configs": [p.config.describe() for p in plans], "running": running,
                           "expected": [expected_mb(p) for p in plans]})
        for result in one_by_one(fake_runner)(plans, timeout_s):
            if self.results == self.stop_at:
                raise KeyboardInterrupt
            self.results += 1
            yield result


def searched(tmp_path: Path, here: Machine, trials: int, stop_at: int | None = None,
             **kw: object) -> tuple[search_loop.Search, FakeSeries]:
    opened = search_loop.open_search(request(tmp_path, trials, **kw), here)
    fake = FakeSeries(lambda: opened.study, stop_at)
    search_loop.run_search(opened, here, lambda event: None, runner=fake_runner, series=fake)
    return opened, fake


def test_trials_are_claimed_two_at_a_time_and_each_measured_in_its_turn(tmp_path: Path, here: Machine) -> None:
    opened, fake = searched(tmp_path, here, trials=7)
    trials = opened.study.get_trials()
    assert [t.state.is_finished() for t in trials] == [True] * 7
    configs = [t.user_attrs["config"] for t in trials]
    earlier: dict[str, optuna.trial.FrozenTrial] = {}
    for trial in trials:  # each configuration once: only a killed one runs again (records.KILLED_RERUNS)
        before = earlier.setdefault(trial.user_attrs["config"], trial)
        assert before is trial or records.fail_cause(before) == records.KILLED, (before.number, trial.number)
    # The baseline alone (nothing is known of the memory before it), then pairs.
    assert [c["running"] for c in fake.calls] == [[0], [1, 2], [3, 4], [5, 6]]
    # The others' reference is the study's baseline: no extra one is measured.
    assert not [key for key in opened.study.user_attrs if key.startswith("host_baseline")]
    assert all(t.user_attrs["speedup_latency"] > 0 for t in trials if t.state == TrialState.COMPLETE)
    assert [c["configs"] for c in fake.calls] == [configs[0:1], configs[1:3], configs[3:5], configs[5:7]]
    # Each trial recorded its own run: mkldnn crashes in the fake, every other configuration runs.
    for trial in trials:
        crashed = "mkldnn=on" in trial.user_attrs["config"]
        assert (trial.state == TrialState.FAIL) == crashed, trial.user_attrs["config"]


def test_a_new_configuration_is_expected_to_hold_twice_the_largest_peak_so_far(tmp_path: Path,
                                                                              here: Machine) -> None:
    _, fake = searched(tmp_path, here, trials=4)
    # Nothing succeeded before the baseline: it runs alone. The fake's processes peak at 600 MB
    # while building (500 serving), so later configurations are expected to hold 1200 MB each.
    assert fake.calls[0]["expected"] == [None]
    assert fake.calls[1]["expected"] == [search_loop.UNSEEN_HEADROOM * 600.0] * 2


def test_an_interrupted_pair_records_the_first_trial_and_fails_the_second(tmp_path: Path, here: Machine) -> None:
    opened = search_loop.open_search(request(tmp_path, 6), here)
    fake = FakeSeries(lambda: opened.study, stop_at=4)  # the second trial of the second pair
    with pytest.raises(KeyboardInterrupt):
        search_loop.run_search(opened, here, lambda event: None, runner=fake_runner, series=fake)
    trials = opened.study.get_trials()
    assert [t.state.is_finished() for t in trials] == [True] * 5  # nothing left running
    assert trials[3].user_attrs["config"] == fake.calls[2]["configs"][0]  # measured and kept
    assert trials[3].state != TrialState.FAIL or records.fail_cause(trials[3]) != records.CUT_SHORT
    assert trials[4].state == TrialState.FAIL and records.fail_cause(trials[4]) == records.CUT_SHORT
    assert "Ctrl-C" in trials[4].user_attrs["fail_reason"]


def test_the_budget_prices_a_paired_trial_as_if_its_first_process_ran_alone() -> None:
    def alone(plan: LaunchPlan, timeout_s: float) -> RunResult:
        return RunResult(True, "", (), 3.0)

    # The second of a pair: 4 s of its share of the wall, built for 6 s before it began.
    runner = search_loop._FirstFrom(iter([RunResult(True, "", (), 4.0, busy_s=10.0)]), alone)
    assert runner.alone_shift_s() == 0.0  # nothing ran yet
    first = runner(None, 60.0)  # type: ignore[arg-type]
    assert first.wall_s == 4.0 and runner(None, 60.0).wall_s == 3.0  # type: ignore[arg-type]
    assert runner.alone_shift_s() == 6.0
    # The first of a pair waited 2 s for the other's build; a run alone shifts nothing.
    waited = search_loop._FirstFrom(iter([RunResult(True, "", (), 9.0, busy_s=7.0)]), alone)
    waited(None, 60.0)  # type: ignore[arg-type]
    assert waited.alone_shift_s() == -2.0
    lone = search_loop._FirstFrom(iter([RunResult(True, "", (), 9.0)]), alone)
    lone(None, 60.0)  # type: ignore[arg-type]
    assert lone.alone_shift_s() == 0.0


def test_a_trial_is_claimed_ahead_only_when_the_budget_holds_both() -> None:
    limit = budget.TimeBudget(100, rounds=0, top=0, replicates=3, window_s=2.0, warm=True)
    trials = [budget.Spent(10.0, baseline=True)] + [budget.Spent(10.0)] * 4
    assert limit.check(0, [], 0, None, ahead=0) is None  # no estimate yet: the baseline starts
    assert limit.check(0, [], 0, None, ahead=1) is not None  # but nothing is claimed ahead of it
    assert limit.check(50, trials, 5, None, ahead=0) is None
    assert limit.check(50, trials, 5, None, ahead=4) is None  # 50 s + 5 trials of 10 s: 100 s
    ended = limit.check(50, trials, 5, None, ahead=5)
    assert ended is not None and ended["by"] == "time budget"


def test_with_a_time_budget_the_search_still_ends_within_it(tmp_path: Path, here: Machine) -> None:
    """Each fake process takes 5 s of the clock, a trial 15 s (3 replicates). Before the baseline
    ran there is no estimate: it runs alone, then a pair fits (15 + 2 x 15 s), a third pair not."""
    clock = Clock()

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        clock.now += 5.0
        return fake_runner(plan, timeout_s)

    def series(plans: Sequence[LaunchPlan], timeout_s: float,
               expected_mb: Callable[[LaunchPlan], float | None]) -> Generator[RunResult, None, None]:
        yield from one_by_one(runner)(plans, timeout_s)

    opened = search_loop.open_search(request(tmp_path, 20, time_budget_s=55.0, confirm_rounds=0), here)
    stopped = search_loop.run_search(opened, here, lambda event: None, runner=runner, clock=clock, series=series)
    assert "time budget" in stopped
    assert clock.now <= 55.0
    assert records.finished(opened.study) >= 3  # some are cheaper: a crash or a pruning stops early


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
