"""A study shared by many workers (machines on one PostgreSQL study): claiming the next trial one
worker at a time, the host class a study is for, each host's own baseline, and what other workers
are measuring right now.

Choosing and claiming the next trial happens in one worker at a time (storage.exclusive; a no-op on
SQLite, where one search runs per study): dead workers' trials are failed, this host class's
baseline comes first, then trials enqueued through Optuna, then a proposal that treats the other
workers' running configurations as measured; the trial's configuration is fixed in the study
before the lock is let go, so no two workers take the baseline or the same configuration.

A study is for one host class (`machine.host_class`): a worker of another class is refused, unless
`--allow-mixed`. Every host measures PyTorch's defaults before its first trial (the host that runs
the study's baseline trial uses that one), and every trial's speedup is over its own host's
baseline (recorded for reading across hosts; the objective stays the raw metric, docs/fleets.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import AutotuneError, interrupt_reason
from autotune.config.knobs import Config, identity_of
from autotune.config.space import BATCH_PARAM, SearchSpace
from autotune.host.machine import class_id, host_name
from autotune.measure.replicates import Measurement
from autotune.search import compile_skip, proposals, warm
from autotune.study import holders, quality_records, records, storage, undecided
from autotune.study.storage import StudyError, StudyLocked

CLASS_ATTR = records.HOST_CLASS  # on the study: the class it is for; on a trial: its host's class id
CONFIRMING = "confirming"  # on the study: the worker that confirms, and for how many finished trials
HOST_BASELINE = records.HOST_BASELINE  # + host name, on the study: that host's own baseline
REFERENCE_KEYS = ("latency_p50_ms", "throughput_ips")
Identity = tuple[str, int]
T = TypeVar("T")
# What a trial measures: the baseline, a trial already enqueued in the study, or a proposal.
Next = proposals.Proposal | Literal["baseline", "enqueued"]


@dataclass(frozen=True)
class Worker:
    """What claiming a trial needs of a search: the study and where it lives, `--trials`, how a
    configuration is proposed and sampled, the batch sizes, and this host's class id."""

    study: optuna.Study
    storage: str
    trials: int
    space: SearchSpace
    proposer: proposals.Proposer
    batch_sizes: tuple[int, ...]  # the first is the baseline's; more than one are searched
    digest: str  # claims.settings_digest of the measurement settings
    klass: str  # machine.class_id of this host

    def patiently(self, action: Callable[[], T]) -> T:
        """Every read and write of the study waits while another process locks it."""
        return storage.patiently(self.storage, action)


@dataclass(frozen=True)
class Claimed:
    """The trial this worker runs next: what it measures, as it was fixed in the study."""

    trial: optuna.Trial
    proposal: Next
    config: Config
    batch: int


def claim(worker: Worker) -> Claimed | Literal["taken"] | None:
    """Fail dead workers' trials, choose the next trial and fix its configuration in the study, in
    one worker at a time (None: the space is exhausted; "taken": finished and running trials make
    --trials already and no retry waits)."""
    study = worker.study
    with storage.exclusive(study):
        trials = worker.patiently(lambda: current_trials(study))
        if _all_taken(worker, trials):
            return "taken"
        proposed = worker.patiently(lambda: _propose(worker, trials))
        if proposed is None:
            return None
        trial = worker.patiently(functools.partial(ask, worker, proposed))
        with never_left_running(worker, trial):
            config, batch = worker.patiently(lambda: _start_trial(worker, trial, proposed))
    return Claimed(trial, proposed, config, batch)


def current_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The study's trials, read once for every choice of a claim, after dead workers' trials are
    failed (read again only when one was). Read in several snapshots, a trial another worker
    finished in between was in neither (proposed again, or counted twice); and each read fetches
    every unfinished trial from the server again, which is most of a claim's time in a large fleet
    (docs/fleets.md, "Scaling")."""
    trials = study.get_trials(deepcopy=False)
    if holders.abandon_stale_trials(study, trials):
        trials = study.get_trials(deepcopy=False)
    return trials


def _all_taken(worker: Worker, trials: Sequence[FrozenTrial]) -> bool:
    """Finished trials and those other workers run make --trials, and no retry of a dead worker's
    trial waits. (On SQLite one search runs per study: a running trial there is a killed one's.)"""
    others = storage.is_server(worker.storage)
    running = sum(t.state == TrialState.RUNNING for t in trials) if others else 0
    return (len(records.counted(trials)) + running >= worker.trials
            and not any(t.state == TrialState.WAITING for t in trials))


@contextlib.contextmanager
def never_left_running(worker: Worker, trial: optuna.Trial) -> Iterator[None]:
    """Whatever goes wrong in the block, the trial is recorded failed with the reason (unless the
    database stays locked: then the next start marks it failed)."""
    try:
        yield
    except KeyboardInterrupt as exc:
        _abandon(worker, trial, interrupt_reason(exc))
        raise
    except StudyLocked:
        raise
    except BaseException as exc:
        _abandon(worker, trial, f"autotune failed: {type(exc).__name__}: {exc}")
        raise


def _abandon(worker: Worker, trial: optuna.Trial, reason: str) -> None:
    """A trial cut short is recorded as failed with the reason, never left RUNNING (unless the
    database stays locked: then the next start marks it failed)."""
    study = worker.study

    def fail() -> None:
        if not study._storage.get_trial(trial._trial_id).state.is_finished():
            records.record_failure(trial, reason, records.CUT_SHORT)
            study.tell(trial, state=TrialState.FAIL)

    with contextlib.suppress(StudyLocked):
        worker.patiently(fail)


def _propose(worker: Worker, trials: Sequence[FrozenTrial]) -> Next | None:
    """The baseline first; then trials enqueued through Optuna (by a user, or by an autotune
    stopped between enqueueing and asking), sampled as they are; then a configuration that has not
    run, nor was skipped on the evidence there is now (`compile_skip.held`; None: the space is
    exhausted). `trials`: the study as `current_trials` read it."""
    if not baseline_taken(trials, worker.klass):
        return "baseline"
    resumed = holders.waiting_retry(trials)
    if resumed is not None:
        return worker.proposer.resumed(resumed)
    if any(t.state == TrialState.WAITING for t in trials):
        return "enqueued"
    retry = undecided.due(trials, worker.digest)
    if retry is not None:
        return worker.proposer.again(retry)
    held = compile_skip.held(worker.space, trials, worker.klass, worker.digest)
    cover = compile_skip.uncovered(worker.space, trials, worker.klass)
    wrong = quality_records.wrong_models(trials, worker.digest, worker.klass)
    short = quality_records.short_on_quality(trials, worker.digest, worker.klass)
    proposal = worker.proposer.next(worker.study, trials, taken(trials, worker.digest) | held, cover, wrong, short)
    waiting = undecided.pending(trials, worker.digest)
    if proposal is None and waiting:  # nothing else left: the noisy stops are measured again now
        return worker.proposer.again(waiting[0])
    return proposal


def ask(worker: Worker, proposal: Next) -> optuna.Trial:
    """A new trial; a proposal's parameters are fixed in it by enqueueing them just before. The
    baseline takes only the retry of a dead worker's baseline among the enqueued trials: another
    (a user's configuration, a retry of another trial) would be measured as the defaults."""
    study = worker.study
    queued = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    if proposal == "baseline":
        retry = next((t for t in queued if t.user_attrs.get("baseline") and "failed_trial" in t.system_attrs
                      and t.user_attrs.get(CLASS_ATTR, worker.klass) == worker.klass), None)
        return storage.take(study, retry._trial_id if retry else None)
    if isinstance(proposal, proposals.Proposal) and proposal.waiting is not None:
        return storage.take(study, proposal.waiting)
    waiting = [t.system_attrs.get("fixed_params") for t in queued]
    if isinstance(proposal, proposals.Proposal) and proposal.params not in waiting:  # a retry after a lock finds it
        study.enqueue_trial(proposal.params)
    return storage.ask(study)


def _start_trial(worker: Worker, trial: optuna.Trial, proposal: Next) -> tuple[Config, int]:
    holders.claim_trial(trial, worker.klass)
    is_baseline = proposal == "baseline"
    if isinstance(proposal, proposals.Proposal):
        # its knobs, not one more sampled: a recipe, a killed trial's retry, a warm start (which may be a recipe)
        exact = proposal.recipe or proposal.waiting is not None or proposal.warm is not None
        config = worker.space.sample(trial, only=proposal.config if exact else None)
        if config != proposal.config:  # the enqueued parameters were not taken: never measure a surprise
            raise AutotuneError(f"trial {trial.number} sampled {config.describe()} instead of the proposed "
                                f"{proposal.config.describe()}")
        trial.set_user_attr("proposed_by", proposal.origin)
        if proposal.warm is not None:
            trial.set_user_attr(warm.ATTR, proposal.warm)
        if proposal.recipe:
            trial.set_user_attr("recipe", proposal.recipe)
    elif proposal == "enqueued":
        config = worker.space.sample(trial)
        trial.set_user_attr("proposed_by", "enqueued")
    else:
        config = Config()
    batch = _batch_size(worker, trial, is_baseline)
    trial.set_user_attr("baseline", is_baseline)
    trial.set_user_attr("config", config.describe())
    trial.set_user_attr("batch_size", batch)
    trial.set_user_attr("settings_digest", worker.digest)
    return config, batch


def _batch_size(worker: Worker, trial: optuna.Trial, is_baseline: bool) -> int:
    if len(worker.batch_sizes) <= 1 or is_baseline:
        return worker.batch_sizes[0]
    return int(trial.suggest_categorical(BATCH_PARAM, list(worker.batch_sizes)))


def claim_class(study: optuna.Study, host_class: Mapping[str, Any], allow_mixed: bool) -> list[str]:
    """A new study records this host's class; an existing one refuses a host of another class
    (one line: a study per class, or --allow-mixed). Returns notes."""
    recorded = study.user_attrs.get(CLASS_ATTR)
    if recorded is None:
        study.set_user_attr(CLASS_ATTR, dict(host_class))
        return []
    differ = [key for key in host_class if recorded.get(key) != host_class[key]]
    if not differ:
        return []
    key = differ[0]
    if allow_mixed:
        return [f"this host's class differs from study {study.study_name}'s ({key}); --allow-mixed ranks both "
                f"classes' raw values together (a slower host's trials rank lower); each trial's speedup over its "
                f"own host's baseline is recorded beside"]
    raise StudyError(f"this host is not of the class study {study.study_name!r} is for ({key}: {host_class[key]} "
                     f"here, {recorded.get(key)} in the study); start a study per host class, e.g. --study "
                     f"{study.study_name}-{class_id(dict(host_class))}, or pass --allow-mixed")


def host_baseline(study: optuna.Study, host: str) -> dict[str, float] | None:
    """This host's own baseline (p50 latency, throughput), or None before it measured one."""
    reference = host_reference(study, host)
    return None if reference is None else {key: float(reference[key]) for key in REFERENCE_KEYS}


def host_reference(study: optuna.Study, host: str) -> dict[str, Any] | None:
    """This host's baseline as the study records it (`records.HOST_BASELINE`): its values, whether
    it was measured on a noisy window, after which trial, and its re-measure; for the host that ran
    the study's baseline trial and never measured it again, that trial's."""
    recorded = study.user_attrs.get(HOST_BASELINE + host)
    if recorded is not None:
        return dict(recorded)
    ran = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
           if t.user_attrs.get("baseline") and t.user_attrs.get("host") == host]
    if not ran:
        return None
    attrs = ran[0].user_attrs
    return {**{key: float(attrs[key]) for key in REFERENCE_KEYS}, "noisy": bool(attrs.get("noisy")),
            "noisy_reason": attrs.get("noisy_reason", ""), "after_trial": ran[0].number}


def record_host_baseline(study: optuna.Study, host: str, measurement: Measurement) -> dict[str, float]:
    summary = measurement.summary()
    reference = {key: float(summary[key]) for key in REFERENCE_KEYS}
    after = max((t.number for t in study.get_trials(deepcopy=False, states=records.FINISHED)), default=-1)
    study.set_user_attr(HOST_BASELINE + host, {**reference, "noisy": measurement.noisy,
                                               "noisy_reason": measurement.noisy_reason, "after_trial": after})
    return reference


def record_remeasure(study: optuna.Study, host: str, measurement: Measurement) -> dict[str, Any]:
    """This host's baseline measured again (`undecided.baseline_due`): the attempt is kept, and when
    its window was quiet it becomes the reference every speedup of this host reads over
    (`records.speedup`); a noisy attempt leaves the reference as it was."""
    reference = host_reference(study, host) or {}
    summary = measurement.summary()
    after = max((t.number for t in study.get_trials(deepcopy=False, states=records.FINISHED)), default=-1)
    attempt = {**{key: float(summary[key]) for key in REFERENCE_KEYS}, "noisy_reason": measurement.noisy_reason,
               "after_trial": after}
    earlier = reference.get("remeasured") or {"was": {key: reference.get(key) for key in
                                                      (*REFERENCE_KEYS, "noisy_reason")}, "attempts": []}
    remeasured = {**earlier, "attempts": [*earlier["attempts"], attempt], "quiet": not measurement.noisy}
    updated = {**reference, "after_trial": after, "remeasured": remeasured}
    if not measurement.noisy:
        updated.update({key: attempt[key] for key in REFERENCE_KEYS}, noisy=False, noisy_reason="")
    study.set_user_attr(HOST_BASELINE + host, updated)
    return updated


def taken(trials: Sequence[FrozenTrial], digest: str) -> set[Identity]:
    """(config, batch size) of what ran, what other workers are measuring now and what waits for
    the retry of a noisy stop, under these settings: a proposal treats them all as measured."""
    waiting = {records.identity(t) for t in undecided.pending(trials, digest)}
    return records.measured_configs(trials, digest) | _in_flight(trials, digest) | waiting


def _in_flight(trials: Sequence[FrozenTrial], digest: str) -> set[Identity]:
    return {(identity_of(str(t.user_attrs["config"])), int(t.user_attrs.get("batch_size", 0)))
            for t in trials if t.state == TrialState.RUNNING
            and t.user_attrs.get("settings_digest") == digest and "config" in t.user_attrs
            and not t.user_attrs.get("baseline")}


def claim_confirmation(study: optuna.Study, url: str) -> bool:
    """Whether this worker confirms the study now. On a server, one worker does: the one that
    stops with no trial running or waiting, once for the trials finished then (two that stop
    together: the first to get here). On SQLite one search runs per study: it does."""
    if not storage.is_server(url):
        return True
    with storage.exclusive(study):
        trials = study.get_trials(deepcopy=False)
        if any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials):
            return False
        finished = sum(t.state.is_finished() for t in trials)
        if study.user_attrs.get(CONFIRMING, {}).get("finished") == finished:
            return False
        study.set_user_attr(CONFIRMING, {"host": host_name(), "pid": os.getpid(), "finished": finished})
        return True


def baseline_taken(trials: Sequence[FrozenTrial], klass: str) -> bool:
    """The study's baseline trial for this host class has run or is running (exactly one runs)."""
    return any(t.state in (TrialState.COMPLETE, TrialState.RUNNING) and t.user_attrs.get("baseline")
               and t.user_attrs.get(CLASS_ATTR, klass) == klass for t in trials)
