"""Undecided trials: a stop (a give-up or a prune) on a window flagged noisy decides nothing.

A neighbour's load can make any configuration read 4x slower (benchmarks/RESULTS.md), so a trial
stopped early while its measurement was flagged noisy (`Measurement.noisy`: other processes' CPU
share, the child's own CPU share or the spread) is not pruned. It ends FAIL (samplers ignore it, so
its inflated value steers nothing) with cause `records.UNDECIDED` and its measurement recorded, and
its configuration is measured again later in the search:

- a retry is due once a trial that finished after it measured a quiet window (the machine looks
  quiet again), or when nothing else is left to propose, or at the latest once `NOISY_RETRY_WAIT`
  trials finished after it (twice as many before the second retry): on a machine noisy all along,
  every configuration still ends after at most 1 + NOISY_RETRIES attempts, so the search ends;
- each configuration has at most `NOISY_RETRIES` retries; every attempt is a trial of its own, and
  each retry records the earlier attempts (`noisy_attempts`);
- an attempt with retries left does not count toward --trials (it decided nothing); the last one,
  when it stops on a noisy window again, stays undecided for good (`undecided_final`), counts,
  and is shown as undecided, never as pruned.

A recipe is never pruned on a noisy window: its stops follow the same rule. A stop on a quiet window
is a pruning as before.

The baseline is never stopped early, but a baseline measured on a noisy window would inflate (or
deflate) every speedup shown during the search: it is measured again by the same rule
(`baseline_due`), outside any trial, and a quiet re-measure becomes the reference every speedup
reads over (`records.speedup`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.thresholds import NOISY_RETRIES, NOISY_RETRY_WAIT, QUIET_HISTORY
from autotune.config.knobs import identity_of
from autotune.study import records

ATTEMPTS = "noisy_attempts"  # a retry's: the earlier attempts' trial numbers, oldest first


def earlier_attempts(trials: Sequence[FrozenTrial], config: str, batch: int, digest: str) -> list[int]:
    """The undecided attempts of this configuration (identity, batch) so far, oldest first."""
    wanted = (identity_of(config), batch)
    return sorted(t.number for t in _undecided(trials, digest) if records.identity(t) == wanted)


def is_last_attempt(earlier: Sequence[int], hopeless: bool = False) -> bool:
    """Whether a trial after `earlier` undecided attempts has no retry left (none at all where
    `hopeless`: this host's recent windows say no quiet one will come, `quiet_unlikely`)."""
    return hopeless or len(earlier) >= NOISY_RETRIES


def quiet_unlikely(trials: Sequence[FrozenTrial]) -> bool:
    """Whether this host's history says a quiet window will not come: each of the last
    `QUIET_HISTORY` trials that measured was disturbed (other processes, steal, a starved child).
    Then a retry would wait for nothing and measure beside the same neighbour."""
    measured = sorted((t for t in trials if t.state in records.FINISHED and "latency_p50_ms" in t.user_attrs
                       and not records.is_duplicate(t)), key=lambda t: t.number)[-QUIET_HISTORY:]
    return len(measured) >= QUIET_HISTORY and all(_disturbed(t) for t in measured)


def explain(reason: str, noisy_reason: str, earlier: Sequence[int], hopeless: bool = False) -> str:
    """Why a stop on a noisy window decided nothing, and what happens to it."""
    if hopeless:
        then = f"kept undecided: each of this host's last {QUIET_HISTORY} measured trials was disturbed"
    elif is_last_attempt(earlier):
        then = f"kept undecided: all {len(earlier) + 1} attempts were noisy"
    else:
        then = "measured again once the machine is quiet"
    return f"{reason}; the window was noisy ({noisy_reason}): {then}"


def record(trial: optuna.Trial, shown: str, earlier: Sequence[int], hopeless: bool = False) -> None:
    """A stop on a noisy window, recorded as undecided (`shown`: `explain`'s text)."""
    records.record_failure(trial, shown, records.UNDECIDED)
    trial.set_user_attr("status", "undecided")
    trial.set_user_attr(records.UNDECIDED_FINAL, is_last_attempt(earlier, hopeless))


def pending(trials: Sequence[FrozenTrial], digest: str) -> list[FrozenTrial]:
    """Undecided attempts with a retry left that no later trial of their configuration followed,
    oldest first: a proposal takes none of them as new (`fleet.taken`), a retry takes them again."""
    later: dict[tuple[str, int], int] = {}
    for t in trials:
        if "config" in t.user_attrs and t.user_attrs.get("settings_digest") == digest \
                and records.fail_cause(t) != records.CUT_SHORT:
            later[records.identity(t)] = max(later.get(records.identity(t), -1), t.number)
    waiting = [t for t in _undecided(trials, digest)
               if not t.user_attrs.get(records.UNDECIDED_FINAL) and later[records.identity(t)] == t.number]
    return sorted(waiting, key=lambda t: t.number)


def due(trials: Sequence[FrozenTrial], digest: str) -> FrozenTrial | None:
    """The oldest pending attempt a trial finished after it found quiet (a measurement not flagged
    noisy), or that has waited its longest (`NOISY_RETRY_WAIT` finished trials, doubled for each
    earlier attempt), or None."""
    finished = [t for t in trials if t.state in records.FINISHED]
    return next((t for t in pending(trials, digest)
                 if ready(finished, t.number, len(t.user_attrs.get(ATTEMPTS, [])))), None)


def ready(finished: Sequence[FrozenTrial], after: int, attempts: int) -> bool:
    """Whether what was measured on a noisy window after trial `after` (`attempts` times already
    measured again) is due to be measured again: a trial that finished after it measured a quiet
    window, or `NOISY_RETRY_WAIT` trials (doubled for each earlier attempt) finished after it."""
    later = [t for t in finished if t.number > after]
    return len(later) >= NOISY_RETRY_WAIT * 2**attempts or any(_measured_quiet(t) for t in later)


def baseline_due(trials: Sequence[FrozenTrial], reference: Mapping[str, Any] | None) -> bool:
    """Whether a host's baseline (`fleet.host_reference`), measured on a noisy window, is due to be
    measured again by the same rule as an undecided trial (`ready`), at most `NOISY_RETRIES` times
    and not while no quiet window is in sight (`quiet_unlikely`): the speedups shown during the search
    are then over a quiet baseline."""
    if not reference or not reference.get("noisy"):
        return False
    attempts = len((reference.get("remeasured") or {}).get("attempts", []))
    finished = [t for t in trials if t.state in records.FINISHED]
    return attempts < NOISY_RETRIES and ready(finished, int(reference.get("after_trial", -1)), attempts) \
        and not quiet_unlikely(trials)


def _measured_quiet(trial: FrozenTrial) -> bool:
    return "latency_p50_ms" in trial.user_attrs and not _disturbed(trial) and not records.is_duplicate(trial)


def _disturbed(trial: FrozenTrial) -> bool:
    """Whether a trial's windows were disturbed (a record from before the host's floor: flagged noisy)."""
    return bool(trial.user_attrs.get("disturbed", trial.user_attrs.get("noisy", True)))


def _undecided(trials: Sequence[FrozenTrial], digest: str) -> list[FrozenTrial]:
    return [t for t in trials if records.fail_cause(t) == records.UNDECIDED and "config" in t.user_attrs
            and t.user_attrs.get("settings_digest") == digest and t.state == TrialState.FAIL]
