"""Pruning and confirmation with a fake benchmark: deterministic, no processes. The confirmation's
rounds stop at the first look that decides, go on to the cap while one is undecided (or to the time
limit), and run a noisy run again within its round."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.cli import verdicts
from autotune.config.knobs import Config
from autotune.deploy import export
from autotune.host import floor
from autotune.host.machine import Machine
from autotune.measure import sequential, stats
from autotune.measure.plan import BenchSpec, LaunchPlan
from autotune.measure.replicates import ReplicatePolicy, one_by_one
from autotune.measure.results import InstanceResult, RunResult
from autotune.search import compare, confirm, loop, opening, rounds, verdict
from autotune.study import catalog, confirmations
from tests.support import verdicts as fakes
from tests.support.studies import SPACE, fake_result, fake_runner, run_with

SEED = 7
JITTER = (-1.0, -0.6, -0.3, 0.0, 0.2, 0.5, 0.8, 1.0, 1.3, 1.6)


def slow_intel(plan: LaunchPlan, timeout_s: float) -> RunResult:
    """jemalloc 2x faster than the defaults, Intel OpenMP 3x slower."""
    config = plan.config
    latency = 100.0 / (2 if config.get("allocator") == "jemalloc" else 1) * (3 if config.get("omp_runtime") == "intel"
                                                                          else 1)
    if config.get("mkldnn"):
        return fake_runner(plan, timeout_s)
    fake_runner.calls.append(plan.config.describe())  # type: ignore[attr-defined]
    return fake_result([latency + j for j in JITTER])


ENQUEUED = [{"mkldnn": "off", "omp_runtime": "gnu", "allocator": "jemalloc"},
            {"mkldnn": "off", "omp_runtime": "intel", "allocator": "default"},
            {"mkldnn": "off", "omp_runtime": "intel", "allocator": "jemalloc"}]


def searched(tmp_path: Path, here: Machine, runner: object, trials: int = 8) -> optuna.Study:
    """The baseline, then the enqueued configurations (so the test does not hang on sampling luck)."""
    for total in (1, trials):
        opened = opening.open_search(opening.SearchRequest(
            model="resnet18", trials=total, space=SPACE, studies_dir=tmp_path / "studies",
            replicates=ReplicatePolicy(replicates=3), seed=0), here)
        if total == 1:
            loop.run_search(opened, here, lambda e: None, runner=runner)  # type: ignore[arg-type]
            for params in ENQUEUED:
                opened.study.enqueue_trial(params)
    loop.run_search(opened, here, lambda e: None, runner=runner)  # type: ignore[arg-type]
    return opened.study


def test_clearly_worse_configurations_are_pruned_after_two_replicates(tmp_path: Path, here: Machine) -> None:
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    pruned = [t for t in result.get_trials() if t.state == TrialState.PRUNED]
    assert {t.number for t in pruned} >= {2, 3}, "3x slower than trial 1 (jemalloc): pruned"
    for trial in pruned:
        assert trial.user_attrs["replicates"] == 2  # one disturbed process alone never prunes
        assert trial.user_attrs["status"] == "pruned"
        assert trial.user_attrs["prune_reason"].startswith(
            "all 2 replicates more than 5% worse than every replicate of trial 1 (")
        assert "p=" not in trial.user_attrs["prune_reason"]  # a stated rule, not a test: no p-value
        # Its value compares with completed trials': the median of its replicates' p50s, not a decile.
        assert trial.value == pytest.approx(statistics.median(trial.user_attrs["replicate_p50_ms"]), rel=1e-3)
    complete = [t for t in result.get_trials() if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert all(t.user_attrs["replicates"] == 3 for t in complete)
    assert result.get_trials()[1].state == TrialState.COMPLETE


def test_confirmation_picks_a_clearly_faster_candidate(tmp_path: Path, here: Machine) -> None:
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    rounds = []
    verdict = confirm.confirm(result, top=2, rounds=6, min_effect=0.03, timeout_s=60, on_run=rounds.append,
                              runner=one_by_one(slow_intel))
    assert verdict["significant"] is True
    winner = result.get_trials()[verdict["winner_trial"]]
    assert "allocator=jemalloc" in winner.user_attrs["config"]
    assert verdict["speedup"] == pytest.approx(2.0, rel=0.05)
    assert verdict["ci"][0] > 1.5 and verdict["ci_label"] == "90.6% CI"  # signed-rank at 6 rounds: 1 - 2 * 3/64
    assert len(rounds) == 6 * (len(verdict["candidates"]) + 1)
    ran = [[e.contender.trial for e in rounds if e.round == n] for n in range(6)]
    assert ran == verdict["orders"]  # the order that ran is the order recorded, with its seed
    assert isinstance(verdict["order_seed"], int)
    assert result.user_attrs["confirmation"]["winner_trial"] == winner.number
    text = export.render(result, export.pick_trial(result, None))
    assert f"trial {winner.number}" in text.splitlines()[0]
    assert "# confirmed: trial" in text


def test_no_significant_gain_exports_the_baseline_and_says_why(tmp_path: Path, here: Machine) -> None:
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)

    def all_equal(plan: LaunchPlan, timeout_s: float) -> RunResult:
        return fake_result([100.0 + j for j in JITTER])

    verdict = confirm.confirm(result, top=2, rounds=6, min_effect=0.03, timeout_s=60, on_run=lambda e: None,
                              runner=one_by_one(all_equal))
    assert verdict["significant"] is False and verdict["outcome"] == "equivalent"
    assert verdict["winner_trial"] == 0
    assert verdict["message"].startswith("no candidate beat the baseline by more than 3%: the closest, trial ")
    assert ", is equivalent to it (1.000x, 90.6% CI 1.000-1.000, equivalence p=0.0156: within 3% either way); " \
           "PyTorch's defaults stay the recommendation" in verdict["message"]
    chosen = export.pick_trial(result, None)
    assert chosen.number == 0
    text = export.render(result, chosen)
    assert "# baseline exported: no candidate beat the baseline" in text
    assert "# outcomes: the closest candidate is equivalent to the baseline" in text


def test_an_undecided_gain_at_the_cap_confirms_nothing_and_says_after_how_many_rounds(
        tmp_path: Path, here: Machine) -> None:
    """jemalloc 2-4% faster round by round, around the 3% minimum effect: neither a gain above it
    nor one within it, after every one of the 10 rounds; nothing is confirmed, the defaults stay."""
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    spread = itertools.cycle((2.0, 4.0, 2.5, 3.5, 3.0))

    def near_the_margin(plan: LaunchPlan, timeout_s: float) -> RunResult:
        faster = 1 + next(spread) / 100 if plan.config.get("allocator") == "jemalloc" else 1.0
        return fake_result([100.0 / faster + j for j in (-0.1, 0.0, 0.1)])

    verdict = confirm.confirm(result, top=1, rounds=10, min_effect=0.03, timeout_s=60, on_run=lambda e: None,
                              runner=one_by_one(near_the_margin), seed=2)
    assert (verdict["significant"], verdict["outcome"], verdict["decided"]) == (False, "undecided", False)
    assert (verdict["rounds"], verdict["rounds_cap"], verdict["stopped_by"], verdict["look"]) == (10, 10, "cap", 2)
    assert verdict["recommended_trial"] == 0 and export.pick_trial(result, None).number == 0
    assert verdict["message"].startswith("no candidate beat the baseline by more than 3% (Holm-adjusted p < 0.025 "
                                         "at look 2 of 2): undecided after 10 rounds, the closest, trial 1, was 1.0")
    assert verdict["message"].endswith("nothing is confirmed, so PyTorch's defaults stay the recommendation")
    assert catalog.verdict(verdict)["outcome"] == "undecided"


def test_a_winner_several_times_the_defaults_is_decided_at_the_first_look(tmp_path: Path, here: Machine) -> None:
    """2x the defaults in every round: the first look (7 rounds for one candidate at 0.0125, 8 for two
    or three) decides it, where the cap would allow 20."""
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    events: list[rounds.RunEvent] = []
    verdict = confirm.confirm(result, top=2, rounds=20, min_effect=0.03, timeout_s=60, on_run=events.append,
                              runner=one_by_one(slow_intel), seed=5)
    assert verdict["significant"] and verdict["decided"] and verdict["stopped_by"] == "decided"
    plan = sequential.design(20, len(verdict["candidates"]))
    first = plan.looks[0].rounds
    assert verdict["looks"] == plan.describe()
    assert [look["alpha"] for look in verdict["looks"]] == [0.0125, 0.0125, 0.025]
    assert (verdict["rounds"], verdict["look"], verdict["rounds_cap"]) == (first, 1, 20) and first < 10
    assert len(events) == first * (len(verdict["candidates"]) + 1) and verdict["noisy_reruns"] == 0
    assert f"Wilcoxon p={0.5**first:.3g} < 0.0125 at look 1 of 3, {first} interleaved rounds)" in verdict["message"]
    # 7 rounds alike: the interval is the full range; its label is what every look's holds at once
    assert verdict["ci_label"] == f"{plan.coverage:.1%} CI (full range)" and plan.coverage >= 0.9


def test_a_noisy_run_is_run_again_within_its_round_and_the_quiet_one_counts(tmp_path: Path, here: Machine) -> None:
    """jemalloc's run in its third round shares the machine (other processes used 60% of the CPUs)
    and reads 4x slow: it runs again at once, and the round keeps the quiet rerun. The baseline's
    run in its fifth round is noisy every time: it runs twice more, and the round keeps the median."""
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    calls = Counter[str]()

    def disturbed(plan: LaunchPlan, timeout_s: float) -> RunResult:
        described = plan.config.describe()
        calls[described] += 1
        if plan.config.get("allocator") == "jemalloc" and calls[described] == 3:
            return run_with([200.0, 200.0, 200.0], 0.6)
        if not plan.config.values and calls[described] in (5, 6, 7):
            return run_with([100.0 + calls[described]] * 3, 0.6)
        return slow_intel(plan, timeout_s)

    events: list[rounds.RunEvent] = []
    verdict = confirm.confirm(result, top=1, rounds=6, min_effect=0.03, timeout_s=60, on_run=events.append,
                              runner=one_by_one(disturbed), seed=1)
    again = [(e.round, e.contender.trial, e.attempt, e.noisy) for e in events if e.noisy]
    assert [a[:3] for a in again] == [(2, 1, 0), (4, 0, 0), (4, 0, 1), (4, 0, 2)]
    assert all(a[3].startswith("other processes used 60% of the CPUs > 25%") for a in again)
    row = verdict["candidates"][0]
    assert (row["reruns"], verdict["baseline_reruns"], verdict["noisy_reruns"]) == (1, 2, 3)
    assert row["median"] == pytest.approx(50.35, abs=0.01)  # the 200 ms run decided nothing
    assert verdict["baseline_median"] == pytest.approx(100.35, abs=0.01)  # the baseline's fifth round: 106 ms
    assert verdict["speedup"] == pytest.approx(2.0, rel=0.03) and verdict["significant"]


def test_each_round_is_judged_against_the_kept_floor_and_teaches_it(tmp_path: Path, here: Machine) -> None:
    """This host's kept floor holds 8 earlier windows of a quarter of the spread every confirmation
    run has (nothing else ran: the spread is the host's own). The first round's two runs are wider
    than that floor, so each runs twice more; those 6 undisturbed runs join the floor, whose 95th
    percentile is then their spread, so no later round runs anything again. Every run taught it."""
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    shape = (0.94, 0.96, 0.98, 1.0, 1.02, 1.04, 1.06)
    spread = stats.relative_iqr(sorted(shape))
    kept = floor.Kept(tmp_path / "cache", 2)
    floor.save(floor.here(kept.cache_dir, kept.cores).adding([spread / 4] * 8))
    assert kept.threshold() == pytest.approx(spread / 4)

    def wide(plan: LaunchPlan, timeout_s: float) -> RunResult:
        latency = 50.0 if plan.config.get("allocator") == "jemalloc" else 100.0
        return fake_result([latency * x for x in shape])

    events: list[rounds.RunEvent] = []
    verdict = confirm.confirm(result, top=1, rounds=8, min_effect=0.03, timeout_s=60, on_run=events.append,
                              runner=one_by_one(wide), seed=4, floor=kept)
    again = [(e.round, e.attempt) for e in events if e.noisy]
    assert sorted(again) == [(0, 0), (0, 0), (0, 1), (0, 1), (0, 2), (0, 2)]
    assert all("> this host's floor" in e.noisy for e in events if e.noisy)
    assert verdict["noisy_reruns"] == 4 and verdict["significant"]
    assert verdict["rounds"] == sequential.design(8, 1).looks[0].rounds  # decided at the first look
    learned = floor.here(kept.cache_dir, kept.cores)
    assert len(learned.spreads) == 8 + len(events) and learned.threshold == pytest.approx(spread)


def test_rounds_stop_before_a_look_that_would_end_past_the_time_limit(tmp_path: Path, here: Machine) -> None:
    """Each run takes 10 s on the clock: the first look's 8 rounds of 2 contenders take 160 s, and
    the next look (14 rounds) would end at 280 s, past a 250 s limit: the verdict is the first
    look's, said undecided after 8 rounds."""
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    clock = [0.0]
    spread = itertools.cycle((2.0, 4.0, 2.5, 3.5, 3.0))

    def ticking(plan: LaunchPlan, timeout_s: float) -> RunResult:
        clock[0] += 10.0
        faster = 1 + next(spread) / 100 if plan.config.get("allocator") == "jemalloc" else 1.0
        return fake_result([100.0 / faster + j for j in (-0.1, 0.0, 0.1)])

    verdict = confirm.confirm(result, top=1, rounds=20, min_effect=0.03, timeout_s=60, on_run=lambda e: None,
                              runner=one_by_one(ticking), seed=2, time_limit_s=250.0, clock=lambda: clock[0])
    assert (verdict["rounds"], verdict["stopped_by"], verdict["outcome"]) == (7, "time", "undecided")
    assert verdict["wall_s"] == 140.0 and "undecided after 7 rounds" in verdict["message"]


def test_too_few_rounds_and_no_baseline_are_errors(tmp_path: Path) -> None:
    empty = optuna.create_study(study_name="empty")
    with pytest.raises(confirm.ConfirmError, match="has no completed baseline trial"):
        confirm.confirm(empty, top=3, rounds=10, min_effect=0.03, timeout_s=1, on_run=lambda e: None)
    with pytest.raises(confirm.ConfirmError, match="--rounds 3 can never reach significance"):
        confirm.confirm(empty, top=1, rounds=3, min_effect=0.03, timeout_s=1, on_run=lambda e: None)


def test_rounds_that_cannot_survive_holm_for_the_top_asked_are_refused() -> None:
    with pytest.raises(confirm.ConfirmError) as refused:
        confirm.check_rounds(5, 3)
    assert str(refused.value) == (
        "--rounds 5 can never reach significance for 3 candidate(s): the smallest one-sided signed-rank p is "
        "1/32, and Holm's correction asks for p < 0.05/3; use --rounds 6 or more, or a smaller --top")
    confirm.check_rounds(5, 1)
    confirm.check_rounds(6, 3)
    with pytest.raises(confirm.ConfirmError, match="use --rounds 7 or more"):
        confirm.check_rounds(6, 4)


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_the_order_is_random_balanced_and_seeded(count: int) -> None:
    block = count if count % 2 == 0 else 2 * count
    orders = rounds.schedule(count, 3 * block, seed=11)
    assert orders == rounds.schedule(count, 3 * block, seed=11)
    assert orders != rounds.schedule(count, 3 * block, seed=12)
    positions = Counter((who, where) for order in orders for where, who in enumerate(order))
    follows = Counter((a, b) for order in orders for a, b in itertools.pairwise(order))
    assert set(positions.values()) == {3 * block // count}  # everyone in every position equally often
    assert len(follows) == count * (count - 1) and len(set(follows.values())) == 1  # and after everyone


def test_a_candidate_with_a_failed_run_cannot_win(tmp_path: Path, here: Machine) -> None:
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    calls = Counter[str]()

    def jemalloc_crashes_once(plan: LaunchPlan, timeout_s: float) -> RunResult:
        calls[plan.config.describe()] += 1
        if plan.config.get("allocator") == "jemalloc" and calls[plan.config.describe()] == 3:
            bad = InstanceResult(0, False, "crashed with SIGSEGV", -11, "")
            return RunResult(False, "instance 0: crashed with SIGSEGV", (bad,), 1.0)
        return slow_intel(plan, timeout_s)

    verdict = confirm.confirm(result, top=1, rounds=6, min_effect=0.03, timeout_s=60, on_run=lambda e: None,
                              runner=one_by_one(jemalloc_crashes_once), seed=1)
    row = verdict["candidates"][0]
    assert "allocator=jemalloc" in row["config"]
    assert (row["status"], row["failed_runs"], row["significant"]) == ("failed", 1, False)
    assert row["reason"] == "failed 1 of 6 runs: instance 0: crashed with SIGSEGV"
    assert verdict["significant"] is False and verdict["winner_trial"] == 0
    assert verdict["message"] == f"no candidate could win: trial {row['trial']} {row['reason']}"


def test_the_verdict_says_what_each_contenders_processes_took(tmp_path: Path, here: Machine) -> None:
    """The median wall of its fresh processes, start to exit, a failed one included (it took its time)."""
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    calls = Counter[str]()

    def walls(plan: LaunchPlan, timeout_s: float) -> RunResult:
        calls[plan.config.describe()] += 1
        count = calls[plan.config.describe()]
        if not plan.config.values:
            return dataclasses.replace(slow_intel(plan, timeout_s), wall_s=12.0)
        if count == 6:
            return RunResult(False, "instance 0: timed out after 60s", (InstanceResult(0, False, "timed out", -9, ""),),
                             60.0)
        return dataclasses.replace(slow_intel(plan, timeout_s), wall_s=4.0 + count)

    verdict = confirm.confirm(result, top=2, rounds=6, min_effect=0.03, timeout_s=60, on_run=lambda e: None,
                              runner=one_by_one(walls))
    assert verdict["baseline_process_wall_s"] == 12.0
    rows = verdict["candidates"]
    assert rows and [row["process_wall_s"] for row in rows] == [7.5] * len(rows)  # 5, 6, 7, 8, 9 and 60 s
    assert result.user_attrs["confirmation"]["candidates"][0]["process_wall_s"] == 7.5


def test_a_constrained_study_rechecks_the_latency_limit_in_confirmation(tmp_path: Path, here: Machine) -> None:
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    result.set_user_attr("max_latency_ms", 45.0)  # jemalloc's p90 is about 51 ms here
    verdict = confirm.confirm(result, top=1, rounds=6, min_effect=0.03, timeout_s=60, on_run=lambda e: None,
                              runner=one_by_one(slow_intel))
    row = verdict["candidates"][0]
    assert row["status"] == "over the latency limit" and not verdict["significant"]
    assert row["reason"].startswith("had a p90 latency of 51.") and row["reason"].endswith("over --max-latency-ms 45")


def test_a_generating_study_rechecks_the_time_per_output_token_limit_in_confirmation() -> None:
    """Both candidates kept --max-tpot-ms 20 in the search; in the rounds the faster request (a
    short prefill) decodes at 24 ms per token: it is out, the other one wins."""
    configs = ("defaults", "allocator=jemalloc", "mkldnn=on")
    made = optuna.create_study(direction="minimize")
    made.set_user_attr("max_tpot_ms", 20.0)
    made.add_trial(fakes.trial("defaults", 100.0, configs, baseline=True))
    made.add_trial(fakes.trial("allocator=jemalloc", 50.0, configs))
    made.add_trial(fakes.trial("mkldnn=on", 60.0, configs))
    verdict = fakes.confirmed(made, {"defaults": 100.0, "allocator=jemalloc": 50.0, "mkldnn=on": 60.0}, top=2,
                              tpot_p90_ms={"defaults": 30.0, "allocator=jemalloc": 24.0, "mkldnn=on": 19.0})
    rows = {row["trial"]: row for row in verdict["candidates"]}
    assert rows[1]["status"] == "over the latency limit" and rows[1]["p_value"] is None
    assert rows[1]["reason"] == "had a p90 time per output token of 24.00 ms in these rounds, over --max-tpot-ms 20"
    assert rows[2]["status"] == "ok" and verdict["significant"] and verdict["winner_trial"] == 2


def test_five_rounds_are_labelled_with_their_real_coverage(tmp_path: Path, here: Machine) -> None:
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    verdict = confirm.confirm(result, top=1, rounds=5, min_effect=0.03, timeout_s=60, on_run=lambda e: None,
                              runner=one_by_one(slow_intel))
    assert verdict["significant"] and verdict["ci_label"] == "93.8% CI (full range)"
    assert "(93.8% CI (full range) 1.99" in verdict["message"]


def test_a_configuration_compared_with_itself_is_two_independent_series() -> None:
    plan = LaunchPlan(Config(), BenchSpec("fake", (1,)), "none", ())
    jitter = iter(range(1000))

    def noisy(plan: LaunchPlan, timeout_s: float) -> RunResult:
        return fake_result([100.0 + (next(jitter) * 7 % 11) for _ in range(5)])

    pair = compare.distinct([rounds.Contender("trial 0", plan, 0), rounds.Contender("trial 0", plan, 0)])
    assert [c.label for c in pair] == ["trial 0 #1", "trial 0 #2"]
    measured = rounds.interleave(pair, 6, "latency_p50_ms", 60, one_by_one(noisy), lambda e: None, seed=3)
    assert [len(series) for series in measured.runs] == [6, 6]  # 6 rounds asked, 6 rounds compared
    comparison = compare.compared(measured, "latency_p50_ms", 0.0)
    assert comparison is not None and comparison.rounds == 6
    assert comparison.interval.low < comparison.interval.high  # two series, not one paired with itself


def test_holm_keeps_a_borderline_second_candidate_from_winning() -> None:
    rows = [{"p_value": 0.02, "outcome": "beats"}, {"p_value": 0.03, "outcome": "beats"},
            {"p_value": None, "outcome": None, "significant": False}]
    verdict._holm(rows, 0.05)
    assert [r["significant"] for r in rows] == [True, True, False]  # 0.02 < 0.05/2, 0.03 < 0.05/1
    rows = [{"p_value": 0.03, "outcome": "beats"}, {"p_value": 0.04, "outcome": "beats"}]
    verdict._holm(rows, 0.05)
    assert [r["significant"] for r in rows] == [False, False]  # 0.03 > 0.05/2: neither, though both < 0.05
    assert [r["outcome"] for r in rows] == ["undecided", "undecided"]  # a gain Holm does not pass decides nothing
    assert sequential.holm([0.004, 0.01, 0.02], 0.0125) == [True, False, False]  # at a look's level


def test_every_confirmation_is_kept_and_each_reader_says_which_it_shows(tmp_path: Path, here: Machine) -> None:
    """Confirming again until one passes leaves every verdict in the study, in order; the catalog,
    the export and the report say how many there were and that they show the latest."""
    from autotune.report import contents
    from autotune.study import catalog

    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    assert confirmations.count(result.user_attrs) == 0 and confirmations.kept(result) == []
    first = confirm.confirm(result, top=1, rounds=6, min_effect=5.0, timeout_s=60, on_run=lambda e: None,
                            runner=one_by_one(slow_intel))  # a 500% minimum effect: nothing passes
    second = confirm.confirm(result, top=1, rounds=6, min_effect=0.03, timeout_s=60, on_run=lambda e: None,
                             runner=one_by_one(slow_intel))
    assert (first["number"], first["significant"], second["number"], second["significant"]) == (1, False, 2, True)
    kept = confirmations.kept(result)
    assert [(v["number"], v["significant"], v["min_effect"]) for v in kept] == [(1, False, 5.0), (2, True, 0.03)]
    assert result.user_attrs["confirmation"] == second and confirmations.which(result.user_attrs) == (
        "confirmation 2 of 2")
    row = catalog.row(result, "sqlite:///x.db")["confirmation"]
    assert (row["word"], row["number"], row["of"]) == ("confirmed", 2, 2)
    text = export.render(result, result.get_trials()[second["winner_trial"]])
    assert "# this is confirmation 2 of 2, the latest; `autotune studies` lists them" in text.splitlines()
    found = contents.forest(result.user_attrs["confirmation"], confirmations.count(result.user_attrs))
    assert found is not None and (found.number, found.of) == (2, 2)
    assert confirmations.heading(found.significant, found.number, found.of) == "Confirmed (confirmation 2 of 2): "


def test_a_study_confirmed_before_verdicts_were_kept_counts_its_one() -> None:

    legacy = {"confirmation": {"significant": True, "winner_trial": 3, "message": "m"}}
    assert confirmations.count(legacy) == 1 and confirmations.number(legacy) == 1
    assert confirmations.which(legacy) == "confirmation 1 of 1"
    assert confirmations.heading(True, 1, 1) == "Confirmed: "


def with_buckets(result: RunResult, count: int) -> RunResult:
    """`result` as a run of a model timed at buckets 32 and 128: each bucket's p50 a share of the run's
    median that changes from round to round (`count`), so that the verdict's figure is a median over rounds."""
    p50 = result.latency_p50_ms
    buckets = {"32": {"latency_p50_ms": p50 * (0.2 + 0.01 * count), "sweeps": 10, "lengths": [32], "weight": 1.0},
               "128": {"latency_p50_ms": p50 * (0.8 + 0.01 * count), "sweeps": 10, "lengths": [128], "weight": 1.0}}
    instance = dataclasses.replace(result.instances[0], metrics={**result.instances[0].metrics, "buckets": buckets})
    return dataclasses.replace(result, instances=(instance,))


def test_the_verdict_keeps_each_contenders_bucket_times_over_its_rounds(tmp_path: Path, here: Machine,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Per bucket, the median over the rounds of each run's p50: the speed a deployment of the winner
    should serve each bucket at, which export writes and the confirmation prints."""
    fake_runner.calls = []  # type: ignore[attr-defined]
    result = searched(tmp_path, here, slow_intel)
    calls = Counter[str]()

    def bucketed(plan: LaunchPlan, timeout_s: float) -> RunResult:
        calls[plan.config.describe()] += 1
        return with_buckets(slow_intel(plan, timeout_s), calls[plan.config.describe()])

    verdict = confirm.confirm(result, top=2, rounds=6, min_effect=0.03, timeout_s=60, on_run=lambda e: None,
                              runner=one_by_one(bucketed))
    winner = verdict["winner_trial"]
    row = next(r for r in verdict["candidates"] if r["trial"] == winner)
    # The winner's runs had a median of 50.35 ms, its bucket shares 0.21-0.26 and 0.81-0.86 over six rounds.
    assert row["buckets"] == {"32": pytest.approx(50.35 * 0.235, rel=1e-3),
                              "128": pytest.approx(50.35 * 0.835, rel=1e-3)}
    assert verdict["baseline_buckets"]["128"] == pytest.approx(100.35 * 0.835, rel=1e-3)
    assert confirmations.buckets_of(verdict, winner) == row["buckets"]
    assert confirmations.buckets_of(verdict, verdict["baseline_trial"]) == verdict["baseline_buckets"]
    said = f"trial {winner} per bucket, median p50 over the 6 rounds: 32 tokens 11.83 ms, 128 tokens 42.04 ms"
    assert f"# {said}" in export.render(result, export.pick_trial(result, None)).splitlines()
    assert confirmations.recommended(verdict) == winner
    verdicts.confirmation(verdict)
    assert said in capsys.readouterr().out.splitlines()


def test_a_reference_that_was_not_a_candidate_has_its_bucket_times_from_its_own_row() -> None:
    verdict = {"rounds": 10, "baseline_trial": 0, "baseline_buckets": {"32": 20.0}, "candidates": [
        {"trial": 5, "buckets": {"32": 9.0}}], "against_recipe": {"against_baseline": {"trial": 8, "buckets": {
            "32": 12.5, "128": 30.0}}}, "against_peer": None}
    assert confirmations.buckets_of(verdict, 8) == {"32": 12.5, "128": 30.0}
    assert confirmations.buckets_of(verdict, 3) == {}  # not run in these rounds
    assert confirmations.buckets_sentence(verdict, 8) == (
        "trial 8 per bucket, median p50 over the 10 rounds: 32 tokens 12.50 ms, 128 tokens 30.00 ms")
    assert confirmations.buckets_sentence({**verdict, "candidates": [{"trial": 5}]}, 5) == ""  # a study without buckets
