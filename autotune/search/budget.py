"""A search's time budget (`--time-budget 20m`): a new trial starts only while it and the
confirmation's share still fit. The trial in flight always finishes, and the confirmation runs
after the trials whatever the budget says: the budget decides how many trials there are room for.

What a trial costs is what this session's trials cost so far, wall clock per trial (compiles,
process starts and the sampler included); before the first one it is what the study's earlier
sessions cost per trial (its accounting), and with neither the first trial simply runs.

The confirmation runs the baseline and up to `top` candidates, one fresh process each per round,
and a process loads what the trials compiled. So one trial's `Spent.process_s` is its wall less
its compiling and less the extra windows a warm trial measured in the same process, each window
as long as it really was (a batch of 8 of resnext101 at PyTorch's defaults takes 1.5 s, so its 10
samples stretch a 2 s window to 16 s), or its share per replicate when each replicate is its own
process. The baseline's processes cost what its trial says. A candidate's process has two parts:
what every process pays whatever its speed (the interpreter, imports, loading), the median over
the other trials that compiled nothing (a trial that compiled also built the model and ran the
eager check once, which the confirmation's processes do not: on resnext101 those trials left
12-19 s against 6-10 s); and what grows with the configuration's latency (its first call, its
warmup of at least 3 iterations, its window of at least 10 samples), the median over the trials
the confirmation would take now. Costing both from the typical trial, most of them slow
configurations whose 10 samples last twice a candidate's, reserved 1.23-1.53x what the
confirmation took in nine kept resnext101 searches on an AVX2 host, from the candidates
1.00-1.13x (benchmarks/RESULTS.md, "The confirmation's reserve, replayed"). Without candidates among
this session's trials, a candidate's process is that median trial's. There are as many candidates as trials besides the
baseline, up to `top`, once the next trial has run. (One estimate for every process, from nominal
windows and the mean trial, had a batch-8 resnext101 search with `--time-budget 20m` reserve
2184 s after its baseline.) The confirmation builds its processes two at a time once each
contender ran alone, so every process built beside an earlier one saves `BUILD_OVERLAP` of what
the typical process pays whatever its speed; the first 50-trial search that confirmed that way
(all 40 in pairs) took 335 s to confirm, and this reserve says 374 s (1.12x; without the overlap,
416 s).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.base.thresholds import CONFIRM_SHARE
from autotune.measure import sequential
from autotune.measure.runner import built_beside
from autotune.measure.stats import median

# The confirmation builds its processes two at a time once each contender ran alone
# (`runner.run_series`): the share of a process's fixed part (`Spent.fixed_s`) that building
# beside the one before saves. Measured
# here: 3.0 s a pair in a 50-trial resnext101 confirmation at 89aa8d6 (its typical process's
# fixed part 4.7 s: 0.64), 4.4 s a pair in `compare defaults defaults --model resnet18`; two
# builds side by side on this 2-CPU machine take longer than one (their CPUs share a core's
# caches and memory). Rounded down, as a budget should err.
BUILD_OVERLAP = 0.5


@dataclass(frozen=True)
class Spent:
    """What one fresh confirmation process of a trial's configuration would take now that its
    artifacts exist."""

    process_s: float | None  # None: it ran no process (a repeated configuration answered from its record)
    baseline: bool = False
    built: bool = False  # it compiled or traced: its process also paid the model's build and eager check
    window_s: float = 0.0  # one timed window of it, as long as it really was
    settle_s: float = 0.0  # its first call and warmup: like the window, as long as the configuration is slow
    number: int | None = None  # the trial's

    @property
    def fixed_s(self) -> float | None:
        """What its process paid whatever the configuration's speed: interpreter, imports, loading."""
        if self.process_s is None:
            return None
        return max(0.0, self.process_s - self.window_s - self.settle_s)


def spent(wall_s: float, compiled_s: float, timed_s: float, windows: int, warm: bool, baseline: bool = False,
          settle_s: float = 0.0, number: int | None = None) -> Spent:
    """A trial's costs from its wall clock, its compiling, and its `windows` timed windows of
    `timed_s` seconds in all (`warm`: windows of one process; else one process each); `settle_s`:
    a process's first call and warmup."""
    window_s = timed_s / windows if windows else 0.0
    loading_s = max(0.0, wall_s - compiled_s)
    process_s = loading_s - (windows - 1) * window_s if warm else loading_s / max(windows, 1)
    return Spent(max(window_s, process_s), baseline, built=compiled_s > 0, window_s=window_s, settle_s=settle_s,
                 number=number)


@dataclass(frozen=True)
class TimeBudget:
    seconds: float
    rounds: int  # the cap on the confirmation's rounds (--confirm-rounds); 0 without one
    top: int  # candidates it confirms at most
    replicates: int  # windows per trial
    window_s: float  # seconds of one timed window, nominal: only for a resume's estimate from the past
    warm: bool  # a trial's replicates are windows of one process

    def process_s(self, trial_s: float) -> float:
        """A fresh confirmation process, from what a trial costs, when no trial of this session
        says more (nominal windows)."""
        nominal = spent(trial_s, 0.0, self.replicates * self.window_s, self.replicates, self.warm)
        return nominal.process_s or 0.0

    def reserve(self, trials: Sequence[Spent], finished: int, trial_s: float,
                candidates: Collection[int] = ()) -> tuple[int, float]:
        """The confirmation's fresh processes and their seconds, once the next trial has run;
        `finished`: the study's finished trials, the baseline among them; `candidates`: the trials
        the confirmation would take now (the best expert recipe and the best peer among them when
        they run beside the candidates)."""
        if not self.rounds or not self.top:
            return 0, 0.0
        baseline_s, candidate_s = self.process_costs(trials, trial_s, candidates)
        # the trials besides the baseline, the next one counted, and the references beside them
        count = max(min(self.top, finished), len(candidates))
        round_s = baseline_s + count * candidate_s
        rounds = self.confirm_rounds(round_s)
        overlap_s = BUILD_OVERLAP * (_fixed_s(_typical(trials)) or 0.0) * built_beside(rounds, 1 + count)
        return rounds * (1 + count), rounds * round_s - overlap_s

    def confirm_rounds(self, round_s: float) -> int:
        """The confirmation's rounds to reserve, a round costing `round_s`: up to the last of its looks
        (`sequential.design`) that fits in `CONFIRM_SHARE` of the budget, where the confirmation
        stops at the latest, and its first look whatever it costs."""
        looks = sequential.design(self.rounds, self.top).looks
        fits = [look.rounds for look in looks if look.rounds * round_s <= CONFIRM_SHARE * self.seconds]
        return max(fits, default=looks[0].rounds)

    def process_costs(self, trials: Sequence[Spent], trial_s: float,
                      candidates: Collection[int] = ()) -> tuple[float, float]:
        """Seconds of one confirmation process of the baseline and of a candidate."""
        baselines = [t.process_s for t in trials if t.baseline and t.process_s is not None]
        others = [t for t in trials if t.process_s is not None and not t.baseline]
        typical = _typical(trials)
        every = [t.process_s for t in typical if t.process_s is not None]
        baseline_s = baselines[0] if baselines else median(every or [self.process_s(trial_s)])
        chosen = _candidate_s(typical, [t for t in others if t.number in candidates])
        return baseline_s, chosen if chosen is not None else (median(every) if every else baseline_s)

    def check(self, elapsed_s: float, trials: Sequence[Spent], finished: int,
              prior_trial_s: float | None, candidates: Collection[int] = ()) -> dict[str, Any] | None:
        """None while another trial fits; else what ended the search, as the study records it."""
        trial_s = elapsed_s / len(trials) if trials else prior_trial_s
        if trial_s is None:
            return None
        processes, reserve = self.reserve(trials, finished, trial_s, candidates)
        if elapsed_s + trial_s + reserve <= self.seconds:
            return None
        return {"by": "time budget", "budget_s": round(self.seconds, 1), "elapsed_s": round(elapsed_s, 1),
                "trial_estimate_s": round(trial_s, 1), "confirmation_reserve_s": round(reserve, 1),
                "confirmation_processes": processes}


def _typical(trials: Sequence[Spent]) -> list[Spent]:
    """The trials besides the baseline that ran a process and compiled nothing (all of them that
    ran one, when every one compiled)."""
    others = [t for t in trials if t.process_s is not None and not t.baseline]
    return [t for t in others if not t.built] or others


def _fixed_s(typical: Sequence[Spent]) -> float | None:
    """What the typical process paid whatever its speed, the median; None without any."""
    fixed = [t.fixed_s for t in typical if t.fixed_s is not None]
    return median(fixed) if fixed else None


def _candidate_s(typical: Sequence[Spent], chosen: Sequence[Spent]) -> float | None:
    """A candidate's process: what the typical trial's paid whatever its speed, and what the
    chosen trials' first call, warmup and window took; None without both."""
    fixed = _fixed_s(typical)
    if fixed is None or not chosen:
        return None
    return fixed + median([t.window_s + t.settle_s for t in chosen])


def message(ended: dict[str, Any], finished: int) -> str:
    """The stop note for people."""
    share = (f" and the confirmation's share (about {ended['confirmation_reserve_s']:.0f} s for "
             f"{ended['confirmation_processes']} fresh processes)" if ended["confirmation_processes"] else "")
    return (f"the time budget ({ended['budget_s']:g} s) has no room for another trial (about "
            f"{ended['trial_estimate_s']:.0f} s each){share} after {ended['elapsed_s']:.0f} s; the study holds "
            f"{finished} finished trials; raise --time-budget (or rerun) to search further")


# What a benchmark child records in its setup for compiling (quantizing is inside compile_s).
COMPILING = ("compile_s", "trace_s")


# What it records for the calls before its window, which last as long as the configuration is slow.
SETTLING = ("first_forward_s", "warmup_s")


def compile_seconds(first_call: dict[str, float]) -> float:
    """A trial's compiling, from its first-call costs (`records.first_call`)."""
    return sum(float(first_call.get(key, 0.0)) for key in COMPILING)


def settle_seconds(first_call: dict[str, float]) -> float:
    """A process's first call and warmup, from its first-call costs (`records.first_call`)."""
    return sum(float(first_call.get(key, 0.0)) for key in SETTLING)
