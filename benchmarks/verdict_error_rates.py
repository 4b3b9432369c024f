"""How often the confirmation's sequential verdict lies, and how many rounds it takes: simulated
rounds at known true speedups, judged look by look as `autotune confirm` judges its winner against
a reference (`measure/sequential.py`: beats, slower, equivalent or undecided), with the noisy
re-runs of `search/rounds.py`. CPU-only arithmetic; no process is started.

Each round draws one run per contender, and each run its own time: its configuration's time
times noise, as a shared machine gives it (all three models are skewed and heavy-tailed):

- quiet: a run is off by a t-distributed amount (4 degrees of freedom, scale 2%) plus an
  exponential excess (mean 1%): a slow tail; 3% of runs are outliers, 1.3-2.5x slower (one process
  drew a slow machine), half of them flagged noisy.
- occasional: quiet, but now and then a slow round (a quiet round turns slow with probability
  0.05, a slow one quiet with 0.6: one round in twelve, mostly alone), slowed as in spells.
- spells: the machine falls into slow spells (a quiet round turns slow with probability 0.15, a
  slow one quiet with 0.3: a third of the rounds, about three in a row, as the issue's first five
  rounds). In a slow round every run is slowed by a common factor (1.2-1.6x) and a common added
  delay (up to a quarter of the reference's time: it pulls the ratio toward 1), and each run by its
  own exponential excess (mean 12%): the spell does not slow contenders alike. 70% of a slow
  round's runs are flagged noisy (other processes' CPU, the child's CPU share), and so are half
  the outliers.
- lopsided: spells, but the candidate is hurt twice as much as the reference (its own excess mean
  24%, outliers twice as often): the per-round log ratio is no longer symmetric, the case the
  signed-rank test does not assume.

A run flagged noisy is run again in its round (in the same state of the machine) at most twice;
the round keeps the first quiet run, or the median of three noisy ones. A true speedup is the
centre of the per-round speedups the model gives after the reruns: their pseudo-median, what the
Hodges-Lehmann estimate estimates and the signed-rank test tests (found by bisection on 40000
rounds). In the first three models it is also the ratio of the contenders' median run times; in
the lopsided one it lies below that (0.96 where the medians say 0.971): the candidate loses more
in the slow rounds, and the paired rounds say so (`--truth medians` calibrates on the medians).

A comparison stops at the first look that decides it, or at the cap: the looks of a default
confirmation of 3 candidates (printed above the table). False claims: "beats" at a true speedup of
at most 1 + m (m = 3%), "slower" at one of at least 1 / (1 + m), "equivalent" at one outside them.

    .venv/bin/python benchmarks/verdict_error_rates.py                  # 2000 comparisons per cell
    .venv/bin/python benchmarks/verdict_error_rates.py --quick --out rates.md
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autotune.base.thresholds import ALPHA, CONFIRM_RERUNS, CONFIRM_ROUNDS, MIN_EFFECT
from autotune.measure import sequential
from autotune.measure.sequential import Design

RATIOS = (1 / 1.03, 1.00, 1.02, 1.03, 1.05, 1.10, 1.5, 5.0)  # 1 / 1.03: the hardest case for a false "slower"
CANDIDATES = 3  # the design of a default confirmation (--confirm-top 3)
REFERENCE_MS = 100.0
CALIBRATION_DRAWS = 40000


@dataclass(frozen=True)
class Noise:
    """How a shared machine disturbs each run (see the module's docstring); pairs are (reference, candidate)."""

    name: str
    slow_start: float = 0.0  # chance a quiet round is followed by a slow one
    slow_stop: float = 1.0  # chance a slow round is followed by a quiet one
    spread: float = 0.02  # scale of a run's t-distributed log noise
    skew: float = 0.01  # mean exponential excess of every run
    slowdown: tuple[float, float] = (1.2, 1.6)  # a slow round's common factor, uniform between
    delay: float = 0.25  # a slow round's common added delay, up to this share of the reference's time
    hit: tuple[float, float] = (0.12, 0.12)  # mean exponential excess of a run in a slow round
    outlier: tuple[float, float] = (0.03, 0.03)  # chance a run is an outlier, 1.3-2.5x slower
    flagged: float = 0.7  # chance a run of a slow round is flagged noisy
    flagged_outlier: float = 0.5  # chance an outlier is


MODELS = {
    "quiet": Noise("quiet"),
    "occasional": Noise("occasional", slow_start=0.05, slow_stop=0.6),
    "spells": Noise("spells", slow_start=0.15, slow_stop=0.3),
    "lopsided": Noise("lopsided", slow_start=0.15, slow_stop=0.3, hit=(0.12, 0.24), outlier=(0.03, 0.06)),
}


@dataclass(frozen=True)
class Draws:
    """Runs of one contender, drawn for given machine states: each run's time is
    (base x `scale` + `delay_ms`) x `factor`, and `flagged` says whether it is flagged noisy."""

    scale: np.ndarray
    delay_ms: np.ndarray
    factor: np.ndarray
    flagged: np.ndarray

    def ms(self, base_ms: float) -> np.ndarray:
        times: np.ndarray = (base_ms * self.scale + self.delay_ms) * self.factor
        return times


def slow_rounds(rng: np.random.Generator, noise: Noise, rounds: int) -> np.ndarray:
    """Which rounds the machine is slow in: a two-state Markov chain, starting quiet."""
    flips = rng.random(rounds)
    slow, found = False, np.zeros(rounds, dtype=bool)
    for index in range(rounds):
        slow = bool(flips[index] < (1 - noise.slow_stop if slow else noise.slow_start))
        found[index] = slow
    return found


def draw(rng: np.random.Generator, noise: Noise, who: int, slow: np.ndarray, common_seed: int,
         attempts: int = 1) -> Draws:
    """`attempts` runs of contender `who` (0 the reference, 1 the candidate) in each round, the
    rounds' states in `slow`; a slow round's common factor and delay come from `common_seed`, so
    that both contenders of a round see the same ones."""
    shape = (len(slow), attempts)
    common = np.random.default_rng(common_seed)
    factor = np.where(slow, common.uniform(*noise.slowdown, len(slow)), 1.0)[:, None] * np.ones(shape)
    delay = np.where(slow, common.uniform(0, noise.delay, len(slow)) * REFERENCE_MS, 0.0)[:, None] * np.ones(shape)
    scale = np.exp(noise.spread * rng.standard_t(4, shape)) * (1 + rng.exponential(noise.skew, shape))
    scale *= np.where(slow[:, None], 1 + rng.exponential(noise.hit[who], shape), 1.0)
    outlier = rng.random(shape) < noise.outlier[who]
    factor = factor * np.where(outlier, rng.uniform(1.3, 2.5, shape), 1.0)
    flagged = slow[:, None] & (rng.random(shape) < noise.flagged)
    flagged |= outlier & (rng.random(shape) < noise.flagged_outlier)
    return Draws(scale, delay, factor, flagged)


def kept(ms: np.ndarray, flagged: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per round, the time kept after the noisy re-runs (the first quiet attempt, else the median of
    all) and how many re-runs it took."""
    quiet = ~flagged
    first = np.argmax(quiet, axis=1)
    any_quiet = quiet.any(axis=1)
    chosen = np.where(any_quiet, ms[np.arange(len(ms)), first], np.median(ms, axis=1))
    return chosen, np.where(any_quiet, first, ms.shape[1] - 1)


def calibrate(noise: Noise, ratio: float, truth: str = "rounds") -> float:
    """The candidate's base time at which the true speedup is `ratio`, by bisection on the same
    draws: with `truth` "rounds", the centre of the per-round speedups after the reruns (their
    pseudo-median: the median of pairwise means of the log speedups, from random pairs); with
    "medians", the ratio of the two contenders' median run times."""
    rng = np.random.default_rng(1)
    slow = slow_rounds(rng, noise, CALIBRATION_DRAWS)
    reference = draw(np.random.default_rng(2), noise, 0, slow, 4, CONFIRM_RERUNS + 1)
    candidate = draw(np.random.default_rng(3), noise, 1, slow, 4, CONFIRM_RERUNS + 1)
    reference_ms = kept(reference.ms(REFERENCE_MS), reference.flagged)[0]
    pairs = rng.integers(0, CALIBRATION_DRAWS, (2, 4 * CALIBRATION_DRAWS))

    def speedup(base_ms: float) -> float:
        if truth == "medians":
            return float(np.median(reference.ms(REFERENCE_MS)[:, 0]) / np.median(candidate.ms(base_ms)[:, 0]))
        logs = np.log(reference_ms / kept(candidate.ms(base_ms), candidate.flagged)[0])
        return math.exp(float(np.median((logs[pairs[0]] + logs[pairs[1]]) / 2)))

    low, high = REFERENCE_MS / ratio / 3, REFERENCE_MS / ratio * 3
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if speedup(middle) > ratio else (low, middle)
    return (low + high) / 2


@dataclass(frozen=True)
class Verdict:
    outcome: sequential.Outcome
    rounds: int
    reruns: int


def compare(rng: np.random.Generator, noise: Noise, candidate_ms: float, plan: Design, min_effect: float) -> Verdict:
    """One comparison, look by look, until decided or the cap."""
    slow = slow_rounds(rng, noise, plan.cap)
    common = int(rng.integers(2**32))
    reference = draw(rng, noise, 0, slow, common, CONFIRM_RERUNS + 1)
    candidate = draw(rng, noise, 1, slow, common, CONFIRM_RERUNS + 1)
    reference_ms, reference_reruns = kept(reference.ms(REFERENCE_MS), reference.flagged)
    candidate_ms_kept, candidate_reruns = kept(candidate.ms(candidate_ms), candidate.flagged)
    ratios = list(reference_ms / candidate_ms_kept)
    judged, rounds = None, 0
    for look in plan.looks:
        rounds = look.rounds
        judged = sequential.judge(ratios[:rounds], look, plan, min_effect)
        if judged.outcome in sequential.DECIDED:
            break
    assert judged is not None
    return Verdict(judged.outcome, rounds, int(reference_reruns[:rounds].sum() + candidate_reruns[:rounds].sum()))


def false_claims(ratio: float, min_effect: float) -> set[str]:
    """The outcomes that would be false at this true speedup."""
    found = set()
    if ratio <= 1 + min_effect:
        found.add("beats")
    if ratio >= 1 / (1 + min_effect):
        found.add("slower")
    if not 1 / (1 + min_effect) <= ratio <= 1 + min_effect:
        found.add("equivalent")
    return found


@dataclass(frozen=True)
class Cell:
    model: str
    ratio: float
    runs: int
    counts: Counter[str]
    median_rounds: float
    mean_rounds: float
    reruns_per_round: float

    def share(self, outcome: str) -> float:
        return self.counts[outcome] / self.runs


def cell(noise: Noise, ratio: float, runs: int, plan: Design, min_effect: float, seed: int,
         truth: str = "rounds") -> Cell:
    rng = np.random.default_rng(seed)
    candidate_ms = calibrate(noise, ratio, truth)
    verdicts = [compare(rng, noise, candidate_ms, plan, min_effect) for _ in range(runs)]
    rounds = [v.rounds for v in verdicts]
    return Cell(noise.name, ratio, runs, Counter(v.outcome for v in verdicts), statistics.median(rounds),
                statistics.fmean(rounds), sum(v.reruns for v in verdicts) / sum(rounds) / 2)


def table(cells: Sequence[Cell], min_effect: float) -> str:
    lines = ["| noise | true speedup | beats | slower | equivalent | undecided at the cap | median rounds "
             "(mean) | reruns per run |", "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        wrong = false_claims(c.ratio, min_effect)
        shares = [f"{'**' if o in wrong else ''}{c.share(o):.1%}{'**' if o in wrong else ''}"
                  for o in ("beats", "slower", "equivalent", "undecided")]
        lines.append(f"| {c.model} | {c.ratio:.3g} | {' | '.join(shares)} | {c.median_rounds:g} ({c.mean_rounds:.1f}) "
                     f"| {c.reruns_per_round:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000, help="comparisons per noise model and true speedup")
    parser.add_argument("--cap", type=int, default=CONFIRM_ROUNDS, help="the confirmation's cap on rounds")
    parser.add_argument("--models", default=",".join(MODELS), help="noise models, comma-separated")
    parser.add_argument("--seed", type=int, default=59)
    parser.add_argument("--truth", choices=("rounds", "medians"), default="rounds",
                        help="what a true speedup is: the centre of the per-round speedups (rounds), or the ratio "
                             "of the contenders' median run times (medians); they differ for the lopsided model")
    parser.add_argument("--quick", action="store_true", help="300 comparisons per cell: about a tenth of the time")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) to this file")
    args = parser.parse_args()
    runs = 300 if args.quick else args.runs
    plan = sequential.design(args.cap, CANDIDATES)
    cells = [cell(MODELS[name], ratio, runs, plan, MIN_EFFECT, args.seed + index, args.truth)
             for name in args.models.split(",") for index, ratio in enumerate(RATIOS)]
    looks = ", ".join(f"{look.rounds} rounds at {look.alpha:.4g}" for look in plan.looks)
    text = (f"{runs} comparisons per row; true speedup: {args.truth}; looks after {looks} (ALPHA {ALPHA} in all); "
            f"minimum effect "
            f"{MIN_EFFECT:.0%}; bold: a false claim at that speedup (at most {ALPHA:.0%} each)\n\n"
            f"{table(cells, MIN_EFFECT)}\n")
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
