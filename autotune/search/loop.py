"""The search: open a study for a request, then ask Optuna for configurations, measure each once,
and tell it the result; the first trial is the baseline (PyTorch's defaults).

On one machine trials run one after another (timings need the machine to themselves); on a
database server several machines are workers of one study, each claiming its next trial (fleet.py).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import AutotuneError, RunFailed
from autotune.config.knobs import Config
from autotune.host.machine import (
    Machine,
    host_name,
)
from autotune.measure import quality, requests
from autotune.measure.objectives import values_of
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import Measurement, PlanRunner, measure_replicates
from autotune.measure.results import RunResult
from autotune.measure.runner import run_plan
from autotune.search import budget, confirm, fleet, opening, proposals, pruning
from autotune.search.opening import Search, SearchRequest
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
    retry_of: int | None = None  # the earlier failed trial of this configuration it measured again
    quality: tuple[str, dict[str, Any]] | None = None  # with --eval-data: (`quality_records.quality_key`, the figures)


@dataclass(frozen=True)
class TrialEvent:
    """Progress for the display: a trial started or finished, or the baseline (`number`) was
    measured again (`note` says how)."""

    kind: Literal["start", "done", "baseline"]
    number: int
    config: Config
    finished: int
    total: int
    elapsed_s: float
    outcome: Outcome | None = None
    best: FrozenTrial | None = None
    recipe: str = ""
    finished_before: int = 0  # finished when this session started: the ETA counts only this session's
    speedups: Mapping[str, float | None] = field(default_factory=dict)  # the best's, over the baseline as known now
    note: str = ""


def run_search(search: Search, machine: Machine, on_event: Callable[[TrialEvent], None],
               runner: PlanRunner = run_plan, clock: Callable[[], float] = time.monotonic) -> str:
    """Run trials until the study holds `--trials` finished ones, each a configuration not measured
    before; the first is the baseline, then the experts' recipes. Returns why it stopped early
    ("" when it ran them all): every configuration of the space has run, or the time budget has no
    room for another trial (`clock` measures it)."""
    start = time.monotonic()
    before = _patiently(search, lambda: records.finished(search.study))

    def account() -> None:  # only a session that added trials counts; workers of a fleet end together
        with storage.exclusive(search.study):
            if records.finished(search.study) > before:
                records.account(search.study, time.monotonic() - start)

    try:
        stopped = _trials(search, machine, on_event, runner, start, clock)
    except StudyLocked:
        raise  # nothing can be written now
    except BaseException:
        with contextlib.suppress(StudyLocked):
            _patiently(search, account)
        raise
    _patiently(search, account)
    return stopped


def _trials(search: Search, machine: Machine, on_event: Callable[[TrialEvent], None], runner: PlanRunner,
            start: float, clock: Callable[[], float]) -> str:
    study = search.study
    began, prior = clock(), _patiently(search, lambda: records.wall_per_trial(study))
    spent: list[budget.Spent] = []
    while (finished := _patiently(search, lambda: records.finished(study))) < search.request.trials:
        limit = _time_budget(search.request)
        ended = None
        if limit:
            chosen = _patiently(search, lambda: _candidates(search))
            ended = limit.check(clock() - began, spent, finished, prior, chosen)
        if ended is not None:
            _patiently(search, functools.partial(records.record_end, study, ended))
            return budget.message(ended, records.finished(study))
        _quiet_baseline(search, machine, runner, on_event, start)
        claimed = fleet.claim(search.worker())
        if claimed == "taken":
            break  # the other workers run the trials left
        if claimed is None:
            _patiently(search, lambda: records.record_end(study, {"by": "space exhausted"}))
            return _exhausted(search)
        trial_began = clock()
        try:
            with fleet.never_left_running(search.worker(), claimed.trial), storage.heartbeat(study, claimed.trial):
                outcome = _run_trial(search, machine, claimed, start, on_event, runner)
        except optuna.exceptions.UpdateFinishedTrialError:
            if not _taken_over(search, claimed, start, on_event):
                raise
            continue
        spent.append(_spent(search.request, clock() - trial_began, outcome, claimed.proposal == "baseline",
                            claimed.trial.number))
    _patiently(search, lambda: records.record_end(study, {"by": "trials"}))
    return ""


def _exhausted(search: Search) -> str:
    """Why nothing is left to propose, with what was left out: compiles predicted to lose, and the
    other configurations of models that gave wrong answers."""
    trials = _patiently(search, lambda: search.study.get_trials(deepcopy=False))
    skipped = records.not_compiled_configs(trials, search.settings_digest)
    more = f", and {skipped} more were not compiled, predicted to lose" if skipped else ""
    wrong = sorted(quality_records.wrong_models(trials, search.settings_digest, search.klass).values())
    if wrong:
        more += (f", and no other configuration of the model{'s' if len(wrong) > 1 else ''} that gave wrong answers "
                 f"in trial{'s' if len(wrong) > 1 else ''} {', '.join(map(str, wrong))}")
    return (f"every configuration of the space has run ({records.distinct_configs(search.study)} distinct, "
            f"baseline included{more}); widen the space (--space) to search further")


def _time_budget(request: SearchRequest) -> budget.TimeBudget | None:
    if request.time_budget_s is None:
        return None
    return budget.TimeBudget(request.time_budget_s, request.confirm_rounds, request.confirm_top,
                             request.replicates.replicates, request.measure.duration_s, request.replicates.in_process)


def _candidates(search: Search) -> list[int]:
    """The trials the confirmation would take now, for the time budget's share."""
    request = search.request
    if not (request.confirm_top and request.confirm_rounds) or records.baseline(search.study) is None:
        return []
    chosen = confirm.candidates(search.study, request.confirm_top)[1]
    return [trial.number for trial in [*chosen, *confirm.extra_references(search.study, chosen)]]


def _spent(request: SearchRequest, wall_s: float, outcome: Outcome, baseline: bool, number: int) -> budget.Spent:
    """What the trial took, for the time budget: its compiling, first call, warmup and timed
    windows as measured."""
    measured = outcome.measurement
    if measured is None or not measured.runs:  # a duplicate, or a plan that could not be made
        return budget.Spent(None, baseline, number=number)
    summary = measured.summary() if measured.ok else {"timed_s": 0.0}
    planned = request.replicates.replicates
    windows = sum(run.windows(planned) if run.gave_up else 1 for run in measured.runs)
    first_call = records.first_call(measured)
    return budget.spent(wall_s, budget.compile_seconds(first_call), float(summary["timed_s"]), windows,
                        request.replicates.in_process, baseline, budget.settle_seconds(first_call), number)


def _patiently(search: Search, action: Callable[[], T]) -> T:
    """Every read and write of the study during a search waits while another process locks it."""
    return storage.patiently(search.storage, action)


def _run_trial(search: Search, machine: Machine, claimed: fleet.Claimed, start: float,
               on_event: Callable[[TrialEvent], None], runner: PlanRunner) -> Outcome:
    study, trial, proposal, config, batch = search.study, claimed.trial, claimed.proposal, claimed.config, claimed.batch
    is_baseline = proposal == "baseline"
    event = _event_fields(search, claimed)
    finished = _patiently(search, lambda: records.finished(study))
    on_event(TrialEvent("start", finished=finished, elapsed_s=time.monotonic() - start, **event))
    reference = None if is_baseline else _host_baseline(search, machine, runner)
    outcome = _measure(search, machine, trial, config, batch, runner,
                       sampled=isinstance(proposal, proposals.Proposal) and not proposal.recipe
                       and proposal.retry_of is None)
    _store(search, trial, outcome, reference)
    if is_baseline and outcome.state != TrialState.COMPLETE:
        raise RunFailed(f"the baseline (PyTorch defaults) failed: {outcome.reason}; autotune needs it to "
                        f"tune; try `autotune bench --model {search.request.model}` to see why")
    finished, best = _patiently(search, lambda: (records.finished(study), records.best_trials(study)))
    on_event(TrialEvent("done", finished=finished, elapsed_s=time.monotonic() - start, outcome=outcome,
                        best=best[0] if best else None, speedups=_speedups(study, best), **event))
    return outcome


def _speedups(study: optuna.Study, best: list[FrozenTrial]) -> dict[str, float | None]:
    """The best trial's speedups over its host's baseline as the study knows it now (`records.speedup`)."""
    if not best:
        return {}
    attrs = study.user_attrs
    return {key: records.speedup(best[0], key, attrs) for key in ("speedup_latency", "speedup_throughput")}


def _quiet_baseline(search: Search, machine: Machine, runner: PlanRunner, on_event: Callable[[TrialEvent], None],
                    start: float) -> None:
    """This host's baseline, measured on a noisy window, measured again once the machine is quiet
    (`undecided.baseline_due`): a quiet re-measure becomes the reference of every speedup."""
    host, study = host_name(), search.study
    reference = _patiently(search, lambda: fleet.host_reference(study, host))
    if not _patiently(search, lambda: undecided.baseline_due(study.get_trials(deepcopy=False), reference)):
        return
    plan = requests.make_plan(opening.bench_request(search.request, Config()), machine)
    measured = measure_replicates(plan, search.request.replicates, runner)
    if not measured.ok:
        return  # the baseline that measured stays; a failure now is no evidence against it
    updated = _patiently(search, lambda: fleet.record_remeasure(study, host, measured))
    finished = _patiently(search, lambda: records.finished(study))
    on_event(TrialEvent("baseline", number=int(updated["after_trial"]), config=Config(), finished=finished,
                        total=search.request.trials, elapsed_s=time.monotonic() - start,
                        finished_before=search.finished_before, note=_remeasure_note(updated, measured)))


def _remeasure_note(reference: Mapping[str, Any], measured: Measurement) -> str:
    was = reference["remeasured"]["was"]
    said = (f"the baseline, measured on a noisy window ({was['noisy_reason']}) at p50 {was['latency_p50_ms']:.2f} ms, "
            f"measured again: p50 {measured.latency_p50_ms:.2f} ms")
    if measured.noisy:
        return f"{said}, noisy again ({measured.noisy_reason}): the first stays the reference"
    return f"{said}, quiet: every speedup now reads over it"


def _event_fields(search: Search, claimed: fleet.Claimed) -> dict[str, Any]:
    proposal = claimed.proposal
    return dict(number=claimed.trial.number, config=claimed.config, total=search.request.trials,
                recipe=proposal.recipe if isinstance(proposal, proposals.Proposal) else "",
                finished_before=search.finished_before)


def _taken_over(search: Search, claimed: fleet.Claimed, start: float, on_event: Callable[[TrialEvent], None]) -> bool:
    """Whether another autotune failed this trial while this one measured it (no heartbeat from
    here reached the database for the grace period) and retries it: then this worker says so and
    goes on, its measurement dropped. False: the trial ended some other way (not ours to hide)."""
    study = search.study
    now = _patiently(search, lambda: study._storage.get_trial(claimed.trial._trial_id))
    if now.state != TrialState.FAIL or records.fail_cause(now) != records.CUT_SHORT:
        return False
    reason = (f"failed by another autotune while this one measured it (no heartbeat from here reached the "
              f"database for over {storage.GRACE_PERIOD_S}s); its retry measures it again")
    finished, best = _patiently(search, lambda: (records.finished(study), records.best_trials(study)))
    on_event(TrialEvent("done", finished=finished, elapsed_s=time.monotonic() - start,
                        outcome=Outcome(TrialState.FAIL, reason=reason), best=best[0] if best else None,
                        **_event_fields(search, claimed)))
    return True


def _host_baseline(search: Search, machine: Machine, runner: PlanRunner) -> dict[str, float]:
    """This host's own baseline, measured before its first trial unless it ran the study's."""
    host = host_name()
    known = _patiently(search, lambda: fleet.host_baseline(search.study, host))
    if known is not None:
        return known
    plan = requests.make_plan(opening.bench_request(search.request, Config()), machine)
    measured = measure_replicates(plan, search.request.replicates, runner)
    if not measured.ok:
        raise RunFailed(f"this host's baseline (PyTorch defaults) failed: {measured.reason}; autotune needs it to "
                        f"tune; try `autotune bench --model {search.request.model}` to see why")
    return _patiently(search, lambda: fleet.record_host_baseline(search.study, host, measured))


def _measured_as(search: Search, trial: optuna.Trial, config: Config, batch: int) -> FrozenTrial | None:
    """The earlier trial whose result this one reuses: one that launched the same, and for a
    configuration that launches what the baseline does (`allocator=default`), this host's baseline."""
    if config.identity() == Config().identity() and batch == search.request.batch_size:
        return records.baseline(search.study, search.klass)
    return records.same_config(search.study, trial.number, config.identity(), batch, search.settings_digest)


def _measure(search: Search, machine: Machine, trial: optuna.Trial, config: Config, batch: int,
             runner: PlanRunner, *, sampled: bool) -> Outcome:
    """Measure one trial's configuration; a failure is a reason, never an exception. What ran is
    recorded by `_store`, so that a locked database cannot lose it. A `sampled` one (the search's
    own proposal: not the baseline, a recipe, or a trial enqueued through Optuna) whose new
    compile is predicted to lose is pruned without running (`pruning.skip_compile`)."""
    request = search.request
    duplicate = _patiently(search, lambda: _measured_as(search, trial, config, batch)) if config.values else None
    if duplicate is not None:
        return _reuse(search, trial, duplicate)
    skipped = _patiently(search, lambda: pruning.skip_compile(search.study, search.space, request.objective,
                                                              config, search.klass)) if sampled else None
    if skipped is not None:
        _patiently(search, lambda: records.record_skipped(trial, skipped.reason, skipped.evidence))
        return Outcome(TrialState.PRUNED, reason=skipped.reason)
    retry_of = _patiently(search, lambda: records.mark_rerun(trial, search.study.get_trials(deepcopy=False)))
    try:
        plan = requests.make_plan(opening.bench_request(request, config, batch), machine)
    except AutotuneError as exc:
        reason = str(exc)
        _patiently(search, lambda: records.record_failure(trial, reason, records.CANNOT_RUN))
        return Outcome(TrialState.FAIL, reason=reason, retry_of=retry_of)
    _patiently(search, lambda: records.record_plan(trial, plan))
    earlier = _patiently(search, lambda: _earlier_attempts(search, trial, config, batch))
    pruner = pruning.PruneCheck(search.study, trial, request.objective)
    limit = _give_up(search, plan)
    measurement = measure_replicates(plan, request.replicates, runner, after_each=_pruning(search, pruner),
                                     give_up_above_ms=limit.above_ms if limit else ())
    if not measurement.ok:
        return Outcome(TrialState.FAIL, reason=measurement.reason, measurement=measurement, retry_of=retry_of)
    if measurement.stopped_early:
        last = measurement.runs[-1]
        reason = limit.reason(last) if limit is not None and last.gave_up else pruner.reason
        if measurement.noisy:  # a noisy window decides nothing (study/undecided.py)
            return Outcome(TrialState.FAIL, reason=undecided.explain(reason, measurement.noisy_reason, earlier),
                           measurement=measurement, undecided=earlier, retry_of=retry_of)
        return Outcome(TrialState.PRUNED, reason=reason, measurement=measurement, retry_of=retry_of)
    return Outcome(TrialState.COMPLETE, values_of(request.objective, measurement), measurement=measurement,
                   retry_of=retry_of, quality=_quality(search, plan, config, batch))


def _quality(search: Search, plan: LaunchPlan, config: Config, batch: int) -> tuple[str, dict[str, Any]] | None:
    """With --eval-data, a completed trial's quality on the search's held-out part: measured once per
    model configuration and batch size (`quality_records.quality_key`), reused by every trial that shares them."""
    if not plan.bench.judged:
        return None
    key = quality_records.quality_key(config, batch)
    known = _patiently(search, lambda: quality_records.known_quality(search.study, key))
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
        return _patiently(search, lambda: pruning.give_up(search.study, search.request.objective, plan))
    except StudyLocked:
        return None


def _pruning(search: Search, pruner: pruning.PruneCheck) -> Callable[[int, RunResult, bool], bool]:
    """The pruner waits for a locked database too; past the wait the trial is measured in full."""

    def check(index: int, run: RunResult, more_planned: bool) -> bool:
        try:
            return _patiently(search, lambda: pruner(index, run, more_planned))
        except StudyLocked:
            return False

    return check


def _store(search: Search, trial: optuna.Trial, outcome: Outcome, reference: dict[str, float] | None) -> None:
    """Record what the trial measured and tell Optuna, waiting while the database is locked; if
    the lock outlasts the wait, the measurement is kept in a file beside the study."""
    try:
        _patiently(search, lambda: _record_and_tell(search, trial, outcome, reference))
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
            undecided.record(trial, outcome.reason, outcome.undecided)
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
    _patiently(search, lambda: records.copy_result(trial, duplicate))
    if duplicate.state == TrialState.COMPLETE:
        return Outcome(TrialState.COMPLETE, tuple(duplicate.values), duplicate_of=duplicate.number)
    return Outcome(duplicate.state, reason=f"same configuration as trial {duplicate.number}: "
                                           f"{records.end_reason(duplicate)}", duplicate_of=duplicate.number)
