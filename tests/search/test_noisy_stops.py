"""A stop on a noisy window decides nothing (study/undecided.py): the trial is undecided, measured
again once a later trial found the machine quiet, and kept undecided after NOISY_RETRIES retries;
only a stop on a quiet window is a pruning."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.base.thresholds import NOISY_RETRIES, NOISY_RETRY_WAIT
from autotune.host.machine import Machine, host_name
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import ReplicatePolicy
from autotune.measure.results import RunResult
from autotune.search import loop, opening
from autotune.study import records, undecided
from tests.search.test_give_up import gave_up
from tests.support.studies import DEFAULT, fake_result, request

WARM = ReplicatePolicy(replicates=3, max_extra=0, in_process=True)


class Neighbour:
    """The honest child of test_give_up on a machine where a neighbour takes half the CPUs during
    the runs in `busy` (0-based call numbers): everything reads 4x slower there, and the runner's
    noise record says other processes used 50% of the CPUs."""

    def __init__(self, busy: range | None) -> None:
        self.busy, self.calls = busy, 0
        self.ran: list[tuple[str, bool]] = []

    def __call__(self, plan: LaunchPlan, timeout_s: float) -> RunResult:
        config = plan.config
        latency = 100.0 - 20 * (config.get("allocator") == "jemalloc") + 60 * (config.get("omp_runtime") == "intel")
        latency += 200 * bool(config.get("mkldnn"))
        noisy = self.busy is None or self.calls in self.busy
        self.calls += 1
        latency *= 4 if noisy else 1
        command = plan.instances[0].command
        given = command[command.index("--give-up-above-ms") + 1] if "--give-up-above-ms" in command else ""
        self.ran.append((plan.config.describe(), noisy))
        result = next((gave_up(latency, float(limit), windows) for windows, limit in
                       enumerate((v for v in given.split(",") if v), start=1) if latency > float(limit)),
                      None) or fake_result([latency] * 30)
        return RunResult(result.ok, result.reason, result.instances, result.wall_s,
                         {"other_cpu_share": 0.5 if noisy else 0.01})


def search(tmp_path: Path, here: Machine, trials: int, neighbour: Neighbour) -> list[FrozenTrial]:
    opened = opening.open_search(request(tmp_path, trials, replicates=WARM), here)
    loop.run_search(opened, here, lambda event: None, runner=neighbour)
    return opened.study.get_trials()


def test_a_stop_on_a_noisy_window_is_measured_again_once_the_machine_is_quiet(tmp_path: Path, here: Machine) -> None:
    neighbour = Neighbour(busy=range(2, 5))  # the baseline and one more trial run quiet, then three do not
    trials = search(tmp_path, here, 8, neighbour)
    stopped_noisy = [t for t in trials if records.fail_cause(t) == records.UNDECIDED]
    assert stopped_noisy, "the neighbour made some trial stop early"
    for t in stopped_noisy:
        assert t.user_attrs["noisy"] and t.user_attrs["status"] == "undecided"
        assert "the window was noisy (other processes used 50% of the CPUs" in t.user_attrs["fail_reason"]
        again = [r for r in trials if r.number > t.number and records.identity(r) == records.identity(t)]
        assert again and again[0].user_attrs[undecided.ATTEMPTS] == [t.number]
        assert not again[0].user_attrs["noisy"]  # measured on a quiet machine: its verdict stands
    assert not any(t.state == TrialState.PRUNED and t.user_attrs.get("noisy") for t in trials)
    counted = [t for t in trials if records.counts(t)]
    assert len(counted) == 8 and len({records.identity(t) for t in counted}) == 8


def test_a_configuration_noisy_in_every_attempt_stays_undecided_and_counts_once(tmp_path: Path,
                                                                               here: Machine) -> None:
    neighbour = Neighbour(busy=range(1, 10_000))  # only the baseline ran quiet
    trials = search(tmp_path, here, 8, neighbour)
    finals = [t for t in trials if t.user_attrs.get(records.UNDECIDED_FINAL)]
    assert finals, "some configuration stopped on a noisy window every time"
    for t in finals:
        attempts, reason = t.user_attrs.get(undecided.ATTEMPTS, []), t.user_attrs["fail_reason"]
        assert (len(attempts) == NOISY_RETRIES and f"kept undecided: all {NOISY_RETRIES + 1} attempts were noisy"
                in reason) or "measured trials was disturbed" in reason
        assert not any(records.counts(trials[n]) for n in attempts) and records.counts(t)
    assert not any(t.state == TrialState.PRUNED for t in trials)
    counted = [t for t in trials if records.counts(t)]
    assert len({records.identity(t) for t in counted}) == len(counted) == 8  # the small space, exhausted


def test_on_a_machine_noisy_all_along_retries_come_after_their_longest_wait_and_the_search_ends(
        tmp_path: Path, here: Machine) -> None:
    """The default space is far too large to exhaust: every retry here is due by its wait
    (NOISY_RETRY_WAIT finished trials, then twice as many), so each configuration ends undecided
    after 1 + NOISY_RETRIES attempts and the search still reaches its trials."""
    opened = opening.open_search(request(tmp_path, 4, replicates=WARM, space=DEFAULT), here)
    loop.run_search(opened, here, lambda event: None, runner=Neighbour(busy=range(1, 10_000)))
    trials = opened.study.get_trials()
    assert sum(records.counts(t) for t in trials) == 4
    for t in (t for t in trials if t.user_attrs.get(undecided.ATTEMPTS)):
        chain = [*t.user_attrs[undecided.ATTEMPTS], t.number]
        for k, (before, after) in enumerate(itertools.pairwise(chain)):
            waited = sum(u.number > before and u.number < after and u.state.is_finished() for u in trials)
            assert waited >= NOISY_RETRY_WAIT * 2 ** k
    assert len(trials) <= 1 + 3 * 3 + NOISY_RETRY_WAIT * 3  # bounded: no configuration runs a fourth time


def test_a_baseline_measured_on_a_noisy_window_is_measured_again_once_the_machine_is_quiet(
        tmp_path: Path, here: Machine) -> None:
    """The neighbour takes the CPUs only while the baseline measures (400 ms instead of 100): once
    trial 1 found the machine quiet, the baseline is measured again, outside any trial, and every
    speedup (trial 1's, recorded over the noisy baseline, included) reads over the quiet one."""
    neighbour = Neighbour(busy=range(0, 1))
    events: list[loop.TrialEvent] = []
    opened = opening.open_search(request(tmp_path, 4, replicates=WARM), here)
    loop.run_search(opened, here, events.append, runner=neighbour)
    study, host = opened.study, host_name()
    assert [noisy for _, noisy in neighbour.ran][:3] == [True, False, False]
    assert neighbour.ran[2][0] == "defaults"  # the baseline again, right after the first quiet trial
    reference = study.user_attrs[records.HOST_BASELINE + host]
    assert reference["latency_p50_ms"] == pytest.approx(100.0) and not reference["noisy"]
    remeasured = reference["remeasured"]
    assert remeasured["quiet"] and remeasured["was"]["latency_p50_ms"] == pytest.approx(400.0)
    assert len(remeasured["attempts"]) == 1 and remeasured["attempts"][0]["after_trial"] == 1
    first = study.get_trials()[1]  # measured against the noisy 400 ms
    latency = first.user_attrs["latency_p50_ms"]
    assert first.user_attrs["speedup_latency"] == pytest.approx(400.0 / latency, rel=1e-3)
    assert records.speedup(first, "speedup_latency", study.user_attrs) == pytest.approx(100.0 / latency, rel=1e-3)
    later = [t for t in study.get_trials()[2:] if "speedup_latency" in t.user_attrs]
    assert later and all(t.user_attrs["speedup_latency"] == records.speedup(t, "speedup_latency", study.user_attrs)
                         for t in later)  # measured over the quiet baseline already
    notes = [e.note for e in events if e.kind == "baseline"]
    assert len(notes) == 1 and notes[0].startswith("the baseline, measured on a noisy window (other processes used "
                                                   "50% of the CPUs > 25%) at p50 400.00 ms, measured again: p50 "
                                                   "100.00 ms, quiet")
    assert records.remeasured_baselines(study.user_attrs) == {host: remeasured}
    best = [e for e in events if e.kind == "done"][2]  # after the re-measure, the live line's best reads over it
    assert best.best is not None and best.speedups["speedup_latency"] == pytest.approx(
        100.0 / best.best.user_attrs["latency_p50_ms"], rel=1e-3)


def test_a_baseline_noisy_every_time_is_measured_again_at_most_noisy_retries_times(tmp_path: Path,
                                                                                   here: Machine) -> None:
    neighbour = Neighbour(busy=None)  # the neighbour never leaves: no trial finds the machine quiet
    opened = opening.open_search(request(tmp_path, 2 + NOISY_RETRY_WAIT * 4, replicates=WARM), here)
    loop.run_search(opened, here, lambda event: None, runner=neighbour)
    reference = opened.study.user_attrs[records.HOST_BASELINE + host_name()]
    attempts = reference["remeasured"]["attempts"]
    assert len(attempts) == NOISY_RETRIES and not reference["remeasured"]["quiet"]
    assert reference["noisy"] and reference["latency_p50_ms"] == pytest.approx(400.0)  # the first stays
    waited = [a["after_trial"] for a in attempts]
    assert waited[0] >= NOISY_RETRY_WAIT  # by undecided's rule: the k-th retry after 2^k times as many
    assert all(after - before >= 2 ** (k + 1) * NOISY_RETRY_WAIT - 1
               for k, (before, after) in enumerate(itertools.pairwise(waited)))
    first = opened.study.get_trials()[1]
    assert records.speedup(first, "speedup_latency", opened.study.user_attrs) == first.user_attrs["speedup_latency"]


def test_a_baseline_measured_quietly_is_never_measured_again(tmp_path: Path, here: Machine) -> None:
    neighbour = Neighbour(busy=range(0))
    opened = opening.open_search(request(tmp_path, 4, replicates=WARM), here)
    loop.run_search(opened, here, lambda event: None, runner=neighbour)
    assert [config for config, _ in neighbour.ran].count("defaults") == 1
    assert records.remeasured_baselines(opened.study.user_attrs) == {}


def test_no_retry_waits_for_a_quiet_window_this_hosts_history_says_will_not_come() -> None:
    """Each of the last QUIET_HISTORY measured trials disturbed: a stop now stays undecided at once;
    one undisturbed trial among them, and the retry is kept."""
    from optuna.trial import create_trial

    from autotune.base.thresholds import QUIET_HISTORY

    def measured(disturbed: bool) -> FrozenTrial:
        return create_trial(state=TrialState.COMPLETE, values=[1.0],
                            user_attrs={"latency_p50_ms": 1.0, "disturbed": disturbed})

    busy = [measured(True) for _ in range(QUIET_HISTORY)]
    assert undecided.quiet_unlikely(busy)
    assert not undecided.quiet_unlikely(busy[1:])  # too little history to say
    assert not undecided.quiet_unlikely([*busy[:-1], measured(False)])
    assert undecided.is_last_attempt([], hopeless=True)
    said = undecided.explain("gave up", "other processes used 60% of the CPUs > 25%", [], hopeless=True)
    assert said.endswith(f"kept undecided: each of this host's last {QUIET_HISTORY} measured trials was disturbed")
