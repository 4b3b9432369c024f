"""The statistics and the measurement protocol, deterministic: fake sample times, fake runs."""

from __future__ import annotations

import math
import random

import pytest

from autotune.config.knobs import Config
from autotune.measure import replicates, stats
from autotune.measure.plan import BenchSpec, InstancePlan, LaunchPlan, worker_command
from autotune.measure.results import RunResult
from tests.support.studies import fake_result

PLAN = LaunchPlan(Config(), BenchSpec("fake", (1,)), "none", ())


def test_median_ci_uses_binomial_order_statistics() -> None:
    ten = stats.median_ci(list(range(1, 11)))
    assert (ten.low, ten.high) == (2, 9) and ten.coverage == pytest.approx(0.9785, abs=1e-4)
    assert ten.label == "95% CI"  # covers at least 95%: the tightest such ranks
    hundred = stats.median_ci(list(range(1, 101)))
    assert (hundred.low, hundred.high) == (40, 61) and hundred.coverage >= 0.95


@pytest.mark.parametrize(("n", "coverage", "label"), [
    (3, 0.75, "75.0% CI (full range)"), (5, 0.9375, "93.8% CI (full range)"), (6, 0.96875, "95% CI")])
def test_below_six_values_the_interval_says_its_real_coverage(n: int, coverage: float, label: str) -> None:
    interval = stats.median_ci([float(x) for x in range(n)])
    assert (interval.low, interval.high) == (0.0, n - 1.0)
    assert interval.coverage == pytest.approx(coverage)
    assert interval.label == label
    assert label in stats.paired_speedup([1.1 + 0.01 * x for x in range(n)]).describe()


def test_an_interval_labelled_95_covers_the_median_95_percent_of_the_time() -> None:
    rng = random.Random(3)
    for n in (6, 10, 25):
        hits = 0
        for _ in range(2000):
            interval = stats.median_ci([rng.lognormvariate(0, 1) for _ in range(n)])  # true median 1.0
            hits += interval.low <= 1.0 <= interval.high
        assert hits / 2000 >= 0.94, n  # simulated coverage (binomial sd ~0.5%) of a nominal >= 95%


def test_relative_iqr() -> None:
    values = [float(x) for x in range(1, 101)]
    assert stats.iqr(values) == pytest.approx(49.5)
    assert stats.relative_iqr(values) == pytest.approx(49.5 / 50.5)


def test_a_clearly_faster_configuration_is_significant() -> None:
    rng = random.Random(1)
    ratios = [1.20 + rng.uniform(-0.05, 0.05) for _ in range(10)]
    result = stats.paired_speedup(ratios, min_effect=0.03)
    assert result.significant and result.p_value < 0.01
    assert result.interval.low > 1.1 and result.interval.high < 1.3


def test_an_equal_configuration_is_not_significant() -> None:
    rng = random.Random(2)
    ratios = [1.0 + rng.uniform(-0.08, 0.08) for _ in range(10)]
    result = stats.paired_speedup(ratios, min_effect=0.03)
    assert not result.significant
    assert result.interval.low < 1.0 < result.interval.high


def test_a_gain_below_the_minimum_effect_is_not_significant() -> None:
    ratios = [1.02 + 0.001 * i for i in range(10)]  # consistently 2% faster
    assert stats.paired_speedup(ratios, min_effect=0.0).significant
    assert not stats.paired_speedup(ratios, min_effect=0.03).significant


def runs_of(*sample_lists: list[float]) -> replicates.PlanRunner:
    queue = [fake_result(s) for s in sample_lists]

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        return queue.pop(0)

    return runner


def test_a_quiet_configuration_takes_the_planned_replicates() -> None:
    quiet = [20.0, 20.1, 20.2, 19.9, 20.0]
    measured = replicates.measure_replicates(PLAN, replicates.ReplicatePolicy(replicates=3),
                                             runs_of(quiet, quiet, quiet, quiet))
    assert len(measured.runs) == 3
    summary = measured.summary()
    assert summary["noisy"] is False and summary["replicates"] == 3 and summary["samples"] == 15
    assert summary["latency_ci_ms"][0] <= summary["latency_p50_ms"] <= summary["latency_ci_ms"][1]


def test_a_noisy_configuration_is_remeasured_then_flagged() -> None:
    calm = [20.0, 20.1, 20.2, 19.9, 20.0]
    spell = [60.0, 80.0, 70.0, 90.0, 75.0]
    measured = replicates.measure_replicates(PLAN, replicates.ReplicatePolicy(replicates=2, max_extra=2),
                                runs_of(calm, spell, spell, calm, calm))
    assert len(measured.runs) == 4  # 2 planned + 2 extra while IQR/median stayed above 25%
    assert measured.summary()["noisy"] is True
    off = [27.0] * 5
    settled = replicates.measure_replicates(PLAN, replicates.ReplicatePolicy(replicates=3, max_extra=2),
                               runs_of(calm, calm, off, calm, calm))
    assert len(settled.runs) == 4  # one extra replicate brought the spread under 25%
    assert settled.summary()["noisy"] is False


def test_a_failed_replicate_stops_the_measurement() -> None:
    from autotune.measure.results import InstanceResult

    crash = RunResult(False, "instance 0: crashed with SIGSEGV", (InstanceResult(0, False, "crashed", -11, ""),), 1)
    calm = [20.0] * 5

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        return crash if runner.calls else fake_result(calm)  # type: ignore[attr-defined]

    runner.calls = 0  # type: ignore[attr-defined]

    def counted(plan: LaunchPlan, timeout_s: float) -> RunResult:
        result = runner(plan, timeout_s)
        runner.calls += 1  # type: ignore[attr-defined]
        return result

    measured = replicates.measure_replicates(PLAN, replicates.ReplicatePolicy(replicates=3), counted)
    assert not measured.ok and measured.reason == "instance 0: crashed with SIGSEGV"
    assert len(measured.runs) == 2


def test_a_window_cut_into_parts_keeps_every_sample_in_order_and_splits_time_evenly() -> None:
    run = fake_result([10.0] * 10 + [20.0] * 5)  # iterations of 11 and 21 ms: 215 ms in all
    parts = run.parts(3)
    assert len(parts) == 3 and all(p.ok for p in parts)
    cut = [p.instances[0].metrics for p in parts]
    assert [x for m in cut for x in m["latencies_ms"]] == run.instances[0].metrics["latencies_ms"]
    assert [len(m["latencies_ms"]) for m in cut] == [7, 5, 3]  # each part ends where 1/3 of the time is crossed
    for m in cut:
        assert abs(m["window_s"] - 0.215 / 3) <= 0.021  # within one iteration of a third
        assert m["throughput_ips"] == pytest.approx(m["items"] / m["window_s"])
        assert m["peak_rss_mb"] == run.instances[0].metrics["peak_rss_mb"]  # the process's, in every part
    assert sum(m["items"] for m in cut) == pytest.approx(15)
    assert sum(p.wall_s for p in parts) == pytest.approx(run.wall_s)
    assert run.parts(1) == (run,)


def test_in_process_replicates_are_one_stretched_process_cut_into_windows() -> None:
    seen: list[LaunchPlan] = []
    told: list[tuple[int, bool]] = []

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        seen.append(plan)
        return fake_result([20.0] * 30)

    def after_each(index: int, run: RunResult, more: bool) -> bool:
        told.append((index, more))
        return True  # would prune: but the windows already ran

    bench = BenchSpec("fake", (1,))
    instance = InstancePlan(0, (0,), None, {}, worker_command("python", bench, Config()))
    one = LaunchPlan(Config(), bench, "none", (instance,))
    policy = replicates.ReplicatePolicy(replicates=3, max_extra=0, in_process=True)
    measured = replicates.measure_replicates(one, policy, runner, after_each)
    assert len(seen) == 1 and len(measured.runs) == 3 and not measured.stopped_early
    [plan] = seen
    base = PLAN.bench.measure
    assert plan.bench.measure.duration_s == 3 * base.duration_s
    assert plan.bench.measure.min_iterations == 3 * base.min_iterations
    command = plan.instances[0].command
    assert command[command.index("--duration") + 1] == str(3 * base.duration_s)
    assert command[command.index("--min-iterations") + 1] == str(3 * base.min_iterations)
    assert told == [(0, False), (1, False), (2, False)]


def test_a_part_never_comes_out_empty() -> None:
    run = fake_result([1.0, 1.0, 50.0, 1.0])  # the long iteration crosses two of the three cuts
    assert [len(p.instances[0].metrics["latencies_ms"]) for p in run.parts(3)] == [1, 2, 1]


def test_the_regression_gate_fails_a_real_slowdown_and_passes_what_stays_within_the_margin() -> None:
    rng = random.Random(5)
    slower = [0.80 * rng.uniform(0.97, 1.03) for _ in range(10)]
    gate = stats.regression_check(slower, 0.05)
    assert gate.slower_than_margin and gate.p_value < 0.01 and gate.speedup < 0.83
    within = [0.975 * rng.uniform(0.99, 1.01) for _ in range(10)]  # 2.5% slower: under a 5% margin
    assert not stats.regression_check(within, 0.05).slower_than_margin
    faster = [1.3 * rng.uniform(0.97, 1.03) for _ in range(10)]  # far from the margin, on the good side
    check = stats.regression_check(faster, 0.05)
    assert check.p_value < 0.01 and not check.slower_than_margin
    assert "two-sided Wilcoxon p=" in check.describe() and "against a 5% slowdown" in check.describe()


def test_an_a_a_pair_fails_the_gate_at_most_half_of_alpha() -> None:
    """Same configuration twice, with 10% noise per round: the gate may only fail by chance, on
    the slower side of a two-sided test at ALPHA, and here not even that with a 5% margin."""
    rng = random.Random(11)
    trials = 2000
    failed = sum(stats.regression_check([math.exp(rng.gauss(0, 0.1)) for _ in range(10)], 0.0).slower_than_margin
                 for _ in range(trials))
    assert failed / trials <= 0.025 + 0.01
    with_margin = sum(stats.regression_check([math.exp(rng.gauss(0, 0.1)) for _ in range(10)], 0.05)
                      .slower_than_margin for _ in range(trials))
    assert with_margin < failed


def test_a_two_sided_verdict_needs_six_rounds() -> None:
    from autotune.measure.objectives import min_rounds_two_sided

    assert min_rounds_two_sided() == 6
    assert not stats.regression_check([0.5] * 5, 0.05).slower_than_margin  # p = 2/32 at best
    assert stats.regression_check([0.5, 0.51, 0.49, 0.5, 0.52, 0.48], 0.05).slower_than_margin
