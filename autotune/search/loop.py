"""The search: open a study for a request, then ask Optuna for configurations, measure each once,
and tell it the result; the first trial is the baseline (PyTorch's defaults).

On one machine trials run one after another (timings need the machine to themselves); on a
database server several machines are workers of one study, each claiming its next trial (fleet.py).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import AutotuneError, RunFailed
from autotune.child.settings import CACHE_DIR, MeasureSettings
from autotune.config import models, recipes, space
from autotune.config.knobs import Config
from autotune.host.machine import (
    Machine,
    class_id,
    fingerprint,
    host_class,
    host_name,
    machine_has_bf16,
    machine_has_int8,
    torch_versions,
)
from autotune.measure import requests
from autotune.measure.objectives import OBJECTIVES, Objective, parse_objective, values_of
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import Measurement, PlanRunner, ReplicatePolicy, measure_replicates
from autotune.measure.results import RunResult
from autotune.measure.runner import run_plan
from autotune.search import budget, confirm, fleet, proposals, pruning
from autotune.study import records, storage
from autotune.study.storage import StudyError, StudyLocked

MIN, MAX = optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MAXIMIZE
DIRECTIONS: dict[Objective, list[optuna.study.StudyDirection]] = {
    "latency": [MIN], "throughput": [MAX], "both": [MIN, MAX]}
STARTUP_TRIALS = 8  # random trials before TPE models the space
T = TypeVar("T")
# The option behind each recorded measurement setting (the others are the machine and torch).
SETTING_FLAGS = {"input_shape": "--input-shape", "warmup": "--warmup", "warmup_s": "--warmup-time",
                 "duration_s": "--duration", "min_iterations": "--min-iterations", "replicates": "--replicates",
                 "warm_replicates": "--warm-replicates/--fresh-replicates",
                 "timeout_s": "--timeout", "tolerance": "--tolerance", "calibration_batches": "--calibration-batches"}


@dataclass(frozen=True)
class SearchRequest:
    """`autotune search` flags, converted once."""

    model: str
    trials: int
    space: Path
    objective: Objective = "latency"
    batch_size: int = 1
    study: str | None = None
    storage: str | None = None
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    replicates: ReplicatePolicy = field(default_factory=ReplicatePolicy)
    cache_dir: Path = Path(CACHE_DIR)
    studies_dir: Path = Path("studies")
    seed: int | None = None
    input_shape: str | None = None
    example_inputs: str | None = None
    tolerance: float | None = None  # None: per precision
    calibration_batches: int | None = None  # precision=int8; None: quantize.CALIBRATION_BATCHES (not recorded)
    max_latency_ms: float | None = None
    batch_sizes: tuple[int, ...] = ()  # searched (objective throughput) when more than one
    command_line: str = ""
    pins: Config = field(default_factory=Config)  # knobs fixed in every trial but the baseline (`--set`)
    time_budget_s: float | None = None  # `--time-budget`: no new trial once it cannot fit
    confirm_rounds: int = 0  # of the confirmation that follows, for the budget; 0 without one
    confirm_top: int = 0  # candidates that confirmation takes at most
    allow_mixed: bool = False  # `--allow-mixed`: hosts of another class than the study's may join it


@dataclass(frozen=True)
class Outcome:
    """How a trial ended: values when complete, a reason when failed or pruned."""

    state: TrialState
    values: tuple[float, ...] = ()
    reason: str = ""
    measurement: Measurement | None = None
    duplicate_of: int | None = None


@dataclass(frozen=True)
class TrialEvent:
    """Progress for the display: a trial started or finished."""

    kind: Literal["start", "done"]
    number: int
    config: Config
    finished: int
    total: int
    elapsed_s: float
    outcome: Outcome | None = None
    best: FrozenTrial | None = None
    recipe: str = ""
    finished_before: int = 0  # finished when this session started: the ETA counts only this session's


@dataclass
class Search:
    """An opened study with everything a search needs, validated before anything is written."""

    request: SearchRequest
    study: optuna.Study
    space: space.SearchSpace
    model: models.ModelSpec
    name: str
    storage: str
    notes: tuple[str, ...] = field(default=())
    finished_before: int = 0
    settings_digest: str = ""
    proposer: proposals.Proposer | None = None
    klass: str = ""  # this host's class id (machine.class_id)

    def worker(self) -> fleet.Worker:
        """What claiming this search's next trial needs (fleet.claim)."""
        assert self.proposer is not None
        sizes = self.request.batch_sizes if len(self.request.batch_sizes) > 1 else (self.request.batch_size,)
        return fleet.Worker(self.study, self.storage, self.request.trials, self.space, self.proposer, sizes,
                            self.settings_digest, self.klass)

    def should_confirm(self, top: int) -> bool:
        """Confirm when asked and something new ran, or when the study holds no verdict yet."""
        new = self.finished_before < self.request.trials
        return top > 0 and (new or "confirmation" not in self.study.user_attrs)


def study_name(request: SearchRequest, model: models.ModelSpec) -> str:
    batch = "-".join(map(str, request.batch_sizes)) if len(request.batch_sizes) > 1 else str(request.batch_size)
    limit = f"-p90max{request.max_latency_ms:g}ms" if request.max_latency_ms else ""
    stem = storage.safe_name(Path(model.name).stem if model.kind in ("torchscript", "exported") else model.name)
    return storage.check_name(request.study if request.study is not None else
                              f"{stem}-bs{batch}-{request.objective}{limit}")


def validate(request: SearchRequest, machine: Machine) -> tuple[models.ModelSpec, space.SearchSpace]:
    """Everything that can be wrong with the request, checked before the study is touched."""
    parse_objective(request.objective, OBJECTIVES, StudyError)
    if request.trials < 1:
        raise StudyError(f"--trials {request.trials} is not allowed; use 1 or more")
    if request.batch_size < 1 or any(b < 1 for b in request.batch_sizes):
        raise StudyError("--batch-size must be 1 or more (a list like 1,2,4,8 is searched with --objective "
                         "throughput)")
    if len(request.batch_sizes) > 1 and request.objective != "throughput":
        raise StudyError(f"a list of batch sizes is searched only with --objective throughput; with "
                         f"{request.objective} give one --batch-size")
    if request.max_latency_ms is not None and (request.objective != "throughput" or request.max_latency_ms <= 0):
        raise StudyError("--max-latency-ms needs --objective throughput and a positive limit in ms")
    model = models.resolve(request.model, input_shape=request.input_shape, example_inputs=request.example_inputs)
    requests.check_batch_fits(request.batch_sizes or (request.batch_size,), model.item_shape)
    available = {name: path is not None for name, path in machine.libs.paths.items()}
    available["bf16"] = machine_has_bf16()
    available["int8"] = machine_has_int8()
    adapted = space.adapt(space.load(request.space), len(machine.topology.usable_cores), available)
    return model, space.pin(adapted, request.pins, available)


def open_search(request: SearchRequest, machine: Machine,
                check: Callable[[requests.BenchRequest, Machine], None] | None = None) -> Search:
    """Validate everything (and, with `check`, run a user model once) before the study is touched;
    then create or resume it, failing the trials a killed autotune left running."""
    model, adapted = validate(request, machine)
    if check is not None:
        check(_bench_request(request, Config()), machine)
    name = study_name(request, model)
    url = storage.storage_url(name, request.storage, request.studies_dir)
    liar = storage.is_server(url)  # workers on a server: TPE counts the running trials of the others
    study = storage.create(name, url, DIRECTIONS[request.objective], sampler(request.seed, liar),
                           optuna.pruners.NopPruner())  # pruning.PruneCheck decides, replicate by replicate
    settings, cls = _settings(request, model, machine), host_class(machine)
    found = recipes.recipes(machine.topology, request.objective, machine_has_bf16(), machine_has_int8())
    known, left_out = recipes.fitting(found, adapted, request.pins)
    # In one worker at a time, as claiming a trial (fleet.claim): two hosts of different classes
    # would both claim a new study, and a dead worker's trial failed here would be retried under a claimer.
    with storage.exclusive(study):
        _check_pins(study, request.pins)
        records.check_wanted(study, _wanted(request, model))  # what was asked first, then where it runs
        mixed = fleet.claim_class(study, cls, request.allow_mixed)
        records.claim(study, _wanted(request, model), adapted.to_json(), _description(request, machine, settings),
                      other_class=bool(mixed))
        notes = [*mixed, *adapted.notes, *([left_out] if left_out else []),
                 *records.claim_settings(study, settings, SETTING_FLAGS, cls.keys() if request.allow_mixed else ()),
                 *_restore_kept(study, url, request),
                 *(f"trial {n} was left running by a killed autotune; marked failed"
                   for n in records.abandon_stale_trials(study, study.get_trials(deepcopy=False)))]
    done = records.finished(study)
    if done >= request.trials:
        notes.append(f"study {name} already holds {done} finished trials; raise --trials to search further")
    proposer = proposals.Proposer(adapted, request.batch_sizes or (request.batch_size,),
                                  functools.partial(sampler, constant_liar=liar), known, request.seed)
    return Search(request, study, adapted, model, name, url, tuple(notes), done, records.settings_digest(settings),
                  proposer, class_id(cls))


def _check_pins(study: optuna.Study, pins: Config) -> None:
    """A study is resumed only with the pins it was searched with (none before pins existed)."""
    wanted = pins.describe() if pins.values else ""
    recorded = study.user_attrs.get("pins", "" if study.user_attrs else wanted)
    if recorded != wanted:
        def said(text: str) -> str:
            return f"--set {text.replace(' ', ' --set ')}" if text else "no --set pins"

        raise StudyError(f"study {study.study_name!r} was searched with {said(recorded)}, not {said(wanted)}; "
                         f"give the same pins to resume it, or another --study name")


def _restore_kept(study: optuna.Study, url: str, request: SearchRequest) -> list[str]:
    """Measurements a locked database kept out of the study last time are recorded now."""
    notes = []
    for path in storage.kept_aside(url, request.studies_dir, study.study_name):
        number = records.restore_kept(study, path, request.max_latency_ms)
        if number is not None:
            notes.append(f"trial {number}'s measurement, kept in {path} while the study was locked, is recorded now")
    return notes


def _wanted(request: SearchRequest, model: models.ModelSpec) -> dict[str, Any]:
    wanted = {"model": model.name, "batch_size": request.batch_size, "objective": request.objective,
              "batch_sizes": list(request.batch_sizes), "max_latency_ms": request.max_latency_ms,
              "pins": request.pins.describe() if request.pins.values else ""}
    return wanted | ({"example_inputs": model.example_inputs} if model.example_inputs else {})


def _description(request: SearchRequest, machine: Machine, settings: dict[str, Any]) -> dict[str, Any]:
    return {"host": records.host_fingerprint(machine), "created_by": request.command_line,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "settings": settings,
            "settings_digest": records.settings_digest(settings)}


def _settings(request: SearchRequest, model: models.ModelSpec, machine: Machine) -> dict[str, Any]:
    """Everything besides the configuration that a measurement depends on, as plain JSON values."""
    versions = torch_versions()
    return {"input_shape": "x".join(map(str, model.item_shape)), **asdict(request.measure),
            "replicates": request.replicates.replicates, "timeout_s": request.replicates.timeout_s,
            "warm_replicates": request.replicates.in_process,
            "tolerance": request.tolerance, "torch": versions["torch"], "onednn": versions["onednn"],
            **({"calibration_batches": request.calibration_batches} if request.calibration_batches else {}),
            **fingerprint(machine)}


def sampler(seed: int | None, constant_liar: bool = False) -> optuna.samplers.BaseSampler:
    """The search's sampler; its settings were chosen with benchmarks/sampler_replay.py (README).
    `constant_liar` for workers sharing a study: other workers' running trials count as bad, so
    that parallel workers spread out instead of proposing the same region."""
    with storage.quiet_optuna():
        # group=True keeps conditional knobs (kmp_* only with Intel OpenMP) in their own groups.
        return optuna.samplers.TPESampler(multivariate=True, group=True, n_startup_trials=STARTUP_TRIALS,
                                          seed=seed, constant_liar=constant_liar)


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
        claimed = fleet.claim(search.worker())
        if claimed == "taken":
            break  # the other workers run the trials left
        if claimed is None:
            _patiently(search, lambda: records.record_end(study, {"by": "space exhausted"}))
            skipped = _patiently(search, lambda: records.not_compiled(study.get_trials(deepcopy=False)))
            more = f", and {skipped} more were not compiled, predicted to lose" if skipped else ""
            return (f"every configuration of the space has run ({records.distinct_configs(study)} distinct, "
                    f"baseline included{more}); widen the space (--space) to search further")
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
    return [trial.number for trial in confirm.candidates(search.study, request.confirm_top)[1]]


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
                       sampled=isinstance(proposal, proposals.Proposal) and not proposal.recipe)
    _store(search, trial, outcome, reference)
    if is_baseline and outcome.state != TrialState.COMPLETE:
        raise RunFailed(f"the baseline (PyTorch defaults) failed: {outcome.reason}; autotune needs it to "
                        f"tune; try `autotune bench --model {search.request.model}` to see why")
    finished, best = _patiently(search, lambda: (records.finished(study), records.best_trials(study)))
    on_event(TrialEvent("done", finished=finished, elapsed_s=time.monotonic() - start,
                        outcome=outcome, best=best[0] if best else None, **event))
    return outcome


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
    plan = requests.make_plan(_bench_request(search.request, Config()), machine)
    measured = measure_replicates(plan, search.request.replicates, runner)
    if not measured.ok:
        raise RunFailed(f"this host's baseline (PyTorch defaults) failed: {measured.reason}; autotune needs it to "
                        f"tune; try `autotune bench --model {search.request.model}` to see why")
    return _patiently(search, lambda: fleet.record_host_baseline(search.study, host, measured))


def _constrain(trial: optuna.Trial, limit_ms: float) -> None:
    p90 = float(trial.user_attrs["latency_p90_ms"]) if "latency_p90_ms" in trial.user_attrs else math.inf
    records.record_constraint(trial, p90 - limit_ms)


def _measure(search: Search, machine: Machine, trial: optuna.Trial, config: Config, batch: int,
             runner: PlanRunner, *, sampled: bool) -> Outcome:
    """Measure one trial's configuration; a failure is a reason, never an exception. What ran is
    recorded by `_store`, so that a locked database cannot lose it. A `sampled` one (the search's
    own proposal: not the baseline, a recipe, or a trial enqueued through Optuna) whose new
    compile is predicted to lose is pruned without running (`pruning.skip_compile`)."""
    request = search.request
    duplicate = _patiently(search, lambda: records.same_config(search.study, trial.number, config.describe(), batch,
                                                               search.settings_digest)) if config.values else None
    if duplicate is not None:
        return _reuse(search, trial, duplicate)
    skipped = _patiently(search, lambda: pruning.skip_compile(search.study, search.space, request.objective,
                                                              config)) if sampled else ""
    if skipped:
        _patiently(search, lambda: records.record_skipped(trial, skipped))
        return Outcome(TrialState.PRUNED, reason=skipped)
    try:
        plan = requests.make_plan(_bench_request(request, config, batch), machine)
    except AutotuneError as exc:
        reason = str(exc)
        _patiently(search, lambda: records.record_failure(trial, reason, records.ERROR))
        return Outcome(TrialState.FAIL, reason=reason)
    _patiently(search, lambda: records.record_plan(trial, plan))
    pruner = pruning.PruneCheck(search.study, trial, request.objective)
    limit = _give_up(search, plan)
    measurement = measure_replicates(plan, request.replicates, runner, after_each=_pruning(search, pruner),
                                     give_up_above_ms=limit.above_ms if limit else ())
    if not measurement.ok:
        return Outcome(TrialState.FAIL, reason=measurement.reason, measurement=measurement)
    if measurement.stopped_early:
        last = measurement.runs[-1]
        reason = limit.reason(last) if limit is not None and last.gave_up else pruner.reason
        return Outcome(TrialState.PRUNED, reason=reason, measurement=measurement)
    return Outcome(TrialState.COMPLETE, values_of(request.objective, measurement), measurement=measurement)


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
            "cause": "" if measurement.ok else records.failure_cause(measurement),
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
    if outcome.state == TrialState.COMPLETE and search.request.max_latency_ms is not None:
        _constrain(trial, search.request.max_latency_ms)
    if outcome.state == TrialState.COMPLETE:
        search.study.tell(trial, list(outcome.values), skip_if_finished=True)
    else:
        search.study.tell(trial, state=outcome.state, skip_if_finished=True)


def _bench_request(request: SearchRequest, config: Config, batch: int | None = None) -> requests.BenchRequest:
    return requests.BenchRequest(model=request.model, config=config, batch_size=batch or request.batch_size,
                                 measure=request.measure, cache_dir=request.cache_dir,
                                 input_shape=request.input_shape, example_inputs=request.example_inputs,
                                 tolerance=request.tolerance, calibration_batches=request.calibration_batches)


def _reuse(search: Search, trial: optuna.Trial, duplicate: FrozenTrial) -> Outcome:
    """The same configuration ran before: its result (and intermediate values) are reused, be it
    a measurement, a pruning or a failure."""
    _patiently(search, lambda: records.copy_result(trial, duplicate))
    if duplicate.state == TrialState.COMPLETE:
        return Outcome(TrialState.COMPLETE, tuple(duplicate.values), duplicate_of=duplicate.number)
    return Outcome(duplicate.state, reason=f"same configuration as trial {duplicate.number}: "
                                           f"{records.end_reason(duplicate)}", duplicate_of=duplicate.number)
