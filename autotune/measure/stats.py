"""Statistics for noisy timings: percentiles, spread, distribution-free intervals, paired tests.

No normality is assumed anywhere: intervals come from order statistics, tests are Wilcoxon's.
"""

from __future__ import annotations

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
    """A distribution-free interval for a median and the probability that it covers it."""

    low: float
    high: float
    coverage: float

    @property
    def label(self) -> str:
        """'95% CI' only when it covers at least 95%; below 6 values no such interval exists and
        the full range is given with its real coverage (93.8% at 5 values, 75% at 3)."""
        if self.coverage >= CONFIDENCE:
            return f"{CONFIDENCE:.0%} CI"
        return f"{self.coverage:.1%} CI (full range)"

    def describe(self, digits: int = 3) -> str:
        return f"{self.label} {self.low:.{digits}f}-{self.high:.{digits}f}"


def median_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Distribution-free interval for the median from order statistics (binomial ranks): the
    tightest symmetric ranks that cover it with at least `confidence`, else the full range."""
    ordered = sorted(values)
    n = len(ordered)
    low_rank = max(int(scipy_stats.binom.ppf((1 - confidence) / 2, n, 0.5)), 1)
    # Step outward until the symmetric ranks cover the median with the asked probability.
    while low_rank > 1 and _coverage(n, low_rank, n + 1 - low_rank) < confidence:
        low_rank -= 1
    return Interval(ordered[low_rank - 1], ordered[n - low_rank], _coverage(n, low_rank, n + 1 - low_rank))


def _coverage(n: int, low_rank: int, high_rank: int) -> float:
    """P(X_(low) <= median <= X_(high)) = P(low <= B <= high - 1), B ~ Binomial(n, 1/2)."""
    return float(scipy_stats.binom.cdf(high_rank - 1, n, 0.5) - scipy_stats.binom.cdf(low_rank - 1, n, 0.5))


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
    """Speedup from per-round ratios: median, order-statistic CI, and a one-sided Wilcoxon
    signed-rank test of H0 'the gain is at most `min_effect`'."""
    if not ratios:
        raise ValueError("no rounds to compare")
    logs = [math.log(r) - math.log1p(min_effect) for r in ratios]
    if len(ratios) < 2 or all(x == 0 for x in logs):
        p_value = 1.0
    else:
        p_value = float(scipy_stats.wilcoxon(logs, alternative="greater", zero_method="zsplit").pvalue)
    return PairedComparison(median(ratios), median_ci(ratios), p_value, len(ratios), min_effect)


@dataclass(frozen=True)
class RegressionCheck:
    """`compare --fail-if-slower`: is the candidate slower than the reference by more than `margin`?

    Two-sided: the Wilcoxon signed-rank test of H0 "the candidate is exactly `margin` slower" on
    the per-round log ratios; the gate fails when that is rejected (p < ALPHA) in the slower
    direction, so an A/A pair fails it at most ALPHA / 2 of the time. `difference_p` is the plain
    two-sided test of "no difference at all", for the reader."""

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
        return (f"{self.speedup:.3f}x ({self.interval.describe()}, {self.rounds} rounds; two-sided Wilcoxon p="
                f"{self.p_value:.3g} against a {self.margin:.0%} slowdown, p={self.difference_p:.3g} against "
                f"no difference)")


def regression_check(ratios: Sequence[float], margin: float) -> RegressionCheck:
    """The gate's verdict from per-round ratios (candidate speed / reference speed)."""
    if not ratios:
        raise ValueError("no rounds to compare")
    at_margin = [math.log(r) + math.log1p(margin) for r in ratios]
    plain = [math.log(r) for r in ratios]
    return RegressionCheck(median(ratios), median_ci(ratios), margin, _two_sided(at_margin), _two_sided(plain),
                           len(ratios), median(at_margin) < 0)


def _two_sided(logs: Sequence[float]) -> float:
    if len(logs) < 2 or all(x == 0 for x in logs):
        return 1.0
    return float(scipy_stats.wilcoxon(logs, alternative="two-sided", zero_method="zsplit").pvalue)
