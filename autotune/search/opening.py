"""Opening a search: `autotune search`'s request, converted once, becomes a study (new or resumed)
whose recorded settings match it, with the space fitted to this machine, before anything is measured.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune.child.settings import CACHE_DIR, STUDIES_DIR, MeasureSettings
from autotune.config import evaldata, models, recipes, space, space_fit
from autotune.config.knobs import Config
from autotune.host import capabilities
from autotune.host.capabilities import Probe
from autotune.host.machine import Machine, class_id, fingerprint, host_class, torch_versions
from autotune.measure import requests
from autotune.measure.objectives import OBJECTIVES, Limits, Objective, parse_objective
from autotune.measure.replicates import ReplicatePolicy
from autotune.model import hf
from autotune.model.buckets import Buckets
from autotune.search import fleet, proposals, warm
from autotune.study import claims, holders, kept, records, storage
from autotune.study.storage import StudyError

MIN, MAX = optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MAXIMIZE
DIRECTIONS: dict[Objective, list[optuna.study.StudyDirection]] = {
    "latency": [MIN], "throughput": [MAX], "both": [MIN, MAX]}


STARTUP_TRIALS = 8  # random trials before TPE models the space


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
    studies_dir: Path = Path(STUDIES_DIR)
    seed: int | None = None
    input_shape: str | None = None
    example_inputs: str | None = None
    seq_len: int | None = None  # a transformers model's tokens per item; None: hf.DEFAULT_SEQ_LEN
    task: str | None = None  # a transformers model's head; None: hf.DEFAULT_TASK
    new_tokens: int | None = None  # --task generate: tokens generated per request; None: hf.DEFAULT_NEW_TOKENS
    buckets: Buckets | None = None  # `--seq-lens`: a transformers model measured at each length
    tolerance: float | None = None  # None: per precision
    calibration_batches: int | None = None  # precision=int8; None: quantize.CALIBRATION_BATCHES (not recorded)
    max_latency_ms: float | None = None  # `--max-latency-ms`: on a request's p90 latency (objective throughput)
    max_tpot_ms: float | None = None  # `--max-tpot-ms`: on the p90 time per output token (--task generate)
    batch_sizes: tuple[int, ...] = ()  # searched (objective throughput) when more than one
    command_line: str = ""
    pins: Config = field(default_factory=Config)  # knobs fixed in every trial but the baseline (`--set`)
    time_budget_s: float | None = None  # `--time-budget`: no new trial once it cannot fit
    confirm_rounds: int = 0  # of the confirmation that follows, for the budget; 0 without one
    confirm_top: int = 0  # candidates that confirmation takes at most
    allow_mixed: bool = False  # `--allow-mixed`: hosts of another class than the study's may join it
    eval_data: str | None = None  # `--eval-data`: the user's data, each trial's quality judged on it
    max_quality_drop: float | None = None  # `--max-quality-drop`: accuracy points or percent of perplexity
    eval_metric: str | None = None  # `--eval MODULE:FUNCTION`: the user's own quality metric
    eval_direction: str | None = None  # `--eval-direction`: higher or lower is better
    warm_start: bool = True  # a new study starts with what won in other studies of this host class (warm.py)

    @property
    def limits(self) -> Limits:
        return Limits(self.max_latency_ms, self.max_tpot_ms, self.max_quality_drop)


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
    stem = storage.safe_name(_stem(model))
    return storage.check_name(request.study if request.study is not None else
                              f"{stem}-bs{batch}-{request.objective}{request.limits.suffix()}")


def _stem(model: models.ModelSpec) -> str:
    """A study name's model part: a file's or a folder's name, a transformers model's with its head."""
    if model.kind in ("torchscript", "exported"):
        return Path(model.name).stem
    if model.kind == "huggingface":
        lengths = f"-seq{'-'.join(map(str, model.buckets.lengths))}" if model.buckets else ""
        return f"{Path(model.name.removeprefix(hf.PREFIX)).name}-{model.task}{lengths}"
    return model.name


def validate(request: SearchRequest, machine: Machine,
             probe: Probe | None = None) -> tuple[models.ModelSpec, space.SearchSpace]:
    """Everything that can be wrong with the request, checked before the study is touched; with
    this CPU's kernel probe, the backends and precisions it refused are left out of the space."""
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
    if request.max_tpot_ms is not None and request.max_tpot_ms <= 0:
        raise StudyError(f"--max-tpot-ms {request.max_tpot_ms:g} is not allowed; give a positive limit in ms per "
                         f"output token")
    model = models.resolve(request.model, input_shape=request.input_shape, example_inputs=request.example_inputs,
                           seq_len=request.seq_len, task=request.task, buckets=request.buckets,
                           new_tokens=request.new_tokens, cache_dir=request.cache_dir)
    if request.max_tpot_ms is not None and not model.generates:
        raise StudyError("--max-tpot-ms bounds the time per output token of text generation; add --task generate "
                         "(a causal LM), or use --max-latency-ms")
    evaldata.check_drop(request.max_quality_drop, request.eval_data, request.eval_metric)
    evaldata.check_metric(request.eval_metric, request.eval_direction)
    if request.eval_data:
        evaldata.check(request.eval_data, model.generates)
    requests.check_cache_dir(request.cache_dir)
    requests.check_batch_fits(request.batch_sizes or (request.batch_size,), model.item_shape)
    available = {name: path is not None for name, path in machine.libs.paths.items()}
    available |= space_fit.runtimes_installed(model.generates)
    adapted = space_fit.adapt(space.load(request.space, request.pins), len(machine.topology.usable_cores), available)
    task = space_fit.task_refusals(model.generates)
    probed = capabilities.refusals(probe, model.probe_op) if probe is not None else {}
    adapted = space_fit.for_task(space_fit.for_probe(adapted, probed, task), model.generates, request.pins)
    refused = {**task, **probed}
    if "precision" not in request.pins.as_dict():
        adapted = space_fit.for_model(adapted, model.linear_heavy)
    model.check_shapes(request.pins.as_dict().get("shapes"))
    adapted = space_fit.for_buckets(adapted, model.buckets is not None)
    return model, space_fit.pin(adapted, request.pins, available, refused)


def open_search(request: SearchRequest, machine: Machine,
                check: Callable[[requests.BenchRequest, Machine], None] | None = None,
                probe: Probe | None = None) -> Search:
    """Validate everything (and, with `check`, run a user model once) before the study is touched;
    then create or resume it, failing the trials a killed autotune left running. `probe`: this
    CPU's kernel probe (None: the kept one, or a new one)."""
    cores = len(machine.topology.usable_cores)
    probe = probe or capabilities.load(request.cache_dir, cores)
    model, adapted = validate(request, machine, probe)
    if check is not None:
        check(bench_request(request, request.pins), machine)  # a pinned peer backend converts the model once
    name = study_name(request, model)
    url = storage.storage_url(name, request.storage, request.studies_dir)
    liar = storage.is_server(url)  # workers on a server: TPE counts the running trials of the others
    study = storage.create(name, url, DIRECTIONS[request.objective], sampler(request.seed, liar),
                           optuna.pruners.NopPruner())  # pruning.PruneCheck decides, replicate by replicate
    settings, cls = _settings(request, model, machine), host_class(machine)
    refused = {**space_fit.task_refusals(model.generates), **capabilities.refusals(probe, model.probe_op)}
    found = recipes.recipes(machine.topology, request.objective, refused, space_fit.runtimes_installed(model.generates),
                            generates=model.generates)
    known, left_out = recipes.fitting(found, adapted, request.pins)
    # In one worker at a time, as claiming a trial (fleet.claim): two hosts of different classes
    # would both claim a new study, and a dead worker's trial failed here would be retried under a claimer.
    with storage.exclusive(study):
        _check_pins(study, request.pins)
        claims.check_wanted(study, _wanted(request, model))  # what was asked first, then where it runs
        mixed = fleet.claim_class(study, cls, request.allow_mixed)
        claims.claim(study, _wanted(request, model), adapted.to_json(), _description(request, machine, settings),
                      other_class=bool(mixed))
        study.set_user_attr("probe", probe.summary(cores) | {"op": model.probe_op})  # study/efficiency.py
        started = warm.winners(study, url, request.studies_dir, cls, adapted) if request.warm_start else []
        notes = [*mixed, *adapted.notes, *warm.note(started), *([left_out] if left_out else []),
                 *claims.claim_settings(study, settings, _setting_flags(model),
                                        cls.keys() if request.allow_mixed else ()),
                 *_restore_kept(study, url, request),
                 *(f"trial {n} was left running by a killed autotune; marked failed"
                   for n in holders.abandon_stale_trials(study, study.get_trials(deepcopy=False)))]
    done = records.finished(study)
    if done >= request.trials:
        notes.append(f"study {name} already holds {done} finished trials; raise --trials to search further")
    proposer = proposals.Proposer(adapted, request.batch_sizes or (request.batch_size,),
                                  functools.partial(sampler, constant_liar=liar), known, request.seed,
                                  tuple(started))
    return Search(request, study, adapted, model, name, url, tuple(notes), done, claims.settings_digest(settings),
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


def _setting_flags(model: models.ModelSpec) -> dict[str, str]:
    """The option behind each setting; a transformers model's input shape is its --seq-len."""
    tokens = model.kind == "huggingface" and not model.example_inputs
    return SETTING_FLAGS | ({"input_shape": "--seq-len"} if tokens else {})


def _restore_kept(study: optuna.Study, url: str, request: SearchRequest) -> list[str]:
    """Measurements a locked database kept out of the study last time are recorded now."""
    notes = []
    for path in storage.kept_aside(url, request.studies_dir, study.study_name):
        number = kept.restore_kept(study, path, request.limits)
        if number is not None:
            notes.append(f"trial {number}'s measurement, kept in {path} while the study was locked, is recorded now")
    return notes


def _wanted(request: SearchRequest, model: models.ModelSpec) -> dict[str, Any]:
    wanted = {"model": model.name, "batch_size": request.batch_size, "objective": request.objective,
              "batch_sizes": list(request.batch_sizes), "max_latency_ms": request.max_latency_ms,
              "max_tpot_ms": request.max_tpot_ms,
              "pins": request.pins.describe() if request.pins.values else ""}
    judged: dict[str, Any] = {"eval_data": evaldata.digest(evaldata.check(request.eval_data, model.generates))} \
        if request.eval_data else {}
    if request.eval_data or request.eval_metric:
        judged |= {"max_quality_drop": request.max_quality_drop, "eval_metric": request.eval_metric,
                   "eval_direction": request.eval_direction}
    return (wanted | judged | ({"example_inputs": model.example_inputs} if model.example_inputs else {})
            | ({"task": model.task} if model.task else {})
            | ({"seq_lens": list(model.buckets.lengths), "seq_len_weights": list(model.buckets.weights)}
               if model.buckets else {}))


def _description(request: SearchRequest, machine: Machine, settings: dict[str, Any]) -> dict[str, Any]:
    return {"host": claims.host_fingerprint(machine), "created_by": request.command_line,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "settings": settings,
            "settings_digest": claims.settings_digest(settings)}


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
    """The search's sampler; its settings were chosen with benchmarks/sampler_replay.py
    (benchmarks/RESULTS.md, "Which sampler").
    `constant_liar` for workers sharing a study: other workers' running trials count as bad, so
    that parallel workers spread out instead of proposing the same region."""
    with storage.quiet_optuna():
        # group=True keeps conditional knobs (kmp_* only with Intel OpenMP) in their own groups.
        return optuna.samplers.TPESampler(multivariate=True, group=True, n_startup_trials=STARTUP_TRIALS,
                                          seed=seed, constant_liar=constant_liar)


def bench_request(request: SearchRequest, config: Config, batch: int | None = None) -> requests.BenchRequest:
    """One configuration of the search as `bench` would measure it (a batch size of the search's)."""
    return requests.BenchRequest(model=request.model, config=config, batch_size=batch or request.batch_size,
                                 measure=request.measure, cache_dir=request.cache_dir,
                                 input_shape=request.input_shape, example_inputs=request.example_inputs,
                                 seq_len=request.seq_len, task=request.task, buckets=request.buckets,
                                 new_tokens=request.new_tokens,
                                 tolerance=request.tolerance, calibration_batches=request.calibration_batches,
                                 eval_data=request.eval_data, guard_judges=request.max_quality_drop is None,
                                 eval_metric=request.eval_metric, eval_direction=request.eval_direction)
