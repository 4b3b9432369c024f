"""A search's time budget (`--time-budget`): what a trial and a confirmation cost, measured and
foreseen, and the trials a budget lets start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.child.settings import MeasureSettings
from autotune.config.knobs import Config
from autotune.host.machine import Machine
from autotune.measure.replicates import ReplicatePolicy
from autotune.search import budget, loop, opening
from tests.support.studies import DEFAULT, fake_result, ok_runner, request


class FakeClock:
    """Each finished trial costs `per_trial` seconds (`baseline_s` for the baseline, if given)."""

    def __init__(self, per_trial: float, baseline_s: float | None = None) -> None:
        self.now, self.per_trial, self.baseline_s = 0.0, per_trial, baseline_s

    def __call__(self) -> float:
        return self.now

    def on_event(self, event: loop.TrialEvent) -> None:
        if event.kind == "done":
            baseline = not event.config.values
            self.now += self.baseline_s if baseline and self.baseline_s is not None else self.per_trial


def windows_runner(baseline_s: float = 3.0, other_s: float = 3.0, setup: dict[str, float] | None = None) -> Any:
    """A run of 3 samples whose iterations last `baseline_s` (the baseline) or `other_s` seconds in
    all: a warm trial's 3 windows are a third of that each."""
    def run(plan: Any, timeout_s: float) -> Any:
        total_ms = 1000 * (other_s if plan.config.values else baseline_s)
        result = fake_result([total_ms / 3 - 1 - len(plan.config.values) * 1e-3] * 3)
        result.instances[0].metrics["setup"] = dict(setup or {})
        return result
    return run


def budgeted(tmp_path: Path, here: Machine, seconds: float, rounds: int, top: int) -> opening.Search:
    return opening.open_search(request(tmp_path, 50, space=DEFAULT, time_budget_s=seconds, confirm_rounds=rounds,
                                           confirm_top=top, measure=MeasureSettings(duration_s=1.0),
                                           replicates=ReplicatePolicy(in_process=True)), here)


@pytest.mark.parametrize(("rounds", "top", "expected", "reserve", "processes"),
                         [(0, 0, 6, 0.0, 0), (10, 3, 1, 112.0, 14), (1, 3, 3, 32.0, 4)])
def test_the_time_budget_starts_no_trial_that_would_not_fit(tmp_path: Path, here: Machine, rounds: int, top: int,
                                                            expected: int, reserve: float, processes: int) -> None:
    """10 s per trial, 65 s: 6 trials fit alone (the 7th would end at 70 s). A confirmation process
    costs a warm trial less its 2 extra 1 s windows (8 s), one per round for the baseline and for
    each candidate, as many as there are trials besides the baseline once the next has run: with
    1 round of 3 candidates, 3 trials (then 30 + 10 + 4 x 8 > 65: one round runs every contender
    alone, none is built beside another); with a cap of 10 rounds, the baseline only: its first
    look (7 rounds, 7 x (8 + 8) s) is reserved whatever it costs, though a third of 65 s holds none."""
    clock = FakeClock(10.0)
    opened = budgeted(tmp_path, here, 65.0, rounds, top)
    stopped = loop.run_search(opened, here, clock.on_event, runner=windows_runner(), clock=clock)
    assert len(opened.study.get_trials()) == expected
    ended = opened.study.user_attrs["ended_by"]
    assert ended["by"] == "time budget" and ended["trial_estimate_s"] == 10.0
    assert ended["confirmation_reserve_s"] == pytest.approx(reserve, abs=0.1)
    assert ended["confirmation_processes"] == processes
    assert stopped.startswith("the time budget (65 s) has no room for another trial (about 10 s each)")
    assert stopped.endswith(f"the study holds {expected} finished trials; raise --time-budget (or rerun) to search "
                            "further")


def test_a_slow_baseline_costs_its_own_processes_and_its_windows_as_measured(tmp_path: Path, here: Machine) -> None:
    """A batch-8 baseline: 59 s for 3 windows of 15 s, so each of its confirmation processes costs
    59 - 30 = 29 s, and the others' 20 - 2 x 1 = 18 s. 1200 s: once the recipes ran, the best of them
    runs beside the 3 candidates, a round costs 29 + 4 x 18 = 101 s, and a third of the budget holds
    no look of a 10-round cap (7 and 10 rounds): the first look is reserved, 7 x 101 = 707 s less 12
    processes built beside another (2 a round after the first) x 8.5 s (half of the 17 s a trial's
    process paid besides its window), 605 s, and the 27th trial is the last that fits (579 s + about
    21 s + 605 s > 1200). Counted from nominal 1 s windows and the mean trial, the reserve after the
    baseline was 40 x 57 s, and nothing else ran."""
    clock = FakeClock(20.0, baseline_s=59.0)
    opened = budgeted(tmp_path, here, 1200.0, rounds=10, top=3)
    loop.run_search(opened, here, clock.on_event, runner=windows_runner(45.0, 3.0), clock=clock)
    assert len(opened.study.get_trials()) == 27
    ended = opened.study.user_attrs["ended_by"]
    assert ended["confirmation_reserve_s"] == pytest.approx(7 * 101.0 - 12 * 8.5, abs=0.5)
    assert ended["confirmation_processes"] == 35


def test_a_trial_that_gave_up_after_its_second_window_costs_a_process_of_one(tmp_path: Path, here: Machine) -> None:
    """10 s per trial; the baseline's process costs 10 - 2 x 1 s = 8 s, and a trial that gave up
    after 2 of its 3 windows (2 s timed) 10 - 1 = 9 s, not its whole 10 s. 200 s, of which a third
    holds no look, so the first look's 7 rounds are reserved: after two more trials the reserve is
    7 x (8 + 3 x 9) = 245 s less 12 processes built beside another x 4 s (half the 8 s the trial
    paid besides its window): each contender runs alone in the first round, then two go at a time."""
    def runner(plan: Any, timeout_s: float) -> Any:
        if not plan.config.values:
            return windows_runner()(plan, timeout_s)
        result = fake_result([500.0] * 4)
        result.instances[0].metrics.update(window_s=2.0, gave_up_above_ms=300.0, gave_up_windows=2, setup={})
        return result

    clock = FakeClock(10.0)
    opened = budgeted(tmp_path, here, 200.0, rounds=10, top=3)
    loop.run_search(opened, here, clock.on_event, runner=runner, clock=clock)
    trials = opened.study.get_trials()
    assert len(trials) == 3 and trials[1].user_attrs["prune_reason"].startswith("gave up after its second window")
    assert opened.study.user_attrs["ended_by"]["confirmation_reserve_s"] == pytest.approx(245.0 - 12 * 4.0, abs=0.1)


def test_the_trials_end_a_search_before_the_budget_and_a_resume_estimates_from_the_past(
        tmp_path: Path, here: Machine) -> None:
    clock = FakeClock(10.0)
    opened = opening.open_search(request(tmp_path, 3, space=DEFAULT, time_budget_s=3600.0), here)
    assert loop.run_search(opened, here, clock.on_event, runner=ok_runner, clock=clock) == ""
    assert opened.study.user_attrs["ended_by"] == {"by": "trials"}
    # The accounting says what a trial cost before: a resume with no room stops before its first trial.
    opened.study.set_user_attr("accounting", {"wall_s": 300.0, "trials": 3})
    again = opening.open_search(request(tmp_path, 10, space=DEFAULT, time_budget_s=50.0), here)
    stopped = loop.run_search(again, here, lambda event: None, runner=ok_runner, clock=FakeClock(0))
    assert len(again.study.get_trials()) == 3 and "about 100 s each" in stopped


def test_compiling_counts_for_the_next_trial_but_not_for_the_confirmation(tmp_path: Path, here: Machine) -> None:
    """10 s per trial of which 6 s compiling: the next trial is still 10 s, but a confirmation
    process loads what was compiled, 4 s less the 2 extra 1 s windows: 2 s. With 35 of them (the
    best recipe runs beside the 3 candidates, 7 rounds: the first look, as a third of 165 s holds
    no more), 12 built beside another (each saves half of the 1 s besides the window): 64 s when
    the search ends after 10 trials (1 if compiling counted)."""
    clock = FakeClock(10.0)
    opened = budgeted(tmp_path, here, 165.0, rounds=10, top=3)
    runner = windows_runner(setup={"compile_s": 5.0, "trace_s": 1.0, "quantize_s": 3.0})
    loop.run_search(opened, here, clock.on_event, runner=runner, clock=clock)
    assert len(opened.study.get_trials()) == 10
    ended = opened.study.user_attrs["ended_by"]
    assert ended["trial_estimate_s"] == 10.0 and ended["confirmation_reserve_s"] == pytest.approx(64.0, abs=0.1)
    assert ended["confirmation_processes"] == 35
    assert budget.compile_seconds({"compile_s": 5.0, "quantize_s": 3.0, "build_s": 2.0}) == 5.0


def test_a_confirmation_process_costs_a_trial_less_its_extra_windows() -> None:
    assert budget.spent(18.0, 0.0, 6.0, 3, warm=True).process_s == 14.0
    assert budget.spent(3.0, 0.0, 3.0, 3, warm=True).process_s == 1.0  # never less than one window
    assert budget.spent(48.0, 30.0, 6.0, 3, warm=True).process_s == 14.0  # compiling left out
    assert budget.spent(18.0, 0.0, 6.0, 3, warm=False).process_s == 6.0  # each replicate its own process
    limit = budget.TimeBudget(6000, rounds=10, top=3, replicates=3, window_s=2.0, warm=True)  # the cap fits
    assert limit.process_s(18.0) == 14.0  # a resume, from the nominal windows
    # A repeated configuration ran no process: it says nothing of what one costs.
    # After each contender's first run, alone, every second process of a round is built beside the
    # one before: it saves half of the typical fixed 6 s (10 rounds of 4 contenders: 18 of them).
    trials = [budget.Spent(12.0, baseline=True), budget.Spent(None), budget.Spent(5.0), budget.Spent(7.0)]
    assert limit.reserve(trials, finished=4, trial_s=10.0) == (40, 10 * (12.0 + 3 * 6.0) - 18 * 3.0)
    assert limit.reserve(trials, finished=1, trial_s=10.0) == (20, 10 * (12.0 + 6.0) - 9 * 3.0)
    one_round = budget.TimeBudget(600, rounds=1, top=2, replicates=3, window_s=2.0, warm=True)
    assert one_round.reserve(trials, finished=3, trial_s=10.0) == (3, 12.0 + 2 * 6.0)  # each alone
    assert budget.TimeBudget(600, 0, 0, 3, 2.0, True).reserve(trials, 4, 10.0) == (0, 0.0)
    # A trial that compiled says less of a loading process than one that did not, while one has run.
    compiled = budget.spent(60.0, 30.0, 6.0, 3, warm=True)
    assert compiled.built and compiled.process_s == 26.0 and compiled.fixed_s == 24.0
    assert limit.reserve([trials[0], compiled], 2, 10.0) == (30, 10 * (12.0 + 2 * 26.0) - 9 * 12.0)  # 1 a round
    assert limit.reserve([*trials, compiled], 5, 10.0) == (40, 10 * (12.0 + 3 * 6.0) - 18 * 3.0)


def test_a_candidates_window_and_warmup_come_from_the_trials_the_confirmation_would_take() -> None:
    """What every process pays (here 4 s) comes from the typical trial; its window and warmup from
    the candidates': the slow trials' 2 s windows and 2 s warmups say nothing of a fast candidate's."""
    limit = budget.TimeBudget(6000, rounds=10, top=3, replicates=3, window_s=2.0, warm=True)
    base = budget.spent(8.0, 0.0, 3.0, 3, warm=True, baseline=True, settle_s=1.0, number=0)
    slow = [budget.spent(12.0, 0.0, 6.0, 3, warm=True, settle_s=2.0, number=n) for n in (1, 2, 4)]
    fast = budget.spent(6.0, 0.0, 1.5, 3, warm=True, settle_s=0.5, number=3)
    compiled = budget.spent(66.0, 60.0, 1.5, 3, warm=True, settle_s=0.5, number=5)
    assert [t.fixed_s for t in (base, slow[0], fast)] == [4.0, 4.0, 4.0]
    trials = [base, *slow, fast, compiled]
    beside = 18 * 2.0  # 18 processes built beside another, each saving half of the fixed 4 s
    assert limit.reserve(trials, 6, 10.0, candidates=[3, 5]) == (40, 10 * (6.0 + 3 * 5.0) - beside)
    # Without candidates among them, a candidate's process is the median trial's that compiled nothing.
    assert limit.reserve(trials, 6, 10.0) == (40, 10 * (6.0 + 3 * 8.0) - beside)
    assert limit.reserve(trials, 6, 10.0, candidates=[7]) == (40, 10 * (6.0 + 3 * 8.0) - beside)
    assert budget.settle_seconds({"first_forward_s": 0.5, "warmup_s": 1.0, "build_s": 3.0}) == 1.5


def test_the_budget_reserves_for_the_candidates_it_would_confirm(tmp_path: Path, here: Machine) -> None:
    """Compiled configurations here are fast (0.5 s windows, 0.5 s first call and warmup), the others
    slow (2 s and 2 s), the baseline between (1 s and 1 s); every process pays 4 s besides. A
    candidate's process is then 4 + 0.5 + 0.5 s and the baseline's 4 + 1 + 1 s: 7 x (6 + 3 x 5) s
    for the first look (a third of 400 s holds no more), where the median trial (a slow one, 8 s)
    would have said 7 x (6 + 3 x 8); less 12 processes built beside another x 2 s (half of the 4 s)."""
    costs = {"baseline": (1.0, 1.0), "fast": (0.5, 0.5), "slow": (2.0, 2.0)}

    def kind(config: Config) -> str:
        if not config.values:
            return "baseline"
        return "fast" if dict(config.values).get("backend") == "inductor" else "slow"

    def run(plan: Any, timeout_s: float) -> Any:
        window, settle = costs[kind(plan.config)]
        result = fake_result([1000 * window - 1] * 3)  # a sample per window
        result.instances[0].metrics["setup"] = {"first_forward_s": settle / 2, "warmup_s": settle / 2}
        return result

    class Clock(FakeClock):
        def on_event(self, event: loop.TrialEvent) -> None:
            if event.kind == "done":
                window, settle = costs[kind(event.config)]
                self.now += 4.0 + settle + 3 * window

    clock = Clock(0.0)
    opened = budgeted(tmp_path, here, 400.0, rounds=10, top=3)
    loop.run_search(opened, here, clock.on_event, runner=run, clock=clock)
    ended = opened.study.user_attrs["ended_by"]
    assert ended["by"] == "time budget" and ended["confirmation_processes"] == 28
    assert ended["confirmation_reserve_s"] == pytest.approx(7 * (6.0 + 3 * 5.0) - 12 * 2.0, abs=0.1)


@pytest.mark.parametrize(("seconds", "rounds"), [(100.0, 8), (1200.0, 8), (1300.0, 14), (1800.0, 20), (1e9, 20)])
def test_the_reserve_holds_the_looks_that_fit_in_a_third_of_the_budget(seconds: float, rounds: int) -> None:
    """A cap of 20 rounds for three candidates looks after 8, 14 and 20; a round costs 30 s. The
    confirmation stops before a look that would take it past a third of the budget, so the reserve
    is the last look that fits there, and the first look whatever it costs."""
    limit = budget.TimeBudget(seconds, rounds=20, top=3, replicates=3, window_s=2.0, warm=True)
    assert limit.confirm_rounds(30.0) == rounds
