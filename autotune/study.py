"""Optuna glue: where studies live, the baseline, ask/tell, and what each trial records.

One search runs per study at a time; trials run one after another (timings need the machine to
themselves, and several processes writing one SQLite study can run an enqueued trial twice).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial, TrialState

from autotune import __version__, bench, models, protocol, space
from autotune.errors import AutotuneError, RunFailed
from autotune.knobs import Config
from autotune.launch import LaunchPlan, MeasureSettings
from autotune.machine import Machine, cpuinfo, machine_has_bf16
from autotune.protocol import Measurement, Protocol, Runner
from autotune.pruning import MarginWilcoxonPruner, PruneCheck
from autotune.runner import RunResult, run_plan

MIN, MAX = optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MAXIMIZE
OBJECTIVES = {"latency": [MIN], "throughput": [MAX], "both": [MIN, MAX]}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


class StudyError(AutotuneError):
    """A study that does not exist, does not match the request, or cannot be used."""


@dataclass(frozen=True)
class SearchRequest:
    """`autotune search` flags, converted once."""

    model: str
    trials: int
    space: Path
    objective: str = "latency"
    batch_size: int = 1
    study: str | None = None
    storage: str | None = None
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    protocol: Protocol = field(default_factory=Protocol)
    cache_dir: Path = Path("studies/cache")
    studies_dir: Path = Path("studies")
    seed: int | None = None
    input_shape: str | None = None
    tolerance: float = -1.0
    max_latency_ms: float | None = None
    batch_sizes: tuple[int, ...] = ()  # searched (objective throughput) when more than one
    command_line: str = ""


@dataclass(frozen=True)
class TrialEvent:
    """Progress for the display: a trial started or finished."""

    kind: str  # "start" | "done"
    number: int
    config: Config
    finished: int
    total: int
    elapsed_s: float
    outcome: Any = None  # Outcome, once done
    best: FrozenTrial | None = None


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


def study_name(request: SearchRequest, model: models.ModelSpec) -> str:
    batch = "-".join(map(str, request.batch_sizes)) if len(request.batch_sizes) > 1 else str(request.batch_size)
    limit = f"-p90max{request.max_latency_ms:g}ms" if request.max_latency_ms else ""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(model.name).stem if model.kind in ("torchscript", "exported")
                  else model.name)
    name = request.study or f"{stem}-bs{batch}-{request.objective}{limit}"
    if not NAME.match(name):
        raise StudyError(f"--study {name!r} is not a usable name; use letters, digits, '.', '_', '-'")
    return name


def storage_url(name: str, storage: str | None, studies_dir: Path) -> str:
    if storage:
        if "://" not in storage:
            raise StudyError(f"--storage {storage!r} is not a storage URL; use e.g. "
                             f"sqlite:///studies/{name}.db or postgresql://user@host/db")
        return storage
    return f"sqlite:///{(studies_dir / f'{name}.db').resolve()}"


def validate(request: SearchRequest, machine: Machine) -> tuple[models.ModelSpec, space.SearchSpace]:
    """Everything that can be wrong with the request, checked before the study is touched."""
    if request.objective not in OBJECTIVES:
        raise StudyError(f"--objective {request.objective!r} is not allowed; use latency, throughput or both")
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
    model = models.resolve(request.model, input_shape=request.input_shape)
    available = {name: path is not None for name, path in machine.libs.paths.items()}
    available["bf16"] = machine_has_bf16()
    adapted = space.adapt(space.load(request.space), len(machine.topology.usable_cores), available)
    return model, adapted


def host_fingerprint(machine: Machine) -> dict[str, Any]:
    import torch

    return {"hostname": socket.gethostname(), "cpu_model": cpuinfo()[0],
            "physical_cores": len(machine.topology.all_cores),
            "usable_physical_cores": len(machine.topology.usable_cores),
            "torch": torch.__version__, "autotune": __version__}


def open_search(request: SearchRequest, machine: Machine,
                check: Callable[[bench.BenchRequest, Machine], None] | None = None) -> Search:
    """Validate everything (and, with `check`, run a user model once) before the study is touched."""
    model, adapted = validate(request, machine)
    if check is not None:
        check(_bench_request(request, Config()), machine)
    name = study_name(request, model)
    url = storage_url(name, request.storage, request.studies_dir)
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    study = _create(name, url, request)
    _claim(study, request, model, adapted, machine)
    return Search(request, study, adapted, model, name, url, adapted.notes)


def _create(name: str, url: str, request: SearchRequest) -> optuna.Study:
    """Create or load; a brand-new SQLite file opened by two processes at once (a dashboard, a
    second command) can race on schema creation, so that one error is retried."""
    for attempt in range(3):
        try:
            with _quiet_optuna():
                return optuna.create_study(study_name=name, storage=url, load_if_exists=True,
                                           directions=OBJECTIVES[request.objective],
                                           sampler=_sampler(request.seed), pruner=_pruner(request.objective))
        except sqlalchemy.exc.IntegrityError:
            if attempt == 2:
                raise _storage_error(url, "the database is being created by another process") from None
            time.sleep(0.5)
        except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
            raise _storage_error(url, str(exc).splitlines()[0]) from None
    raise AssertionError("unreachable")


def _storage_error(url: str, reason: str) -> StudyError:
    return StudyError(f"cannot open the study storage {url}: {reason}; check --storage (and the driver it needs)")


def _sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    with _quiet_optuna():
        # group=True keeps conditional knobs (kmp_* only with Intel OpenMP) in their own groups.
        return optuna.samplers.TPESampler(multivariate=True, group=True, n_startup_trials=8, seed=seed)


def _pruner(objective: str) -> optuna.pruners.BasePruner:
    if objective == "both":
        return optuna.pruners.NopPruner()
    return MarginWilcoxonPruner()


@contextmanager
def _quiet_optuna() -> Iterator[None]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _claim(study: optuna.Study, request: SearchRequest, model: models.ModelSpec,
           adapted: space.SearchSpace, machine: Machine) -> None:
    """A new study gets its description; an existing one must describe the same search."""
    attrs = study.user_attrs
    wanted = {"model": model.name, "batch_size": request.batch_size, "objective": request.objective,
              "batch_sizes": list(request.batch_sizes), "max_latency_ms": request.max_latency_ms}
    if not attrs:
        for key, value in {**wanted, "host": host_fingerprint(machine), "space": adapted.to_json(),
                           "created_by": request.command_line,
                           "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}.items():
            study.set_user_attr(key, value)
        return
    for key, value in wanted.items():
        if attrs.get(key, value) != value:
            raise StudyError(f"study {study.study_name!r} was made for {key}={attrs.get(key)}, not "
                             f"{value}; use another --study name or the same {key}")
    if attrs.get("space", adapted.to_json())["knobs"] != adapted.to_json()["knobs"]:
        raise StudyError(f"study {study.study_name!r} was made with another search space (or this machine's "
                         f"libraries or cores changed since); use another --study name or the same --space")


def abandon_stale_trials(study: optuna.Study) -> list[int]:
    """RUNNING trials whose autotune process on this host is gone become FAIL, never left dangling."""
    host = socket.gethostname()
    stale = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = trial.user_attrs.get("pid")
        if trial.user_attrs.get("host") != host or (isinstance(pid, int) and _alive(pid)):
            continue
        storage = study._storage
        storage.set_trial_user_attr(trial._trial_id, "status", "failed")
        storage.set_trial_user_attr(trial._trial_id, "fail_reason",
                                    f"left running by an autotune process (pid {pid}) that was killed")
        storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        stale.append(trial.number)
    return stale


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def baseline(study: optuna.Study) -> FrozenTrial | None:
    return next((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if t.user_attrs.get("baseline")), None)


def finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def values_of(objective: str, result: RunResult | Measurement) -> tuple[float, ...]:
    if objective == "latency":
        return (result.latency_p50_ms,)
    if objective == "throughput":
        return (result.throughput_ips,)
    return (result.latency_p50_ms, result.throughput_ips)


def best_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The best trial (single objective) or the Pareto front (two objectives), best first."""
    if len(study.directions) > 1:
        return sorted(study.best_trials, key=lambda t: t.values[0])
    completed = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if t.user_attrs.get("feasible", True)]
    reverse = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return sorted(completed, key=lambda t: t.values[0], reverse=reverse)


def run_search(search: Search, machine: Machine, on_event: Callable[[TrialEvent], None],
               runner: Runner = run_plan) -> None:
    """Run trials until the study holds `--trials` finished ones; the first is the baseline."""
    study = search.study
    start = time.monotonic()
    while finished(study) < search.request.trials:
        is_baseline = baseline(study) is None
        trial = study.ask()
        try:
            _run_trial(search, machine, trial, is_baseline, start, on_event, runner)
        except KeyboardInterrupt:
            _abandon(study, trial, "interrupted by the user (Ctrl-C)")
            raise
        except BaseException as exc:  # never leave a trial RUNNING, whatever went wrong
            _abandon(study, trial, f"autotune failed: {type(exc).__name__}: {exc}")
            raise


def _abandon(study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
    """A trial cut short is recorded as failed with the reason, never left RUNNING."""
    if study._storage.get_trial(trial._trial_id).state.is_finished():
        return
    _record_failure(trial, reason, "")
    study.tell(trial, state=TrialState.FAIL)


@dataclass(frozen=True)
class Outcome:
    """How a trial ended: values when complete, a reason when failed or pruned."""

    state: TrialState
    values: tuple[float, ...] = ()
    reason: str = ""
    measurement: Measurement | None = None
    duplicate_of: int | None = None


def _run_trial(search: Search, machine: Machine, trial: optuna.Trial, is_baseline: bool, start: float,
               on_event: Callable[[TrialEvent], None], runner: Runner) -> None:
    study = search.study
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())
    config = Config() if is_baseline else search.space.sample(trial)
    batch = _batch_size(search.request, trial, is_baseline)
    trial.set_user_attr("baseline", is_baseline)
    trial.set_user_attr("config", config.describe())
    trial.set_user_attr("batch_size", batch)
    event: dict[str, Any] = dict(number=trial.number, config=config, total=search.request.trials)
    on_event(TrialEvent("start", finished=finished(study), elapsed_s=time.monotonic() - start, **event))
    outcome = _measure(search, machine, trial, config, batch, runner)
    if outcome.state == TrialState.COMPLETE and search.request.max_latency_ms is not None:
        _constrain(trial, outcome, search.request.max_latency_ms)
    if outcome.state == TrialState.COMPLETE:
        study.tell(trial, list(outcome.values))
    else:
        study.tell(trial, state=outcome.state)
    if is_baseline and outcome.state != TrialState.COMPLETE:
        raise RunFailed(f"the baseline (PyTorch defaults) failed: {outcome.reason}; autotune needs it to "
                        f"tune; try `autotune bench --model {search.request.model}` to see why")
    on_event(TrialEvent("done", finished=finished(study), elapsed_s=time.monotonic() - start,
                        outcome=outcome, best=_best(study), **event))


def _batch_size(request: SearchRequest, trial: optuna.Trial, is_baseline: bool) -> int:
    if len(request.batch_sizes) <= 1:
        return request.batch_size
    if is_baseline:
        return request.batch_sizes[0]
    return int(trial.suggest_categorical("batch_size", list(request.batch_sizes)))


def _constrain(trial: optuna.Trial, outcome: Outcome, limit_ms: float) -> None:
    """p90 latency under the limit, as an Optuna constraint and mirrored in user attributes
    (optuna-dashboard 0.21 does not show Optuna 5 constraints)."""
    p90 = float(trial.user_attrs["latency_p90_ms"]) if "latency_p90_ms" in trial.user_attrs else math.inf
    over = p90 - limit_ms
    trial.set_constraint("latency_p90_over_limit_ms", over)  # duplicates too: no constraint reads as feasible
    trial.set_user_attr("constraint_latency_p90_over_limit_ms", round(over, 4))
    trial.set_user_attr("feasible", over <= 0)


def _best(study: optuna.Study) -> FrozenTrial | None:
    best = best_trials(study)
    return best[0] if best else None


def _measure(search: Search, machine: Machine, trial: optuna.Trial, config: Config, batch: int,
             runner: Runner) -> Outcome:
    """Measure one trial's configuration and record it; a failure is a reason, never an exception."""
    request = search.request
    duplicate = _same_config(search.study, trial, config, batch)
    if duplicate is not None:
        return _reuse(trial, duplicate)
    try:
        plan = bench.make_plan(_bench_request(request, config, batch), machine)
    except AutotuneError as exc:
        _record_failure(trial, str(exc), "")
        return Outcome(TrialState.FAIL, reason=str(exc))
    _record_plan(trial, plan)
    pruner = PruneCheck(search.study, trial, request.objective)
    measurement = protocol.measure(plan, request.protocol, runner, after_each=pruner)
    if not measurement.ok:
        failed = next(r for r in measurement.runs if not r.ok)
        tail = next((i.stderr_tail for i in failed.instances if not i.ok and i.stderr_tail), "")
        _record_failure(trial, measurement.reason, tail)
        trial.set_user_attr("instances", failed.summary()["instances"])
        return Outcome(TrialState.FAIL, reason=measurement.reason, measurement=measurement)
    _record_metrics(search.study, trial, measurement)
    if measurement.stopped_early:
        trial.set_user_attr("status", "pruned")
        trial.set_user_attr("prune_reason", pruner.reason)
        return Outcome(TrialState.PRUNED, reason=pruner.reason, measurement=measurement)
    return Outcome(TrialState.COMPLETE, values_of(request.objective, measurement), measurement=measurement)


def _bench_request(request: SearchRequest, config: Config, batch: int | None = None) -> bench.BenchRequest:
    return bench.BenchRequest(model=request.model, config=config, batch_size=batch or request.batch_size,
                              measure=request.measure, cache_dir=request.cache_dir,
                              input_shape=request.input_shape, tolerance=request.tolerance)


def _reuse(trial: optuna.Trial, duplicate: FrozenTrial) -> Outcome:
    """The same configuration ran before: its result (and intermediate values) are reused, be it
    a measurement, a pruning or a failure."""
    for key, value in duplicate.user_attrs.items():
        if key not in ("host", "pid", "baseline"):
            trial.set_user_attr(key, value)
    trial.set_user_attr("duplicate_of", duplicate.number)
    for step, value in duplicate.intermediate_values.items():
        trial.report(value, step)
    if duplicate.state == TrialState.COMPLETE:
        return Outcome(TrialState.COMPLETE, tuple(duplicate.values), duplicate_of=duplicate.number)
    reason = duplicate.user_attrs.get("prune_reason") or duplicate.user_attrs.get("fail_reason", "")
    return Outcome(duplicate.state, reason=f"same configuration as trial {duplicate.number}: {reason}",
                   duplicate_of=duplicate.number)


def _record_plan(trial: optuna.Trial, plan: LaunchPlan) -> None:
    trial.set_user_attr("plan", plan.to_json())
    for inst in plan.instances:  # readable in optuna-dashboard, which truncates long JSON values
        trial.set_user_attr(f"instance_{inst.index}_env", " ".join(f"{k}={v}" for k, v in inst.env.items()))
        trial.set_user_attr(f"instance_{inst.index}_command", shlex.join(inst.command))


def _same_config(study: optuna.Study, trial: optuna.Trial, config: Config, batch: int) -> FrozenTrial | None:
    """An earlier finished trial that ran exactly this configuration, unless it was cut short by
    the user or a killed autotune (those are worth running again)."""
    if not config.values:
        return None
    return next((t for t in study.get_trials(deepcopy=False, states=FINISHED)
                 if t.user_attrs.get("config") == config.describe() and t.number != trial.number
                 and t.user_attrs.get("batch_size", batch) == batch
                 and not t.user_attrs.get("baseline") and not _cut_short(t)), None)


def _cut_short(trial: FrozenTrial) -> bool:
    reason = str(trial.user_attrs.get("fail_reason", ""))
    return reason.startswith(("interrupted by the user", "left running by"))


def _record_failure(trial: optuna.Trial, reason: str, stderr_tail: str) -> None:
    trial.set_user_attr("status", "failed")
    trial.set_user_attr("fail_reason", reason)
    if stderr_tail:
        trial.set_user_attr("stderr_tail", stderr_tail[-2000:])


def _record_metrics(study: optuna.Study, trial: optuna.Trial, measurement: Measurement) -> None:
    summary = measurement.summary()
    trial.set_user_attr("status", "ok")
    for key, value in summary.items():
        trial.set_user_attr(key, value)
    trial.set_user_attr("samples_ms", " ".join(f"{x:.2f}" for x in measurement.samples()))
    base = baseline(study)
    speedups = (1.0, 1.0) if base is None else (
        base.user_attrs["latency_p50_ms"] / measurement.latency_p50_ms,
        measurement.throughput_ips / base.user_attrs["throughput_ips"])
    trial.set_user_attr("speedup_latency", round(speedups[0], 4))
    trial.set_user_attr("speedup_throughput", round(speedups[1], 4))
    trial.set_user_attr("instances", measurement.runs[-1].summary()["instances"])
    trial.set_user_attr("first_call_s", _first_call(measurement))


def _first_call(measurement: Measurement) -> dict[str, float]:
    """Set-up costs never mixed into latency: build, convert, trace, first forward (worst instance)."""
    costs: dict[str, float] = {}
    for run in measurement.runs:
        for inst in run.instances:
            for key, value in inst.metrics.get("setup", {}).items():
                if key.endswith("_s") and isinstance(value, (int, float)):
                    costs[key] = round(max(costs.get(key, 0.0), float(value)), 3)
    return costs


def find_study(studies_dir: Path, name: str | None, storage: str | None) -> optuna.Study:
    """Load an existing study without creating anything: by name, or the newest under studies/."""
    if storage:
        if name is None:
            try:
                names = optuna.get_all_study_names(storage)
            except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
                raise _storage_error(storage, str(exc).splitlines()[0]) from None
            if len(names) != 1:
                raise StudyError(f"--storage holds {len(names)} studies; pick one with --study")
            name = names[0]
        return _load(name, storage)
    if name is None:
        dbs = sorted(studies_dir.glob("*.db"), key=lambda p: p.stat().st_mtime)
        if not dbs:
            raise StudyError(f"no study in {studies_dir}/; run `autotune search --model M` first")
        name = dbs[-1].stem
    path = studies_dir / f"{name}.db"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in studies_dir.glob("*.db"))) or "none"
        raise StudyError(f"no study {name!r} in {studies_dir}/ (studies there: {known})")
    return _load(name, f"sqlite:///{path.resolve()}")


def _load(name: str, storage: str) -> optuna.Study:
    try:
        with _quiet_optuna():
            return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise StudyError(f"no study {name!r} in {storage}") from None
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        raise _storage_error(storage, str(exc).splitlines()[0]) from None
