"""Sequential paired verdicts: a confirmation looks at its rounds a few times, stops as soon as
every comparison it needs is decided, and keeps its error rates across the looks.

Each comparison (a candidate against the defaults, the winner against the best expert recipe or
the best peer) ends in one of four outcomes, read from the per-round speedups r (> 1: the first
is faster) with the minimum effect m, each by an exact one-sided Wilcoxon signed-rank test:

- **beats**: it rejects "r <= 1 + m": faster by more than the minimum effect;
- **slower**: it rejects "r >= 1 / (1 + m)": slower by more than the minimum effect;
- **equivalent**: both tests of the equivalence pair reject (two one-sided tests, TOST),
  "r <= 1 / (1 + m)" and "r >= 1 + m": the two are within the minimum effect either way;
- **undecided**: none of them. An interval from 0.98 to 1.31 is undecided, not a tie.

The looks (`design`): at most `LOOKS`, the last at the cap on rounds, the first at the fewest
rounds at which a winner faster in every round can pass Holm's first step, any other evenly
between. Every test at look k is made at its own level alpha_k, and the levels add up to ALPHA
(Bonferroni over the looks): the last look has half of it, the earlier ones share the other half.
Each exact test at look k claims falsely with probability at most alpha_k, so a claim of a kind
(a false "beats", a false "slower", a false "equivalent") is made falsely at some look with
probability at most the sum, ALPHA, whatever the dependence between the looks and whatever rule
stops the rounds: the union bound asks nothing else. The price is a smaller level per look (a
wider interval at the cap than a fixed design's); the gain is that a clear answer stops at the
first look. Half is kept for the cap, like O'Brien and Fleming's boundaries lean late, because
what is still open there (an equivalence, a gain near the minimum effect) needs the narrowest
interval, while what is clear at the first look is clear at any level the first look can reach
(an exact test of n rounds cannot go below 1/2**n: 8 rounds for three candidates at 0.0125).

The interval shown at a look is the signed-rank test at alpha_k inverted (two-sided, about
1 - 2 alpha_k), so it agrees with the outcome beside it: beats exactly when its low end is above
1 + m, slower exactly when its high end is below 1 / (1 + m), equivalent exactly when it lies
within both. Its label is the coverage the sequence of intervals of every look holds at once
(1 less the sum of each look's miss probability, at least 1 - 2 ALPHA): whichever look the
rounds stopped at, the interval shown covers at least that (repeated confidence intervals).

The signed-rank test is exact when the per-round log ratio is symmetric about its centre, as it
is when the two contenders' runs draw their noise alike (a difference of two such draws is
symmetric, however skewed each one is); a contender that noise hurts more than the other skews
it. `benchmarks/verdict_error_rates.py` measures the error rates on skewed, heavy-tailed rounds
with slow spells, the lopsided case included (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from autotune.base.thresholds import ALPHA, LOOK_STEP, LOOKS
from autotune.measure.objectives import min_rounds
from autotune.measure.stats import Interval, median, ratio_walsh, signed_rank_interval, signed_rank_miss, signed_rank_p

Outcome = Literal["beats", "slower", "equivalent", "undecided"]
DECIDED: tuple[Outcome, ...] = ("beats", "slower", "equivalent")


@dataclass(frozen=True)
class Look:
    """The `number`-th look (from 1), after `rounds` rounds, whose tests are made at `alpha`."""

    number: int
    rounds: int
    alpha: float


@dataclass(frozen=True)
class Design:
    """The looks of a sequential confirmation, the last at its cap."""

    looks: tuple[Look, ...]

    @property
    def cap(self) -> int:
        return self.looks[-1].rounds

    @property
    def coverage(self) -> float:
        """What the intervals of every look cover at once: 1 less each look's miss probability."""
        return 1 - sum(signed_rank_miss(look.rounds, look.alpha) for look in self.looks)

    def coverage_at(self, look: Look, rounds: int) -> float:
        """`coverage` when `look` compared `rounds` rounds (fewer than planned where runs failed)."""
        others = sum(signed_rank_miss(other.rounds, other.alpha) for other in self.looks if other != look)
        return 1 - others - signed_rank_miss(rounds, look.alpha)

    def describe(self) -> list[dict[str, Any]]:
        """The looks as plain data, for a verdict."""
        return [{"rounds": look.rounds, "alpha": look.alpha} for look in self.looks]


def design(cap: int, candidates: int = 1, alpha: float = ALPHA) -> Design:
    """The looks for at most `cap` rounds: as many as `LOOKS` that fit `LOOK_STEP` rounds apart,
    else fewer, the last at the cap. The last look tests at alpha / 2 and the earlier ones share
    the other half equally; the first comes at the fewest rounds at which a candidate faster in
    every round passes Holm's first step among `candidates` at its share. One look at the cap, at
    `alpha`, when no two fit."""
    for count in range(min(LOOKS, cap), 1, -1):
        share = alpha / 2 / (count - 1)
        first = min_rounds(candidates, share)
        if cap - first >= LOOK_STEP * (count - 1):
            step = (cap - first) / (count - 1)
            earlier = [Look(k + 1, math.floor(first + k * step + 0.5), share) for k in range(count - 1)]
            return Design((*earlier, Look(count, cap, alpha - share * (count - 1))))
    return Design((Look(1, cap, alpha),))


@dataclass(frozen=True)
class Judged:
    """One comparison at one look: its outcome, the Hodges-Lehmann speedup (the median Walsh
    average of the log ratios, as a ratio), the inverted interval, and the exact one-sided p of
    each claim: `p_gain` of "r <= 1 + m" (beats), `p_loss` of "r >= 1/(1+m)" (slower), and
    `p_equivalent` the larger of the two equivalence tests' (equivalent)."""

    outcome: Outcome
    speedup: float
    interval: Interval
    p_gain: float
    p_loss: float
    p_equivalent: float
    rounds: int
    alpha: float
    min_effect: float

    @property
    def p_value(self) -> float:
        """The p of the test behind the outcome (the gain's when undecided)."""
        return {"slower": self.p_loss, "equivalent": self.p_equivalent}.get(self.outcome, self.p_gain)


def judge(ratios: Sequence[float], look: Look, plan: Design, min_effect: float) -> Judged:
    """The four-outcome verdict of per-round speedups `ratios` at `look` of `plan`."""
    if len(ratios) < 2:
        raise ValueError("fewer than two rounds to compare")
    rounds = len(ratios)
    walsh = ratio_walsh(ratios)
    inverse = [1 / w for w in reversed(walsh)]  # the Walsh averages of 1 / r, sorted
    high = 1 + min_effect
    p_gain, p_loss = signed_rank_p(walsh, rounds, high), signed_rank_p(inverse, rounds, high)
    p_equivalent = max(signed_rank_p(walsh, rounds, 1 / high), signed_rank_p(inverse, rounds, 1 / high))
    found = signed_rank_interval(walsh, rounds, look.alpha)
    interval = Interval(0.0, math.inf, 1.0, found.note) if math.isinf(found.low) else \
        Interval(found.low, found.high, plan.coverage_at(look, rounds), found.note)
    return Judged(outcome(p_gain, p_loss, p_equivalent, look.alpha), median(walsh), interval, p_gain, p_loss,
                  p_equivalent, rounds, look.alpha, min_effect)


def outcome(p_gain: float, p_loss: float, p_equivalent: float, alpha: float) -> Outcome:
    """Which claim the tests at `alpha` make (no two can: their rejection regions do not meet)."""
    if p_gain < alpha:
        return "beats"
    if p_loss < alpha:
        return "slower"
    return "equivalent" if p_equivalent < alpha else "undecided"


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Which of several hypotheses Holm's step-down rejects at `alpha` (in the given order): the
    chance of any false rejection stays under `alpha` whatever their dependence."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, index in enumerate(order):
        if p_values[index] >= alpha / (len(order) - rank):
            break
        rejected[index] = True
    return rejected
