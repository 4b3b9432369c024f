"""A search's time budget (`--time-budget 20m`): a new trial starts only while it and the
confirmation's share still fit. The trial in flight always finishes, and the confirmation runs
after the trials whatever the budget says: the budget decides how many trials there are room for.

What a trial costs is what this session's trials cost so far, wall clock per trial (compiles,
process starts and the sampler included); before the first one it is what the study's earlier
sessions cost per trial (its accounting), and with neither the first trial simply runs. A
confirmation process is a fresh process measuring one window that loads what the trials
compiled, so it costs a trial without its compiling (`compiled_s`: every compile, trace and
quantization so far, spread over the trials) less the extra windows a warm trial measures in the
same process (or a trial's share per replicate when each replicate is its own process). Counted
with the compiles, the reserve for a resnext101 confirmation after the experts' recipes (three
compiles of 25-70 s in six trials) came to 40 x 31 s, more than a 15-minute budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TimeBudget:
    seconds: float
    confirm_processes: int  # (top + 1) x rounds of the confirmation that follows; 0 without one
    replicates: int  # windows per trial
    window_s: float  # seconds of one timed window
    warm: bool  # a trial's replicates are windows of one process

    def process_s(self, trial_s: float) -> float:
        """A fresh confirmation process, from what a trial costs."""
        if self.warm:
            return max(self.window_s, trial_s - (self.replicates - 1) * self.window_s)
        return max(self.window_s, trial_s / self.replicates)

    def check(self, elapsed_s: float, ran: int, prior_trial_s: float | None,
              compiled_s: float = 0.0) -> dict[str, Any] | None:
        """None while another trial fits; else what ended the search, as the study records it.
        `compiled_s`: the seconds this session's `ran` trials spent compiling (`compile_seconds`)."""
        trial_s = elapsed_s / ran if ran else prior_trial_s
        if trial_s is None:
            return None
        loading_s = max(0.0, elapsed_s - compiled_s) / ran if ran else trial_s
        reserve = self.confirm_processes * self.process_s(loading_s)
        if elapsed_s + trial_s + reserve <= self.seconds:
            return None
        return {"by": "time budget", "budget_s": round(self.seconds, 1), "elapsed_s": round(elapsed_s, 1),
                "trial_estimate_s": round(trial_s, 1), "confirmation_reserve_s": round(reserve, 1),
                "confirmation_processes": self.confirm_processes}


def message(ended: dict[str, Any], finished: int) -> str:
    """The stop note for people."""
    share = (f" and the confirmation's share (about {ended['confirmation_reserve_s']:.0f} s for "
             f"{ended['confirmation_processes']} fresh processes)" if ended["confirmation_processes"] else "")
    return (f"the time budget ({ended['budget_s']:g} s) has no room for another trial (about "
            f"{ended['trial_estimate_s']:.0f} s each){share} after {ended['elapsed_s']:.0f} s; the study holds "
            f"{finished} finished trials; raise --time-budget (or rerun) to search further")


# What a benchmark child records in its setup for compiling (quantizing is inside compile_s).
COMPILING = ("compile_s", "trace_s")


def compile_seconds(first_call: dict[str, float]) -> float:
    """A trial's compiling, from its first-call costs (`records.first_call`)."""
    return sum(float(first_call.get(key, 0.0)) for key in COMPILING)
