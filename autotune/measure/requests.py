"""One configuration, planned: a request becomes a `LaunchPlan` for a machine, and a user model is
tried once (the probe) before anything is measured."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune.base.errors import ConfigError, ModelError, RunFailed
from autotune.child.settings import CACHE_DIR, MeasureSettings
from autotune.config import evaldata, models, space_fit
from autotune.config.knobs import KNOBS, Config
from autotune.host import capabilities
from autotune.host.capabilities import Probe
from autotune.host.machine import Machine, memory_gib
from autotune.measure.plan import (
    BenchSpec,
    Binding,
    LaunchPlan,
    model_knobs,
    plan_launch,
    worker_command,
)
from autotune.measure.runner import run_plan
from autotune.model import backends, envfile
from autotune.model.backends.converted import CONVERT_FAILED
from autotune.model.buckets import BucketError, Buckets
from autotune.model.envfile import SEQ_LEN_WEIGHTS_VAR, SEQ_LENS_VAR, has_control
from autotune.model.errors import LOAD_FAILED
from autotune.model.files import unwritable


@dataclass(frozen=True)
class BenchRequest:
    """What the user asked for, converted once from flags."""

    model: str
    config: Config
    batch_size: int = 1
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    cache_dir: Path = Path(CACHE_DIR)
    input_shape: str | None = None
    example_inputs: str | None = None
    seq_len: int | None = None  # tokens per item of a transformers model's random inputs; None: hf.DEFAULT_SEQ_LEN
    task: str | None = None  # a transformers model's head; None: hf.DEFAULT_TASK
    new_tokens: int | None = None  # --task generate: tokens generated per request; None: hf.DEFAULT_NEW_TOKENS
    buckets: Buckets | None = None  # `--seq-lens`: a transformers model measured at each length
    tolerance: float | None = None  # None: per precision (convert.TOLERANCE)
    calibration_batches: int | None = None  # precision=int8; None: quantize.CALIBRATION_BATCHES
    eval_data: str | None = None  # `--eval-data`: the user's data, as typed (checked by `make_plan`)
    guard_judges: bool = True  # False under --max-quality-drop: the drop on the user's data judges, the guard records
    eval_metric: str | None = None  # `--eval MODULE:FUNCTION`
    eval_direction: str | None = None  # `--eval-direction`: higher or lower

    @classmethod
    def from_flags(cls, model: str, assignments: Iterable[str], batch_size: int,
                   **options: object) -> BenchRequest:
        if batch_size < 1:
            raise ConfigError(f"--batch-size {batch_size} is not allowed; use 1 or more")
        return cls(model=model, config=Config.from_assignments(assignments),
                   batch_size=batch_size, **options)  # type: ignore[arg-type]


def check_runs_here(request: BenchRequest, probe: Probe) -> str:
    """Refuse a precision this CPU's kernel probe found cannot run with the backend asked for (its
    reason); one it measured far slower than fp32 runs, and the note returned says so ("" when none)."""
    backend, precision = request.config.text("backend"), request.config.text("precision")
    spec = resolved(request)
    op = spec.probe_op
    why = {**space_fit.task_refusals(spec.generates), **capabilities.refusals(probe, op, slow=False)}.get(
        (backend, precision))
    if why:
        raise ConfigError(f"precision={precision} cannot run here with backend={backend}: {why}; use precision=fp32 "
                          f"(or `autotune doctor --probe` to measure this CPU again)")
    slower = capabilities.refusals(probe, op).get((backend, precision))
    return f"precision={precision} with backend={backend}: {slower}, so a search does not offer it" if slower else ""


def check_cache_dir(folder: Path) -> None:
    """Refuse a cache folder no child could compile into, before anything runs or is recorded."""
    why = unwritable(folder, make=False)
    if why:
        raise ConfigError(f"--cache-dir {str(folder)!r} is not a writable folder ({why}); make it writable or "
                          f"choose another (compiled models and the kernel probe are kept there)")


def make_plan(request: BenchRequest, machine: Machine) -> LaunchPlan:
    backend = str(request.config.get("backend"))
    spec = resolved(request)
    if not machine.described and not backends.installed(backend, spec.generates):
        raise ConfigError(backends.not_installed(backend, spec.generates))
    spec.check_shapes(request.config.get("shapes"))
    space_fit.check_task_knobs(request.config, spec.generates)
    check_batch_fits((request.batch_size,), spec.item_shape)
    bench = BenchSpec(
        model=spec.name, item_shape=spec.item_shape, batch_size=request.batch_size,
        measure=request.measure, cache_dir=str(request.cache_dir.resolve()), tolerance=request.tolerance,
        import_path=spec.import_path, example_inputs=spec.example_inputs, task=spec.task,
        calibration_batches=request.calibration_batches,
        eval_data=evaldata.check(request.eval_data, spec.generates) if request.eval_data else "",
        guard_judges=request.guard_judges,
    )
    metric, where, direction = evaldata.check_metric(request.eval_metric, request.eval_direction)
    if metric:
        bench = replace(bench, eval_metric=metric, eval_direction=direction, eval_import_path=where)
    if spec.buckets:
        bench = replace(bench, seq_lens=spec.buckets.lengths, seq_len_weights=spec.buckets.weights)
    binder: Binding | None = "numactl" if machine.described else None
    return plan_launch(request.config, bench, machine.topology, machine.libs, sys.executable,
                       binder=binder, parent_env=dict(os.environ))


def resolved(request: BenchRequest) -> models.ModelSpec:
    return models.resolve(request.model, input_shape=request.input_shape, example_inputs=request.example_inputs,
                          seq_len=request.seq_len, task=request.task, buckets=request.buckets,
                          new_tokens=request.new_tokens, cache_dir=request.cache_dir)


def check_batch_fits(batch_sizes: Iterable[int], item_shape: tuple[int, ...]) -> None:
    """A batch whose float32 inputs alone outgrow this machine's memory is refused before
    anything runs: measured, it would run until killed."""
    total_gib = memory_gib()
    for batch in batch_sizes:
        need_gib = batch * math.prod(item_shape) * 4 / 2**30
        if total_gib is not None and need_gib > total_gib:
            shape = "x".join(map(str, item_shape))
            raise ConfigError(f"--batch-size {batch}: one batch of {shape} float32 inputs needs {need_gib:,.0f} GiB "
                              f"and this machine has {total_gib} GiB; give a smaller batch size")


def plan_from_exported(env: Mapping[str, str], machine: Machine,
                       measure: MeasureSettings | None = None) -> LaunchPlan:
    """An exported configuration planned again for `machine` from its recorded knobs."""
    return make_plan(exported_request(env, measure), machine)


def exported_request(env: Mapping[str, str], measure: MeasureSettings | None = None) -> BenchRequest:
    """The request an env file records (its model, batch size, inputs and knobs), checked: the one
    validation of those variables, for `run` and `compare` alike."""
    batch = env.get(envfile.BATCH_SIZE_VAR, "1")
    if not batch.strip().isdigit() or int(batch) < 1:
        raise ConfigError(f"{envfile.BATCH_SIZE_VAR}={batch!r} is not a batch size (1 or more); export again")
    tolerance_var = envfile.TOLERANCE_VAR
    try:
        tolerance = float(env[tolerance_var]) if env.get(tolerance_var) else None
    except ValueError:
        raise ConfigError(f"{tolerance_var}={env[tolerance_var]!r} is not a number; export again") from None
    saved = env.get(envfile.EXAMPLE_INPUTS_VAR) or None
    calibration = env.get(envfile.CALIBRATION_VAR, "")
    if calibration and not (calibration.isdigit() and int(calibration) >= 1):
        raise ConfigError(f"{envfile.CALIBRATION_VAR}={calibration!r} is not a number of batches (1 or more); "
                          f"export again")
    seq_len = env.get(envfile.SEQ_LEN_VAR, "")
    if seq_len and not (seq_len.isdigit() and int(seq_len) >= 1):
        raise ConfigError(f"{envfile.SEQ_LEN_VAR}={seq_len!r} is not a number of tokens (1 or more); export again")
    new_tokens = env.get(envfile.NEW_TOKENS_VAR, "")
    if new_tokens and not (new_tokens.isdigit() and int(new_tokens) >= 1):
        raise ConfigError(f"{envfile.NEW_TOKENS_VAR}={new_tokens!r} is not a number of tokens (1 or more); "
                          f"export again")
    return BenchRequest(model=env.get(envfile.MODEL_VAR, ""), batch_size=int(batch),
                        calibration_batches=int(calibration) if calibration else None,
                        config=exported_config(env), measure=measure or MeasureSettings(), example_inputs=saved,
                        tolerance=None if tolerance is None else check_tolerance(tolerance, f"{tolerance_var}="),
                        input_shape=None if saved else env.get(envfile.INPUT_SHAPE_VAR),
                        seq_len=int(seq_len) if seq_len and not saved else None,
                        task=env.get(envfile.TASK_VAR) or None, buckets=exported_buckets(env),
                        new_tokens=int(new_tokens) if new_tokens else None)


def exported_config(env: Mapping[str, str]) -> Config:
    """The knobs an env file sets: format 2's `AUTOTUNE_<KNOB>` variables, each knob once (the backend
    always named, as a knob at its default launches what leaving it unset does); format 1 listed them
    all in `AUTOTUNE_KNOBS`."""
    if envfile.version(env) == 1:
        return Config.from_assignments(env.get(envfile.LISTED_VAR, "").split())
    values = {name: env[envfile.knob_var(name)] for name in KNOBS if envfile.knob_var(name) in env}
    if values.get("backend") == KNOBS["backend"].default:
        del values["backend"]
    return Config.from_mapping(values)


def exported_buckets(env: Mapping[str, str]) -> Buckets | None:
    """The sequence-length buckets an env file records (AUTOTUNE_SEQ_LENS and their weights)."""
    lengths = env.get(SEQ_LENS_VAR, "").strip()
    if not lengths:
        return None
    try:
        return Buckets.parse(lengths, env.get(SEQ_LEN_WEIGHTS_VAR, ""))
    except BucketError as exc:
        raise ConfigError(f"{SEQ_LENS_VAR}={lengths!r}: {exc}; export again") from None


def check_tolerance(value: float, name: str) -> float:
    """A relative error allowed against eager fp32: finite, 0 or more."""
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{name}{value:g} is not a tolerance; give a relative error of 0 or more, like 0.01 "
                          f"(leave it out for the default per precision)")
    return value


def check_model(request: BenchRequest, machine: Machine, timeout_s: float = 600) -> None:
    """A user model (factory, .pt, .pt2, or any --input-shape) is built and run once before
    measuring; a model that cannot is a bad input (exit code 2), not a failed trial."""
    spec = resolved(request)
    if spec.needs_probe or request.input_shape is not None:
        _check_runs(request, machine, spec, timeout_s)
    if request.eval_data or request.eval_metric:
        _check_eval_data(request, machine, timeout_s)
    _check_conversion(request, machine, timeout_s)


def _check_eval_data(request: BenchRequest, machine: Machine, timeout_s: float) -> None:
    """The user's data read by the model once, fp32 eager judged on it: data the model cannot take
    (a text shorter than two windows, labels beyond its classes, no tokenizer) is a bad input."""
    from autotune.measure import quality

    found = quality.measure(make_plan(replace(request, config=Config()), machine), "search", timeout_s)
    reason = str(found.get("error", ""))
    if reason:
        flag = evaldata.FLAG if evaldata.FLAG in reason else evaldata.METRIC_FLAG
        said = reason[reason.find(flag):] if flag in reason else \
            f"{evaldata.FLAG} could not be judged with model {request.model}: {reason}"
        raise ModelError(said.splitlines()[0])


def _check_runs(request: BenchRequest, machine: Machine, spec: models.ModelSpec, timeout_s: float) -> None:
    plan = make_plan(BenchRequest(model=request.model, config=Config(), batch_size=1,
                                  cache_dir=request.cache_dir, input_shape=request.input_shape,
                                  example_inputs=request.example_inputs, seq_len=request.seq_len,
                                  task=request.task, buckets=request.buckets, new_tokens=request.new_tokens),
                     machine)
    reason = probe(plan, timeout_s)
    if reason.startswith(LOAD_FAILED):
        raise ModelError(reason)
    if reason:
        shape = "x".join(map(str, spec.item_shape))
        tokens = spec.kind == "huggingface" and not spec.example_inputs
        said, flag = (f"{shape} tokens per item", "--seq-len") if tokens else (f"input shape {shape}", "--input-shape")
        raise ModelError(f"model {request.model} does not run on {said}: {reason}; check the model and {flag}")


def _check_conversion(request: BenchRequest, machine: Machine, timeout_s: float) -> None:
    """A request pinned to OpenVINO or ONNX Runtime converts the model once before measuring (the
    artifact stays for the measurements): a model the converter rejects is a bad input, not a
    failed measurement."""
    if not model_knobs(request.config).peer:
        return
    reason = probe(make_plan(request, machine), timeout_s)
    if CONVERT_FAILED in reason:
        raise ModelError(reason)


def probe(plan: LaunchPlan, timeout_s: float, *extra: str) -> str:
    """Build the model and run one checked forward in an unbound child; '' when that works, else
    the reason. Catches a broken user model before any measurement is spent on it; with
    `--artifacts DIR` in `extra`, leaves the compiled artifacts there."""
    first = plan.instances[0]
    unbound = replace(first, command=(*worker_command(sys.executable, plan.bench, plan.config), "--probe", *extra))
    trial = replace(plan, binding="none", instances=(unbound,))
    return run_plan(trial, timeout_s).reason.removeprefix("instance 0: ")


def build_artifacts(plan: LaunchPlan, folder: Path, timeout_s: float) -> bool:
    """Compile a recorded configuration once into `folder`, where `autotune.apply` loads it;
    False when the configuration compiles nothing (eager models are used as they are)."""
    if not model_knobs(plan.config).compiled:
        return False
    if has_control(str(folder.resolve())):
        raise ConfigError(f"--artifacts {str(folder)!r} holds a control character; choose another folder")
    why = unwritable(folder)
    if why:
        raise ConfigError(f"--artifacts {str(folder)!r} is not a writable folder ({why}); choose another")
    reason = probe(plan, timeout_s, "--artifacts", str(folder.resolve()))
    if reason:
        raise RunFailed(f"could not build the artifacts for {plan.config.describe()}: {reason}")
    return True
