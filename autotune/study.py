"""Optuna glue: where studies live, the baseline, ask/tell, and what each trial records.

One search runs per study at a time; trials run one after another (timings need the machine to
themselves, and several processes writing one SQLite study can run an enqueued trial twice).
"""

from __future__ import annotations

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
from optuna.trial import FrozenTrial, TrialState

from autotune import __version__, bench, models, space
from autotune.errors import AutotuneError, RunFailed
from autotune.knobs import Config
from autotune.launch import LaunchPlan
from autotune.machine import Machine, cpuinfo
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
    timeout_s: float = 900.0
    duration_s: float = 5.0
    warmup: int = 3
    cache_dir: Path = Path("studies/cache")
    studies_dir: Path = Path("studies")
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
    result: RunResult | None = None
    reason: str = ""
    values: tuple[float, ...] = ()
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
    name = request.study or f"{model.name}-bs{request.batch_size}-{request.objective}"
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
    if request.batch_size < 1:
        raise StudyError(f"--batch-size {request.batch_size} is not allowed; use 1 or more")
    model = models.resolve(request.model)
    available = {name: path is not None for name, path in machine.libs.paths.items()}
    adapted = space.adapt(space.load(request.space), len(machine.topology.usable_cores), available)
    return model, adapted


def host_fingerprint(machine: Machine) -> dict[str, Any]:
    import torch

    return {"hostname": socket.gethostname(), "cpu_model": cpuinfo()[0],
            "physical_cores": len(machine.topology.all_cores),
            "usable_physical_cores": len(machine.topology.usable_cores),
            "torch": torch.__version__, "autotune": __version__}


def open_search(request: SearchRequest, machine: Machine) -> Search:
    model, adapted = validate(request, machine)
    name = study_name(request, model)
    url = storage_url(name, request.storage, request.studies_dir)
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    with _quiet_optuna():
        study = optuna.create_study(study_name=name, storage=url, load_if_exists=True,
                                    directions=OBJECTIVES[request.objective], sampler=_sampler())
    _claim(study, request, model, adapted, machine)
    return Search(request, study, adapted, model, name, url, adapted.notes)


def _sampler() -> optuna.samplers.BaseSampler:
    with _quiet_optuna():
        # group=True keeps conditional knobs (kmp_* only with Intel OpenMP) in their own groups.
        return optuna.samplers.TPESampler(multivariate=True, group=True, n_startup_trials=8)


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
    wanted = {"model": model.name, "batch_size": request.batch_size, "objective": request.objective}
    if not attrs:
        for key, value in {**wanted, "host": host_fingerprint(machine), "space": adapted.to_json(),
                           "created_by": request.command_line,
                           "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}.items():
            study.set_user_attr(key, value)
        return
    for key, value in wanted.items():
        if attrs.get(key) != value:
            raise StudyError(f"study {study.study_name!r} was made for {key}={attrs.get(key)}, not "
                             f"{value}; use another --study name or the same {key}")


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


def values_of(objective: str, result: RunResult) -> tuple[float, ...]:
    if objective == "latency":
        return (result.latency_p50_ms,)
    if objective == "throughput":
        return (result.throughput_ips,)
    return (result.latency_p50_ms, result.throughput_ips)


def best_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The best trial (single objective) or the Pareto front (two objectives), best first."""
    if len(study.directions) > 1:
        return sorted(study.best_trials, key=lambda t: t.values[0])
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    reverse = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return sorted(completed, key=lambda t: t.values[0], reverse=reverse)


def run_search(search: Search, machine: Machine, on_event: Callable[[TrialEvent], None],
               runner: Callable[[LaunchPlan, float], RunResult] = run_plan) -> None:
    """Run trials until the study holds `--trials` finished ones; the first is the baseline."""
    request, study = search.request, search.study
    start = time.monotonic()
    while finished(study) < request.trials:
        is_baseline = baseline(study) is None
        trial = study.ask()
        try:
            _run_trial(search, machine, trial, is_baseline, start, on_event, runner)
        except KeyboardInterrupt:
            _interrupted(study, trial)
            raise


def _interrupted(study: optuna.Study, trial: optuna.Trial) -> None:
    """Ctrl-C mid-trial: the trial is recorded as failed with that reason, never left RUNNING."""
    if study._storage.get_trial(trial._trial_id).state.is_finished():
        return
    _record_failure(trial, "interrupted by the user (Ctrl-C)", "")
    study.tell(trial, state=TrialState.FAIL)


def _run_trial(search: Search, machine: Machine, trial: optuna.Trial, is_baseline: bool, start: float,
               on_event: Callable[[TrialEvent], None],
               runner: Callable[[LaunchPlan, float], RunResult]) -> None:
    request, study = search.request, search.study
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())
    config = Config() if is_baseline else search.space.sample(trial)
    trial.set_user_attr("baseline", is_baseline)
    trial.set_user_attr("config", config.describe())
    event: dict[str, Any] = dict(number=trial.number, config=config, total=request.trials)
    on_event(TrialEvent("start", finished=finished(study), elapsed_s=time.monotonic() - start, **event))
    values, reason, result = _measure(search, machine, trial, config, runner)
    if values:
        study.tell(trial, list(values))
    else:
        study.tell(trial, state=TrialState.FAIL)
    if is_baseline and not values:
        raise RunFailed(f"the baseline (PyTorch defaults) failed: {reason}; autotune needs it to "
                        f"tune; try `autotune bench --model {request.model}` to see why")
    on_event(TrialEvent("done", finished=finished(study), elapsed_s=time.monotonic() - start,
                        result=result, reason=reason, values=values, best=_best(study), **event))


def _best(study: optuna.Study) -> FrozenTrial | None:
    best = best_trials(study)
    return best[0] if best else None


def _measure(search: Search, machine: Machine, trial: optuna.Trial, config: Config,
             runner: Callable[[LaunchPlan, float], RunResult]) -> tuple[tuple[float, ...], str, RunResult | None]:
    """Run one trial's configuration and record it; a failure is a reason, never an exception."""
    request = search.request
    duplicate = _same_config(search.study, trial, config)
    if duplicate is not None:
        for key, value in duplicate.user_attrs.items():
            if key not in ("host", "pid", "baseline"):
                trial.set_user_attr(key, value)
        trial.set_user_attr("duplicate_of", duplicate.number)
        return tuple(duplicate.values), "", None
    bench_request = bench.BenchRequest(
        model=search.model.name, config=config, batch_size=request.batch_size,
        warmup=request.warmup, duration_s=request.duration_s, cache_dir=request.cache_dir)
    try:
        plan = bench.make_plan(bench_request, machine)
    except AutotuneError as exc:
        _record_failure(trial, str(exc), "")
        return (), str(exc), None
    trial.set_user_attr("plan", plan.to_json())
    for inst in plan.instances:  # readable in optuna-dashboard, which truncates long JSON values
        trial.set_user_attr(f"instance_{inst.index}_env", " ".join(f"{k}={v}" for k, v in inst.env.items()))
        trial.set_user_attr(f"instance_{inst.index}_command", shlex.join(inst.command))
    result = runner(plan, request.timeout_s)
    if not result.ok:
        tail = next((i.stderr_tail for i in result.instances if not i.ok and i.stderr_tail), "")
        _record_failure(trial, result.reason, tail)
        trial.set_user_attr("instances", result.summary()["instances"])
        return (), result.reason, result
    _record_metrics(search.study, trial, result)
    return values_of(request.objective, result), "", result


def _same_config(study: optuna.Study, trial: optuna.Trial, config: Config) -> FrozenTrial | None:
    """An earlier completed trial that ran exactly this configuration (its measurement is reused)."""
    if not config.values:
        return None
    return next((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if t.user_attrs.get("config") == config.describe() and t.number != trial.number
                 and not t.user_attrs.get("baseline")), None)


def _record_failure(trial: optuna.Trial, reason: str, stderr_tail: str) -> None:
    trial.set_user_attr("status", "failed")
    trial.set_user_attr("fail_reason", reason)
    if stderr_tail:
        trial.set_user_attr("stderr_tail", stderr_tail[-2000:])


def _record_metrics(study: optuna.Study, trial: optuna.Trial, result: RunResult) -> None:
    summary = result.summary()
    trial.set_user_attr("status", "ok")
    for key in ("latency_p50_ms", "latency_p90_ms", "throughput_ips", "peak_rss_mb"):
        trial.set_user_attr(key, round(float(summary[key]), 4))
    base = baseline(study)
    if base is not None:
        trial.set_user_attr("speedup_latency",
                            round(base.user_attrs["latency_p50_ms"] / result.latency_p50_ms, 4))
        trial.set_user_attr("speedup_throughput",
                            round(result.throughput_ips / base.user_attrs["throughput_ips"], 4))
    else:
        trial.set_user_attr("speedup_latency", 1.0)
        trial.set_user_attr("speedup_throughput", 1.0)
    trial.set_user_attr("instances", summary["instances"])


def find_study(studies_dir: Path, name: str | None, storage: str | None) -> optuna.Study:
    """Load an existing study without creating anything: by name, or the newest under studies/."""
    if storage:
        if name is None:
            names = optuna.get_all_study_names(storage)
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
