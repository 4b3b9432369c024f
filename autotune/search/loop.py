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
from typing import Any, Literal

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import RunFailed
from autotune.config.knobs import KNOBS, Config
from autotune.host.machine import (
    Machine,
    host_name,
)
from autotune.measure import requests
from autotune.measure.replicates import Measurement, PlanRunner
from autotune.measure.runner import run_plan
from autotune.search import budget, confirm, fleet, opening, proposals, trial_outcome
from autotune.search.opening import Search, SearchRequest
from autotune.search.trial_outcome import Outcome, patiently
from autotune.study import accounting, quality_records, records, storage, undecided
from autotune.study.storage import StudyLocked


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
    before = patiently(search, lambda: records.finished(search.study))

    def account() -> None:  # only a session that added trials counts; workers of a fleet end together
        with storage.exclusive(search.study):
            if records.finished(search.study) > before:
                accounting.account(search.study, time.monotonic() - start)

    try:
        stopped = _trials(search, machine, on_event, runner, start, clock)
    except StudyLocked:
        raise  # nothing can be written now
    except BaseException:
        with contextlib.suppress(StudyLocked):
            patiently(search, account)
        raise
    patiently(search, account)
    return stopped


def _trials(search: Search, machine: Machine, on_event: Callable[[TrialEvent], None], runner: PlanRunner,
            start: float, clock: Callable[[], float]) -> str:
    study = search.study
    began, prior = clock(), patiently(search, lambda: accounting.wall_per_trial(study))
    spent: list[budget.Spent] = []
    while (finished := patiently(search, lambda: records.finished(study))) < search.request.trials:
        limit = _time_budget(search.request)
        ended = None
        if limit:
            chosen = patiently(search, lambda: _candidates(search))
            ended = limit.check(clock() - began, spent, finished, prior, chosen)
        if ended is not None:
            patiently(search, functools.partial(records.record_end, study, ended))
            return budget.message(ended, records.finished(study))
        _quiet_baseline(search, machine, runner, on_event, start)
        claimed = fleet.claim(search.worker())
        if claimed == "taken":
            break  # the other workers run the trials left
        if claimed is None:
            patiently(search, lambda: records.record_end(study, {"by": "space exhausted"}))
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
    patiently(search, lambda: records.record_end(study, {"by": "trials"}))
    return ""


def _exhausted(search: Search) -> str:
    """Why nothing is left to propose, with what was left out: compiles predicted to lose, and the
    other configurations of models that gave wrong answers."""
    trials = patiently(search, lambda: search.study.get_trials(deepcopy=False))
    skipped = records.not_compiled_configs(trials, search.settings_digest)
    more = f", and {skipped} more were not compiled, predicted to lose" if skipped else ""
    wrong = sorted(quality_records.wrong_models(trials, search.settings_digest, search.klass).values())
    if wrong:
        more += (f", and no other configuration of the model{'s' if len(wrong) > 1 else ''} that gave wrong answers "
                 f"in trial{'s' if len(wrong) > 1 else ''} {', '.join(map(str, wrong))}")
    remedies = [name for name in search.space.names() if KNOBS[name].remedy]
    if remedies and not quality_records.short_on_quality(trials, search.settings_digest, search.klass):
        more += (f", and none of {', '.join(remedies)}'s other values: no model fell short on quality "
                 f"without them")
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


def _run_trial(search: Search, machine: Machine, claimed: fleet.Claimed, start: float,
               on_event: Callable[[TrialEvent], None], runner: PlanRunner) -> Outcome:
    study, trial, proposal, config, batch = search.study, claimed.trial, claimed.proposal, claimed.config, claimed.batch
    is_baseline = proposal == "baseline"
    event = _event_fields(search, claimed)
    finished = patiently(search, lambda: records.finished(study))
    on_event(TrialEvent("start", finished=finished, elapsed_s=time.monotonic() - start, **event))
    reference = None if is_baseline else trial_outcome.host_baseline(search, machine, runner)
    outcome = trial_outcome.measure(search, machine, trial, config, batch, runner,
                       sampled=isinstance(proposal, proposals.Proposal) and not proposal.recipe
                       and proposal.retry_of is None)
    trial_outcome.store(search, trial, outcome, reference)
    if is_baseline and outcome.state != TrialState.COMPLETE:
        raise RunFailed(f"the baseline (PyTorch defaults) failed: {outcome.reason}; autotune needs it to "
                        f"tune; try `autotune bench --model {search.request.model}` to see why")
    finished, best = patiently(search, lambda: (records.finished(study), records.best_trials(study)))
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
    reference = patiently(search, lambda: fleet.host_reference(study, host))
    if not patiently(search, lambda: undecided.baseline_due(study.get_trials(deepcopy=False), reference)):
        return
    plan = requests.make_plan(opening.bench_request(search.request, Config()), machine)
    measured = trial_outcome.measured_here(search, machine, plan, runner)
    if not measured.ok:
        return  # the baseline that measured stays; a failure now is no evidence against it
    updated = patiently(search, lambda: fleet.record_remeasure(study, host, measured))
    finished = patiently(search, lambda: records.finished(study))
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
    now = patiently(search, lambda: study._storage.get_trial(claimed.trial._trial_id))
    if now.state != TrialState.FAIL or records.fail_cause(now) != records.CUT_SHORT:
        return False
    reason = (f"failed by another autotune while this one measured it (no heartbeat from here reached the "
              f"database for over {storage.GRACE_PERIOD_S}s); its retry measures it again")
    finished, best = patiently(search, lambda: (records.finished(study), records.best_trials(study)))
    on_event(TrialEvent("done", finished=finished, elapsed_s=time.monotonic() - start,
                        outcome=Outcome(TrialState.FAIL, reason=reason), best=best[0] if best else None,
                        **_event_fields(search, claimed)))
    return True


