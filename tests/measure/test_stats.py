"""The statistics of noisy timings, deterministic: percentiles, intervals of the median, paired tests,
the regression gate (the measurement protocol that feeds them: test_replicates.py)."""

from __future__ import annotations

import math
import random

import pytest

from autotune.measure import stats
from autotune.measure.stats import percentile


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 90) == 5.0
    assert percentile([0.0, 10.0], 90) == 9.0


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
    assert "two-sided sign test p=" in check.describe() and "against a 5% slowdown" in check.describe()


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


def _lognormal_rounds(rng: random.Random, speedup: float, n: int, sd: float = 0.08) -> list[float]:
    return [speedup * math.exp(rng.gauss(0, sd)) for _ in range(n)]


@pytest.mark.parametrize("n", [6, 10, 20])
def test_the_paired_interval_covers_what_its_label_says(n: int) -> None:
    """A/B with symmetric noise about a true speedup of 1.06x: the interval inverted from the
    signed-rank test covers 1.06 at least as often as its label's coverage (less 3 simulation sd)."""
    rng = random.Random(n)
    trials = 2000
    results = [stats.paired_speedup(_lognormal_rounds(rng, 1.06, n)) for _ in range(trials)]
    coverage = results[0].interval.coverage
    assert all(r.interval.coverage == coverage for r in results)
    assert results[0].interval.label == f"{coverage:.1%} CI"
    hits = sum(r.interval.low <= 1.06 <= r.interval.high for r in results) / trials
    assert hits >= coverage - 3 * math.sqrt(coverage * (1 - coverage) / trials)


def test_a_significant_gain_is_exactly_an_interval_above_the_minimum_effect() -> None:
    """The p-value and the interval are one test: p < alpha exactly when the interval's low end lies
    above 1 + min_effect, whatever the draw (A/A, small and large gains, ties, few rounds)."""
    rng = random.Random(7)
    for trial in range(3000):
        n = rng.choice([2, 4, 5, 6, 10, 15])
        truth = rng.choice([1.0, 1.02, 1.04, 1.06, 1.2])
        ratios = [round(r, 3) for r in _lognormal_rounds(rng, truth, n, sd=rng.choice([0.01, 0.05, 0.15]))]
        effect = rng.choice([0.0, 0.03, 0.1])
        result = stats.paired_speedup(ratios, min_effect=effect)
        assert result.significant == (result.interval.low > 1 + effect), (trial, ratios, effect, result)
        assert result.interval.low <= result.speedup <= result.interval.high


def test_a_candidate_truly_at_the_minimum_effect_wins_at_most_alpha_of_the_time() -> None:
    rng = random.Random(9)
    trials = 3000
    wins = sum(stats.paired_speedup(_lognormal_rounds(rng, 1.03, 10), min_effect=0.03).significant
               for _ in range(trials))
    assert wins / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)


def test_the_hodges_lehmann_speedup_and_its_exact_interval_on_known_rounds() -> None:
    ratios = [1.10, 1.20, 1.15, 1.30, 1.05, 1.25, 1.12, 1.18, 1.22, 1.08]
    result = stats.paired_speedup(ratios, min_effect=0.03)
    logs = [math.log(r) for r in ratios]
    walsh = sorted((a + b) / 2 for i, a in enumerate(logs) for b in logs[i:])
    assert result.speedup == pytest.approx(math.exp(stats.median(walsh)))
    # n = 10: P(W+ >= 44) = 0.042 < 0.05 <= P(W+ >= 43), so the bounds are the 11th Walsh average
    # from either end of the 55, and the coverage 1 - 2 * 0.042
    assert (result.interval.low, result.interval.high) == pytest.approx((math.exp(walsh[10]), math.exp(walsh[44])))
    assert result.interval.coverage == pytest.approx(1 - 2 * 43 / 1024)
    assert result.p_value == pytest.approx(1 / 1024) and result.significant  # every Walsh average above 3%
    assert "91.6% CI" in result.describe()


def test_too_few_rounds_give_an_unbounded_interval_and_no_verdict() -> None:
    result = stats.paired_speedup([1.5, 1.6, 1.7, 1.8], min_effect=0.03)  # best p is 1/16
    assert not result.significant and result.p_value == pytest.approx(1 / 16)
    assert (result.interval.low, result.interval.high) == (0.0, math.inf)
    assert result.interval.label == "95% CI (too few rounds)"


def _skewed_at(rng: random.Random, center: float, n: int) -> list[float]:
    """Rounds whose median ratio is exactly `center`, with occasional much slower rounds: the log
    ratio is center's minus an exponential's excess over its own median (a long slow tail)."""
    return [center * math.exp(-(rng.expovariate(1 / 0.05) - 0.05 * math.log(2))) for _ in range(n)]


@pytest.mark.parametrize("n", [10, 20])
def test_the_gate_false_fails_at_most_half_of_alpha_for_skewed_rounds_too(n: int) -> None:
    """A candidate exactly at the margin (its median ratio 1/1.05) whose rounds are skewed by
    occasional slow ones: the signed-rank test, which assumes symmetry, failed such pairs 4.5% of
    the time at 10 rounds and 9.5% at 20; the sign test keeps to ALPHA / 2."""
    rng = random.Random(n)
    trials = 4000
    at_margin = 1 / 1.05
    failed = sum(stats.regression_check(_skewed_at(rng, at_margin, n), 0.05).slower_than_margin
                 for _ in range(trials))
    assert failed / trials <= 0.025 + 3 * math.sqrt(0.025 * 0.975 / trials)


def test_the_gate_fails_exactly_when_its_interval_lies_past_the_margin() -> None:
    rng = random.Random(13)
    for _ in range(2000):
        n = rng.choice([6, 8, 10, 20])
        ratios = _skewed_at(rng, rng.choice([0.85, 0.9, 1 / 1.05, 1.0]), n)
        check = stats.regression_check(ratios, 0.05)
        assert check.slower_than_margin == (check.interval.high < 1 / 1.05), ratios
        assert check.interval.coverage >= 0.95
