"""Statistics for noisy timings: percentiles, spread, distribution-free intervals, paired tests.

No normality is assumed anywhere: intervals come from order statistics, tests are Wilcoxon's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

from autotune.objectives import ALPHA, MIN_EFFECT


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


def median_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for the median from order statistics (binomial ranks).

    With fewer than 6 values no 95% interval exists; the full range is returned then.
    """
    ordered = sorted(values)
    n = len(ordered)
    low_rank = max(int(scipy_stats.binom.ppf((1 - confidence) / 2, n, 0.5)), 1)
    # Step outward until the symmetric ranks cover the median with the asked probability.
    while low_rank > 1 and _coverage(n, low_rank, n + 1 - low_rank) < confidence:
        low_rank -= 1
    return ordered[low_rank - 1], ordered[n - low_rank]


def _coverage(n: int, low_rank: int, high_rank: int) -> float:
    """P(X_(low) <= median <= X_(high)) = P(low <= B <= high - 1), B ~ Binomial(n, 1/2)."""
    return float(scipy_stats.binom.cdf(high_rank - 1, n, 0.5) - scipy_stats.binom.cdf(low_rank - 1, n, 0.5))


def deciles(values: Sequence[float]) -> list[float]:
    """The 10th..90th percentiles: a distribution summary that pairs well across trials."""
    return [percentile(values, q) for q in range(10, 100, 10)]


@dataclass(frozen=True)
class PairedComparison:
    """A candidate against a reference over paired rounds: ratios > 1 mean the candidate is better."""

    speedup: float
    ci_low: float
    ci_high: float
    p_value: float
    rounds: int
    min_effect: float

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA

    def describe(self) -> str:
        return (f"{self.speedup:.3f}x (95% CI {self.ci_low:.3f}-{self.ci_high:.3f}, Wilcoxon p={self.p_value:.3g} "
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
    low, high = median_ci(ratios)
    return PairedComparison(median(ratios), low, high, p_value, len(ratios), min_effect)


def paired_worse_p(trial: Sequence[float], best: Sequence[float], minimize: bool, margin: float = 0.0) -> float:
    """One-sided Wilcoxon p-value that `trial` is worse than `best` by more than `margin` (relative),
    on paired positive values."""
    diffs = [math.log(t / b) - math.log1p(margin) if minimize else math.log(b / t) - math.log1p(margin)
             for t, b in zip(trial, best, strict=True)]
    if len(diffs) < 2 or all(d == 0 for d in diffs):
        return 1.0
    return float(scipy_stats.wilcoxon(diffs, alternative="greater", zero_method="zsplit").pvalue)
