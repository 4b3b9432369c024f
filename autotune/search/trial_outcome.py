"""One trial of a search: its configuration measured (or its earlier twin's result reused, its
compile skipped on a prediction, its plan refused here), judged on the user's data, and recorded and
told to Optuna, waiting while the database is locked and keeping the measurement beside the study
when the lock outlasts the wait (`kept`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import AutotuneError, RunFailed
from autotune.config.knobs import Config
from autotune.host import floor as host_floor
from autotune.host.machine import Machine, host_name
from autotune.measure import quality, requests
from autotune.measure.objectives import values_of
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import Measurement, PlanRunner, measure_replicates, undisturbed_spreads
from autotune.measure.results import RunResult
from autotune.search import compile_skip, fleet, opening, pruning
from autotune.search.opening import Search
from autotune.study import quality_records, records, storage, undecided
from autotune.study.storage import StudyLocked

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome:
    """How a trial ended: values when complete, a reason when failed or pruned."""

    state: TrialState
    values: tuple[float, ...] = ()
    reason: str = ""
    measurement: Measurement | None = None
    duplicate_of: int | None = None
    undecided: tuple[int, ...] | None = None  # a stop on a noisy window: the earlier undecided attempts
    hopeless: bool = False  # an undecided stop with no retry: this host's recent windows were all disturbed
    retry_of: int | None = None  # the earlier failed trial of this configuration it measured again
    quality: tuple[str, dict[str, Any]] | None = None  # with --eval-data: (`quality_records.quality_key`, the figures)


def host_baseline(search: Search, machine: Machine, runner: PlanRunner) -> dict[str, float]:
    """This host's own baseline, measured before its first trial unless it ran the study's."""
    host = host_name()
    known = patiently(search, lambda: fleet.host_baseline(search.study, host))
    if known is not None:
        return known
    plan = requests.make_plan(opening.bench_request(search.request, Config()), machine)
    measured = measured_here(search, machine, plan, runner)
    if not measured.ok:
        raise RunFailed(f"this host's baseline (PyTorch defaults) failed: {measured.reason}; autotune needs it to "
                        f"tune; try `autotune bench --model {search.request.model}` to see why")
    return patiently(search, lambda: fleet.record_host_baseline(search.study, host, measured))


def _measured_as(search: Search, trial: optuna.Trial, config: Config, batch: int) -> FrozenTrial | None:
    """The earlier trial whose result this one reuses: one that launched the same, and for a
    configuration that launches what the baseline does (`allocator=default`), this host's baseline."""
    if config.identity() == Config().identity() and batch == search.request.batch_size:
        return records.baseline(search.study, search.klass)
    return records.same_config(search.study, trial.number, config.identity(), batch, search.settings_digest)


def measure(search: Search, machine: Machine, trial: optuna.Trial, config: Config, batch: int,
            runner: PlanRunner, *, sampled: bool) -> Outcome:
    """Measure one trial's configuration; a failure is a reason, never an exception. What ran is
    recorded by `_store`, so that a locked database cannot lose it. A `sampled` one (the search's
    own proposal: not the baseline, a recipe, or a trial enqueued through Optuna) whose new
    compile is predicted to lose is pruned without running (`compile_skip.skip_compile`)."""
    request = search.request
    duplicate = patiently(search, lambda: _measured_as(search, trial, config, batch)) if config.values else None
    if duplicate is not None:
        return _reuse(search, trial, duplicate)
    skipped = patiently(search, lambda: compile_skip.skip_compile(search.study, search.space, request.objective,
                                                              config, search.klass)) if sampled else None
    if skipped is not None:
        patiently(search, lambda: records.record_skipped(trial, skipped.reason, skipped.evidence))
        return Outcome(TrialState.PRUNED, reason=skipped.reason)
    retry_of = patiently(search, lambda: records.mark_rerun(trial, search.study.get_trials(deepcopy=False)))
    try:
        plan = requests.make_plan(opening.bench_request(request, config, batch), machine)
    except AutotuneError as exc:
        reason = str(exc)
        patiently(search, lambda: records.record_failure(trial, reason, records.CANNOT_RUN))
        return Outcome(TrialState.FAIL, reason=reason, retry_of=retry_of)
    patiently(search, lambda: records.record_plan(trial, plan))
    earlier = patiently(search, lambda: _earlier_attempts(search, trial, config, batch))
    pruner = pruning.PruneCheck(search.study, trial, request.objective)
    limit = _give_up(search, plan)
    measurement = measured_here(search, machine, plan, runner, after_each=_pruning(search, pruner),
                                give_up_above_ms=limit.above_ms if limit else ())
    if not measurement.ok:
        return Outcome(TrialState.FAIL, reason=measurement.reason, measurement=measurement, retry_of=retry_of)
    if measurement.stopped_early:
        last = measurement.runs[-1]
        reason = limit.reason(last) if limit is not None and last.gave_up else pruner.reason
        if measurement.noisy:
            return _noisy_stop(search, reason, measurement, earlier, limit, pruner, retry_of)
        return Outcome(TrialState.PRUNED, reason=reason, measurement=measurement, retry_of=retry_of)
    return Outcome(TrialState.COMPLETE, values_of(request.objective, measurement), measurement=measurement,
                   retry_of=retry_of, quality=_quality(search, plan, config, batch))


def _noisy_stop(search: Search, reason: str, measurement: Measurement, earlier: tuple[int, ...],
                limit: pruning.GiveUp | None, pruner: pruning.PruneCheck, retry_of: int | None) -> Outcome:
    """A stop on a window flagged noisy. Windows only wider than this host's floor are read as the
    distribution they are: the stop stands when its median's interval clears the line it crossed
    (`pruning.clear_under_spread`). A disturbed window (or a wide one whose interval reaches back)
    decides nothing (study/undecided.py): measured again at most once, and not at all where this
    host's recent windows were all disturbed."""
    if not measurement.disturbed:
        clear = pruning.clear_under_spread(measurement, limit, pruner)
        if clear:
            return Outcome(TrialState.PRUNED, reason=f"{reason}; its windows are wider than this host's floor "
                                                     f"({measurement.wide_reason}), and {clear}",
                           measurement=measurement, retry_of=retry_of)
    hopeless = patiently(search, lambda: undecided.quiet_unlikely(search.study.get_trials(deepcopy=False)))
    return Outcome(TrialState.FAIL, reason=undecided.explain(reason, measurement.noisy_reason, earlier, hopeless),
                   measurement=measurement, undecided=earlier, hopeless=hopeless, retry_of=retry_of)


def measured_here(search: Search, machine: Machine, plan: LaunchPlan, runner: PlanRunner,
                  **how: Any) -> Measurement:
    """`measure_replicates` judged against this host's spread floor as it stands before the
    measurement; its undisturbed windows then join the floor."""
    kept = host_floor.Kept(search.request.cache_dir, len(machine.topology.usable_cores))
    measurement = measure_replicates(plan, search.request.replicates, runner, floor=kept.threshold(), **how)
    if measurement.ok:
        kept.learn(undisturbed_spreads(measurement))
    return measurement


def _quality(search: Search, plan: LaunchPlan, config: Config, batch: int) -> tuple[str, dict[str, Any]] | None:
    """With --eval-data, a completed trial's quality on the search's held-out part: measured once per
    model configuration and batch size (`quality_records.quality_key`), reused by every trial that shares them."""
    if not plan.bench.judged:
        return None
    key = quality_records.quality_key(config, batch)
    known = patiently(search, lambda: quality_records.known_quality(search.study, key))
    return key, known if known is not None else quality.measure(plan, "search", search.request.replicates.timeout_s)


def _earlier_attempts(search: Search, trial: optuna.Trial, config: Config, batch: int) -> tuple[int, ...]:
    """This configuration's undecided attempts before this trial, recorded on it when there are any."""
    trials = search.study.get_trials(deepcopy=False)
    earlier = undecided.earlier_attempts(trials, config.describe(), batch, search.settings_digest)
    if earlier:
        trial.set_user_attr(undecided.ATTEMPTS, earlier)
    return tuple(earlier)


def _give_up(search: Search, plan: LaunchPlan) -> pruning.GiveUp | None:
    """Where a trial measured in one warmed process gives up (`pruning.GiveUp`); a locked
    database past the wait, like the pruner's, measures the trial in full."""
    if not search.request.replicates.in_process:
        return None
    try:
        return patiently(search, lambda: pruning.give_up(search.study, search.request.objective, plan))
    except StudyLocked:
        return None


def _pruning(search: Search, pruner: pruning.PruneCheck) -> Callable[[int, RunResult, bool], bool]:
    """The pruner waits for a locked database too; past the wait the trial is measured in full."""

    def check(index: int, run: RunResult, more_planned: bool) -> bool:
        try:
            return patiently(search, lambda: pruner(index, run, more_planned))
        except StudyLocked:
            return False

    return check


def store(search: Search, trial: optuna.Trial, outcome: Outcome, reference: dict[str, float] | None) -> None:
    """Record what the trial measured and tell Optuna, waiting while the database is locked; if
    the lock outlasts the wait, the measurement is kept in a file beside the study."""
    try:
        patiently(search, lambda: _record_and_tell(search, trial, outcome, reference))
    except StudyLocked as exc:
        if outcome.measurement is None:
            raise
        kept = storage.keep_aside(search.storage, search.request.studies_dir, f"{search.name}.trial-{trial.number}",
                                  _unsaved(search, trial, outcome))
        raise StudyLocked(f"{exc}; trial {trial.number}'s measurement is kept in {kept}; close what holds the "
                          "database (optuna-dashboard, sqlite3) and rerun the same command") from None


def _unsaved(search: Search, trial: optuna.Trial, outcome: Outcome) -> dict[str, Any]:
    measurement = outcome.measurement
    assert measurement is not None
    return {"study": search.name, "storage": search.storage, "trial": trial.number,
            "params": trial.params, "state": outcome.state.name, "values": list(outcome.values),
            "reason": outcome.reason, "summary": measurement.summary() if measurement.ok else {},
            "cause": records.failure_cause(measurement) if not measurement.ok else (
                records.UNDECIDED if outcome.undecided is not None else ""),
            records.WRONG_ANSWERS: not measurement.ok and records.answered_wrong(measurement),
            "samples_ms": measurement.samples(), "runs": [run.summary() for run in measurement.runs]}


def _record_and_tell(search: Search, trial: optuna.Trial, outcome: Outcome,
                     reference: dict[str, float] | None) -> None:
    measurement = outcome.measurement
    if measurement is not None and not measurement.ok:
        records.record_failed_run(trial, measurement)
    elif measurement is not None:
        records.record_metrics(trial, measurement, reference)
        if outcome.state == TrialState.PRUNED:
            records.record_pruned(trial, outcome.reason)
        if outcome.undecided is not None:
            undecided.record(trial, outcome.reason, outcome.undecided, outcome.hopeless)
    if outcome.quality is not None:
        quality_records.record_quality(trial, *outcome.quality)
    if outcome.state == TrialState.COMPLETE:
        quality_records.record_limits(trial, search.request.limits, trial.user_attrs)
        search.study.tell(trial, list(outcome.values), skip_if_finished=True)
    else:
        search.study.tell(trial, state=outcome.state, skip_if_finished=True)



def _reuse(search: Search, trial: optuna.Trial, duplicate: FrozenTrial) -> Outcome:
    """The same configuration ran before: its result (and intermediate values) are reused, be it
    a measurement, a pruning or a failure."""
    patiently(search, lambda: records.copy_result(trial, duplicate))
    if duplicate.state == TrialState.COMPLETE:
        return Outcome(TrialState.COMPLETE, tuple(duplicate.values), duplicate_of=duplicate.number)
    return Outcome(duplicate.state, reason=f"same configuration as trial {duplicate.number}: "
                                           f"{records.end_reason(duplicate)}", duplicate_of=duplicate.number)
def patiently(search: Search, action: Callable[[], T]) -> T:
    """Every read and write of the study during a search waits while another process locks it."""
    return storage.patiently(search.storage, action)
