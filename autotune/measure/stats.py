"""Statistics for noisy timings: percentiles, spread, distribution-free intervals, paired tests.

No normality is assumed anywhere. Each paired verdict comes with the estimate and the interval of
its own test, so that they cannot disagree: a confirmation's speedup is the Hodges-Lehmann estimate
with the interval from inverting the exact Wilcoxon signed-rank test it reports; the regression
gate's is the median with the order-statistic interval from inverting the exact sign test, which
holds for skewed ratios too (the signed-rank test assumes the ratios symmetric about their centre).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

from autotune.base.thresholds import ALPHA, CONFIDENCE, MIN_EFFECT


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    """The one median of the project: the mean of the two middle values for an even count."""
    return percentile(values, 50)


def iqr(values: Sequence[float]) -> float:
    return percentile(values, 75) - percentile(values, 25)


def relative_iqr(values: Sequence[float]) -> float:
    """IQR / median: the spread that decides whether a measurement is noisy."""
    middle = median(values)
    return iqr(values) / middle if middle else math.inf


@dataclass(frozen=True)
class Interval:
    """A distribution-free interval and the probability that it covers what it estimates."""

    low: float
    high: float
    coverage: float
    note: str = ""  # how it came to be, where that is not the usual: " (full range)", " (too few rounds)"

    @property
    def label(self) -> str:
        """'95% CI' when it covers at least 95%, else its real coverage: a median's interval below
        6 values is the full range (93.8% at 5 values, 75% at 3); a paired verdict's is two-sided
        at 1 - 2 alpha (about 90%), so that its low end is the one-sided test's bound."""
        if self.coverage >= CONFIDENCE:
            return f"{CONFIDENCE:.0%} CI{self.note}"
        return f"{self.coverage:.1%} CI{self.note}"

    def describe(self, digits: int = 3) -> str:
        return f"{self.label} {self.low:.{digits}f}-{self.high:.{digits}f}"


def median_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Distribution-free interval for the median from order statistics (binomial ranks): the
    tightest symmetric ranks that cover it with at least `confidence`, else the full range. It is
    the inversion of the two-sided sign test at 1 - confidence (`sign_test_p`)."""
    ordered = sorted(values)
    n = len(ordered)
    low_rank = max(int(scipy_stats.binom.ppf((1 - confidence) / 2, n, 0.5)), 1)
    # Step outward until the symmetric ranks cover the median with the asked probability.
    while low_rank > 1 and _coverage(n, low_rank, n + 1 - low_rank) < confidence:
        low_rank -= 1
    coverage = _coverage(n, low_rank, n + 1 - low_rank)
    note = " (full range)" if low_rank == 1 and coverage < confidence else ""
    return Interval(ordered[low_rank - 1], ordered[n - low_rank], coverage, note)


def _coverage(n: int, low_rank: int, high_rank: int) -> float:
    """P(X_(low) <= median <= X_(high)) = P(low <= B <= high - 1), B ~ Binomial(n, 1/2)."""
    return float(scipy_stats.binom.cdf(high_rank - 1, n, 0.5) - scipy_stats.binom.cdf(low_rank - 1, n, 0.5))


def sign_test_p(values: Sequence[float], center: float = 0.0) -> float:
    """Exact two-sided sign test of H0 'the median is `center`' (values equal to it dropped)."""
    above = sum(v > center for v in values)
    n = above + sum(v < center for v in values)
    if n == 0:
        return 1.0
    tail = min(scipy_stats.binom.cdf(above, n, 0.5), scipy_stats.binom.sf(above - 1, n, 0.5))
    return float(min(1.0, 2 * tail))


@functools.lru_cache(maxsize=64)
def _signed_rank_cdf(n: int) -> tuple[float, ...]:
    """P(W+ <= w) for w = 0 .. n(n+1)/2 under H0, exactly: W+ is the sum of a random subset of 1..n."""
    most = n * (n + 1) // 2
    ways = [1] + [0] * most
    for rank in range(1, n + 1):
        for total in range(most, rank - 1, -1):
            ways[total] += ways[total - rank]
    cdf, running = [], 0
    for count in ways:
        running += count
        cdf.append(running / 2**n)
    return tuple(cdf)


def walsh_averages(values: Sequence[float]) -> list[float]:
    """Every (x_i + x_j) / 2 with i <= j, sorted: W+ against a centre is how many exceed it."""
    return sorted((values[i] + values[j]) / 2 for i in range(len(values)) for j in range(i, len(values)))


def signed_rank_p(walsh: Sequence[float], rounds: int, center: float) -> float:
    """Exact one-sided Wilcoxon signed-rank p of H0 'the pseudo-median is at most `center`', from
    the sorted Walsh averages (or any increasing map of them) of `rounds` values: W+ is how many lie
    above `center`. It agrees with `signed_rank_interval` of the same averages by construction."""
    above = sum(a > center for a in walsh)
    return 1.0 - _signed_rank_cdf(rounds)[above - 1] if above else 1.0


def _needed(rounds: int, alpha: float) -> int | None:
    """The least W+ of `rounds` rounds whose one-sided p is below `alpha` (None: no W+ is)."""
    cdf = _signed_rank_cdf(rounds)
    most = rounds * (rounds + 1) // 2
    return next((w for w in range(1, most + 1) if 1.0 - cdf[w - 1] < alpha), None)


def signed_rank_miss(rounds: int, alpha: float = ALPHA) -> float:
    """The probability that `signed_rank_interval` of `rounds` rounds at `alpha` misses the centre
    (2 P(W+ >= the least W+ that rejects), at most 2 alpha; 0 when the interval is unbounded)."""
    needed = _needed(rounds, alpha)
    return 0.0 if needed is None else 2 * _signed_rank_cdf(rounds)[rounds * (rounds + 1) // 2 - needed]


def signed_rank_interval(walsh: Sequence[float], rounds: int, alpha: float = ALPHA) -> Interval:
    """The centres the one-sided signed-rank test at `alpha` cannot reject, from either side: a
    two-sided interval of coverage 1 - 2 P(W+ >= w) (about 1 - 2 alpha), whose low end L is such
    that signed_rank_p(walsh, rounds, c) < alpha exactly when c < L. Unbounded when no W+ can reach
    p < alpha (all of a few rounds on one side give p = 1/2**rounds)."""
    most = rounds * (rounds + 1) // 2
    needed = _needed(rounds, alpha)
    if needed is None:
        return Interval(-math.inf, math.inf, 1.0, " (too few rounds)")
    note = " (full range)" if needed == most else ""  # the lowest and highest round: nothing tighter holds
    return Interval(walsh[most - needed], walsh[needed - 1], 1 - signed_rank_miss(rounds, alpha), note)


def ratio_walsh(ratios: Sequence[float]) -> list[float]:
    """The Walsh averages of the log ratios, as ratios, sorted (exp keeps their order): what the
    signed-rank test and the Hodges-Lehmann estimate of a speedup read."""
    return [math.exp(a) for a in walsh_averages([math.log(r) for r in ratios])]


@dataclass(frozen=True)
class PairedComparison:
    """A candidate against a reference over paired rounds: ratios > 1 mean the candidate is better."""

    speedup: float
    interval: Interval
    p_value: float
    rounds: int
    min_effect: float

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA

    def describe(self) -> str:
        return (f"{self.speedup:.3f}x ({self.interval.describe()}, Wilcoxon p={self.p_value:.3g} "
                f"for a gain above {self.min_effect:.0%}, {self.rounds} rounds)")


def paired_speedup(ratios: Sequence[float], min_effect: float = MIN_EFFECT) -> PairedComparison:
    """Speedup from per-round ratios: the Hodges-Lehmann estimate (the median Walsh average of the
    log ratios, as a ratio), the interval from inverting the exact signed-rank test, and its
    one-sided p of H0 'the gain is at most `min_effect`'. Both are read off the same Walsh averages,
    as ratios, so the gain is significant exactly when the interval's low end is above 1 + min_effect."""
    if not ratios:
        raise ValueError("no rounds to compare")
    walsh = ratio_walsh(ratios)
    interval = signed_rank_interval(walsh, len(ratios))
    if math.isinf(interval.low):  # unbounded: as ratios, from 0 to infinity
        interval = Interval(0.0, math.inf, interval.coverage, interval.note)
    return PairedComparison(median(walsh), interval, signed_rank_p(walsh, len(ratios), 1 + min_effect),
                            len(ratios), min_effect)


@dataclass(frozen=True)
class RegressionCheck:
    """`compare --fail-if-slower`: is the candidate slower than the reference by more than `margin`?

    Two-sided: the exact sign test of H0 "the candidate's median ratio is exactly `margin` slower";
    the gate fails when that is rejected (p < ALPHA) in the slower direction. The sign test asks
    nothing of the ratios' shape, so a candidate no slower than the margin fails at most ALPHA / 2
    of the time even when its rounds are skewed (occasional slow rounds). `interval` is the
    median's order-statistic interval at 1 - ALPHA, the same test inverted: the gate fails exactly
    when its high end is below 1 / (1 + margin). `difference_p` is the plain two-sided test of "no
    difference at all", for the reader."""

    speedup: float  # candidate over reference, median of the rounds; < 1 means slower
    interval: Interval
    margin: float
    p_value: float
    difference_p: float
    rounds: int
    past_margin: bool  # the rounds' median lies on the slower side of the margin

    @property
    def slower_than_margin(self) -> bool:
        return self.p_value < ALPHA and self.past_margin

    def describe(self) -> str:
        return (f"{self.speedup:.3f}x ({self.interval.describe()}, {self.rounds} rounds; two-sided sign test p="
                f"{self.p_value:.3g} against a {self.margin:.0%} slowdown, p={self.difference_p:.3g} against "
                f"no difference)")


def regression_check(ratios: Sequence[float], margin: float) -> RegressionCheck:
    """The gate's verdict from per-round ratios (candidate speed / reference speed)."""
    if not ratios:
        raise ValueError("no rounds to compare")
    at_margin = 1 / (1 + margin)
    return RegressionCheck(median(ratios), median_ci(ratios, 1 - ALPHA), margin, sign_test_p(ratios, at_margin),
                           sign_test_p(ratios, 1.0), len(ratios), median(ratios) < at_margin)
