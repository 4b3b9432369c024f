"""Who runs a trial, and the trials whose autotune is gone: a claim records the host, the process
and its heartbeat (storage.heartbeat); a RUNNING trial whose autotune provably no longer runs, or
stopped beating for the grace period, is failed CUT_SHORT and retried (records.counts: it takes no
trial of --trials)."""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base import processes
from autotune.host.machine import host_name
from autotune.study import storage
from autotune.study.records import CUT_SHORT, HOST_CLASS


def claim_trial(trial: optuna.Trial, klass: str) -> None:
    """Who runs this trial (host and its class); its heartbeat (storage.heartbeat) tells another
    autotune it is alive. A retry of a dead worker's trial starts without the failure it copied."""
    system = trial.study._storage.get_trial_system_attrs(trial._trial_id)
    if "failed_trial" in system:  # by optuna's RetryFailedTrialCallback
        trial.set_user_attr("retry_of", system["failed_trial"])
        trial.set_user_attr("status", "running")
        trial.set_user_attr("fail_reason", "")
        trial.set_user_attr("fail_cause", "")
    trial.set_user_attr("host", host_name())
    trial.set_user_attr(HOST_CLASS, klass)
    trial.set_user_attr("pid", os.getpid())
    trial.set_user_attr("pid_space", processes.pid_space())
    trial.set_user_attr("pid_started", processes.start_time(os.getpid()))
    trial.set_user_attr("heartbeat_s", storage.HEARTBEAT_INTERVAL_S)
    storage.first_beat(trial)


def waiting_retry(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The oldest retry enqueued for a trial whose autotune is gone (`_fail_stale`: by optuna's
    RetryFailedTrialCallback, which copies the trial's parameters and records `failed_trial`), but a
    baseline's, which the baseline's claim takes; None when none waits."""
    return next((t for t in trials if t.state == TrialState.WAITING and "failed_trial" in t.system_attrs
                 and not t.user_attrs.get("baseline")), None)


def abandon_stale_trials(study: optuna.Study, trials: Sequence[FrozenTrial]) -> list[int]:
    """RUNNING trials (of `trials`, the study as just read) whose autotune is gone become FAIL
    (CUT_SHORT), never left dangling: at once when that autotune ran on this host and provably no
    longer runs (`holder_gone`: a `kill -9` and the same command again), else once it stopped
    beating for the grace period (killed on any host). A trial of an autotune older than
    heartbeats has none: it is stale once it is older than the grace period."""
    running = [t for t in trials if t.state == TrialState.RUNNING]
    stale_ids = storage.stale_trial_ids(study) if running else set()
    failed = []
    for t in running:
        reason = _gone_reason(t, stale_ids)
        if reason and _fail_stale(study, t, reason):
            failed.append(t.number)
    return failed


def holder_gone(trial: FrozenTrial) -> bool:
    """The autotune that claimed the trial ran on this host and provably no longer runs: its pid
    names no process, or one started at another time (`processes.gone`)."""
    attrs = trial.user_attrs
    return (attrs.get("host") == host_name() and "pid" in attrs
            and processes.gone(int(attrs["pid"]), str(attrs.get("pid_space", "")), attrs.get("pid_started")))


def _gone_reason(trial: FrozenTrial, stale_ids: set[int]) -> str:
    """Why the RUNNING trial's autotune is known gone ("": it may still run)."""
    killed = f"left running by an autotune process (pid {trial.user_attrs.get('pid')}) that was killed"
    if holder_gone(trial):
        return f"{killed}: that process no longer runs on this host"
    if trial._trial_id in stale_ids or _stale_without_heartbeat(trial):
        return f"{killed}: no heartbeat for over {storage.GRACE_PERIOD_S}s"
    return ""


def _stale_without_heartbeat(trial: FrozenTrial) -> bool:
    started = trial.datetime_start
    return ("heartbeat_s" not in trial.user_attrs and started is not None
            and (datetime.datetime.now() - started).total_seconds() > storage.GRACE_PERIOD_S)


def _fail_stale(study: optuna.Study, trial: FrozenTrial, reason: str) -> bool:
    """What optuna.storages.fail_stale_trials does (fail it, then the storage's callback retries
    it), with the reason recorded first (a finished trial's attributes cannot change). False when
    another worker got it first."""
    backend = study._storage
    try:
        backend.set_trial_user_attr(trial._trial_id, "status", "failed")
        backend.set_trial_user_attr(trial._trial_id, "fail_reason", reason)
        backend.set_trial_user_attr(trial._trial_id, "fail_cause", CUT_SHORT)
        backend.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:  # another autotune got it first
        return False
    storage.after_stale(study, trial._trial_id)
    return True
