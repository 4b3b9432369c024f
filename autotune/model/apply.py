"""autotune in your own program: run a model exactly as the benchmark measured it.

    import autotune

    model = autotune.apply(model, example_inputs)   # the knobs of `source best.env` / `autotune run`
    output = model(batch)

The configuration comes from the environment (`AUTOTUNE_*` variables that `source best.env` or
`autotune run best.env -- ...` sets) or from an env file passed as `env_file=`. With none, the
model comes back unchanged. The conversions are the ones the benchmark child applied, through the
same function (`autotune.model.convert.prepare`): what was measured is what runs.
"""

from __future__ import annotations

import copy
import json
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.model import artifacts, buckets, envfile, hf, quantize
from autotune.model.backends.base import Quantized
from autotune.model.batches import call, inputs, leaves
from autotune.model.convert import guard, load_saved, prepare
from autotune.model.errors import ApplyError
from autotune.model.knobdefs import value_text
from autotune.model.knobs import KNOBS, MODEL_KNOBS, KnobValue, KnobValueError, ModelKnobs

# The variables of the knobs that change the model itself (`envfile.knob_var`).
KNOB_VARS = {name: envfile.knob_var(name) for name in MODEL_KNOBS}


class CompileFallback(UserWarning):
    """torch.export could not capture the model, so backend=inductor compiled it with torch.compile in
    this process (as the benchmark child did), and nothing was saved for the next process."""


class ArtifactRebuilt(UserWarning):
    """A saved artifact of this model, knobs and inputs was made for another torch, CPU or artifact
    format, so it was not loaded and a new one was compiled."""


@dataclass(frozen=True)
class Deployment:
    """A configuration to apply: the model knobs, the guard's tolerance, where artifacts live."""

    knobs: ModelKnobs = field(default_factory=ModelKnobs)
    tolerance: float | None = None  # what check=True allows against eager fp32; None: the precision's (`TOLERANCE`)
    artifacts: Path | None = None
    source: str = "the environment"
    seq_lens: tuple[int, ...] = ()  # sequence-length buckets: one compiled model per length (`autotune.model.buckets`)
    generates: bool = False  # measured generating text (--task generate): apply returns a `Generating`


def from_env(env: Mapping[str, str], source: str = "the environment") -> Deployment | None:
    """The deployment an environment describes, or None when it holds no model knob at all."""
    if not any(var in env for var in KNOB_VARS.values()):
        return None  # no env file was sourced (it always names the backend): nothing to check
    try:
        envfile.check_format(env)
    except envfile.EnvFileError as exc:
        raise ApplyError(f"{source}: {exc}; export the env file again") from None
    knobs = knobs_from_env(env, source)
    if envfile.version(env) == 1:
        _same_as_listed(knobs, env.get(envfile.LISTED_VAR, ""), source)
    tolerance_var = envfile.TOLERANCE_VAR
    try:
        tolerance = float(env[tolerance_var]) if env.get(tolerance_var) else None
    except ValueError:
        raise ApplyError(f"{tolerance_var}={env[tolerance_var]!r} in {source} is not a number; "
                         f"export the env file again") from None
    artifacts = Path(env[envfile.ARTIFACTS_VAR]) if env.get(envfile.ARTIFACTS_VAR) else None
    return Deployment(knobs, tolerance, artifacts, source, buckets.lengths_from_env(env, source),
                      env.get(envfile.TASK_VAR) == hf.GENERATE)


def knobs_from_env(env: Mapping[str, str], source: str = "the environment") -> ModelKnobs:
    """The model knobs of an environment; a variable that is absent keeps PyTorch's default."""
    return ModelKnobs.from_values({name: _value(env, name, source) for name in KNOB_VARS if KNOB_VARS[name] in env})


def _same_as_listed(knobs: ModelKnobs, listed: str, source: str) -> None:
    """Format 1 listed every knob again in one line (AUTOTUNE_KNOBS); a model knob there that the
    variables above contradict (a file from an older autotune, an edit by hand) is refused."""
    values = to_env(knobs)
    for pair in listed.split():
        name, _, value = pair.partition("=")
        if name in KNOB_VARS and values[KNOB_VARS[name]] != value:
            raise ApplyError(f"{source} lists {name}={value} in {envfile.LISTED_VAR} but {KNOB_VARS[name]}="
                             f"{values[KNOB_VARS[name]]!r}; export the env file again with this autotune")


def to_env(knobs: ModelKnobs) -> dict[str, str]:
    """The variables that describe `knobs`; `from_env` reads them back."""
    values = asdict(knobs)
    return {var: value_text(values[name]) for name, var in KNOB_VARS.items()}


def _value(env: Mapping[str, str], name: str, source: str) -> KnobValue:
    try:
        return KNOBS[name].parse(env[KNOB_VARS[name]])
    except KnobValueError:
        raise ApplyError(f"{KNOB_VARS[name]}={env[KNOB_VARS[name]]!r} in {source} is not one of "
                         f"{KNOBS[name].allowed()}; export the env file again") from None


def load_env_file(path: str | os.PathLike[str]) -> Deployment | None:
    """The deployment an env file written by `autotune export` describes."""
    try:
        parsed = envfile.read(path)
    except envfile.EnvFileError as exc:
        raise ApplyError(str(exc)) from None
    return from_env(parsed.env, source=str(path))


class Applied:
    """The model as configured, called like the model: `applied(x)`, `applied(a, b)`,
    `applied(**inputs)`, under `torch.no_grad()`. `knobs` and `setup` say what was done."""

    def __init__(self, forward: Callable[[Any], Any], knobs: ModelKnobs, setup: dict[str, Any]) -> None:
        self.run, self.knobs, self.setup = forward, knobs, setup  # run(batch): one batch as apply took it

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        batch = kwargs if kwargs and not args else args[0] if len(args) == 1 and not kwargs else args
        if kwargs and args:
            raise ApplyError("call the applied model with positional or keyword inputs, not both, as its "
                             "example inputs were given")
        with torch.no_grad():
            return self.run(batch)

    def __repr__(self) -> str:
        return f"autotune.Applied({self.knobs.describe()})"


def apply(model: Any, example_inputs: Any, env_file: str | os.PathLike[str] | None = None, *,
          check: bool = False, calibration: Sequence[Any] = ()) -> Any:
    """`model` converted as the exported configuration says: from `env_file`, else from the
    environment (`source best.env`, `autotune run`). Without one, `model` is returned unchanged.

    `example_inputs` is one batch as the model takes it: a tensor, a tuple of positional inputs,
    or a dict of keyword inputs (integer token ids stay as they are). It is used to trace and
    compile (a compiled model takes inputs of exactly these shapes) and, with `check=True`, to
    compare the output against eager fp32 within the tolerance the study recorded (`WrongAnswers`
    when it does not hold). Conversions that change a module in place (mkldnn, channels_last,
    int8_dynamic, int8_weight_only) work on a copy: your `model` stays as it was.

    precision=int8 calibrates on `calibration` (batches like `example_inputs`, say a few hundred
    real inputs), and `check=True` compares top-1 answers and cosine similarity with eager fp32 on
    those batches. Without them it calibrates on the batches the study calibrated this very model on,
    which the benchmark child keeps beside the artifact (so it loads the artifact that was measured),
    else on `example_inputs` alone.

    A configuration searched at sequence-length buckets (`--seq-lens`) compiles one model per length
    and serves a batch of token inputs of any length up to the largest bucket: padded to the smallest
    bucket that holds it, its outputs cut back to its own tokens; with shapes=dynamic, one model
    for every length up to the largest, each batch run at its own length.

    A transformers model comes back as the benchmark child ran it (`hf.wrap`), configured or not:
    its output is its head's tensor (logits, last hidden state), not a ModelOutput.

    A causal LM (transformers' ...ForCausalLM) comes back as a `Generating`: its `stream` and
    `generate` take prompts (token ids [batch, length], `example_inputs` like them) and run what a
    study measured generating (`--task generate`), or PyTorch's defaults without a configuration
    (`autotune.model.generate.applied`).
    """
    chosen = load_env_file(env_file) if env_file is not None else from_env(os.environ)
    from autotune.model.generate.applied import apply_generation, is_causal_lm

    if (chosen is not None and chosen.generates) or (chosen is None and is_causal_lm(model)):
        if not is_causal_lm(model):
            raise ApplyError(f"{chosen.source} was measured generating text (--task generate) and this model is "  # type: ignore[union-attr]
                             f"{type(model).__name__}, not a transformers causal LM (...ForCausalLM)")
        _report(chosen)
        knobs = chosen.knobs if chosen is not None else ModelKnobs()
        return apply_generation(model, example_inputs, knobs, tolerance=chosen.tolerance if chosen else None,
                                artifacts=chosen.artifacts if chosen else None, check=check)
    model = hf.wrapped(model)
    if chosen is None or (chosen.knobs.is_default and not check):
        _report(chosen)
        return model
    if chosen.knobs.shapes == "dynamic" and not chosen.seq_lens:
        raise ApplyError(f"{chosen.source} sets shapes=dynamic without the sequence lengths it serves "
                         f"({envfile.SEQ_LENS_VAR}); export the env file again")
    if chosen.seq_lens and chosen.knobs.compiled:
        applied = apply_buckets(model, example_inputs, chosen, check=check, calibration=calibration)
    else:
        applied = apply_deployment(_own_copy(model, chosen.knobs), example_inputs, chosen, check=check,
                                   calibration=list(calibration))
    for setup in applied.setup.get("buckets", {}).values() or [applied.setup]:
        for stale in setup.get("artifact_stale", []):
            warnings.warn(f"autotune: not loading {stale}; compiled a new one", ArtifactRebuilt, stacklevel=2)
        if "aot_fallback" in setup:
            warnings.warn(f"autotune: {setup['aot_fallback']}: compiled in this process, not saved",
                          CompileFallback, stacklevel=2)
    return applied


def _own_copy(model: Any, knobs: ModelKnobs) -> Any:
    """The model a conversion may change in place (mkldnn, channels_last, torchao's int8): a copy, so
    the user's model stays as it was (and each bucket quantizes the model once)."""
    return copy.deepcopy(model) if knobs.converts_in_place else model


def apply_buckets(model: Any, example_inputs: Any, chosen: Deployment, *, check: bool,
                  calibration: Sequence[Any] = ()) -> Applied:
    """A compiled model takes one shape: one per bucket of `chosen.seq_lens`, each applied to the
    example (and calibration) padded or cut to its length, behind one forward that serves any length
    up to the largest bucket (`buckets.Bucketed`). `setup["buckets"]` holds each one's setup.
    shapes=dynamic: one model, applied at the largest length, serves every length (`buckets.Ranged`)."""
    buckets.sequence_length(example_inputs)  # token inputs, or one line saying buckets need them
    if not chosen.knobs.one_shape:
        longest = chosen.seq_lens[-1]
        one = apply_deployment(_own_copy(model, chosen.knobs), buckets.fit(example_inputs, longest), chosen,
                               check=check, calibration=[buckets.fit(batch, longest) for batch in calibration])
        return Applied(buckets.Ranged(one.run, chosen.seq_lens), chosen.knobs, one.setup)
    parts = {length: apply_deployment(_own_copy(model, chosen.knobs), buckets.fit(example_inputs, length), chosen,
                                      check=check, calibration=[buckets.fit(batch, length) for batch in calibration])
             for length in chosen.seq_lens}
    setup = {"buckets": {str(length): part.setup for length, part in parts.items()}}
    return Applied(buckets.Bucketed({length: part.run for length, part in parts.items()}), chosen.knobs, setup)


def apply_deployment(model: Any, example_inputs: Any, chosen: Deployment, *, check: bool,
                     setup: dict[str, Any] | None = None, on_phase: Callable[[str], None] | None = None,
                     calibration: Sequence[Any] = (), guard_inputs: Sequence[Any] = (),
                     references: list[list[Any]] | None = None) -> Applied:
    """The conversion itself, shared by `apply` and the benchmark child (which passes its plan's
    knobs, records what happened in `setup` and hears of compiling in `on_phase`). int8 calibrates
    on `calibration` and is checked on `guard_inputs` (default: the calibration batches) as well as
    on the example. `references`: eager fp32's outputs on `checked_batches`, when the caller has
    them already (`eager_outputs`)."""
    import torch

    setup = {} if setup is None else setup
    model = model.eval()
    int8 = chosen.knobs.precision == "int8"
    checked = checked_batches(example_inputs, chosen, calibration, guard_inputs)
    with torch.no_grad():
        if check and references is None:
            references = eager_outputs(model, checked)
        forward = prepare(model, example_inputs, chosen.knobs, setup, chosen.artifacts, on_phase,
                          _quantized(example_inputs, chosen.knobs, calibration, setup) if int8 else None)
    return _checked(forward, example_inputs, checked, references if check else None, chosen, setup)


def apply_saved(example_inputs: Any, chosen: Deployment, weights: str, references: list[list[Any]], *,
                setup: dict[str, Any], on_phase: Callable[[str], None] | None = None,
                calibration: Sequence[Any] = (), guard_inputs: Sequence[Any] = ()) -> Applied | None:
    """`apply_deployment` with check=True for a model known only by its fingerprint (`weights`)
    and eager fp32's outputs on `checked_batches` (`references`), whose compiled artifact (for
    int8: or quantized graph) is saved in `chosen.artifacts`; None when it is not."""
    if chosen.artifacts is None or not chosen.knobs.compiled:
        return None
    int8 = chosen.knobs.precision == "int8"
    quantized = _quantized(example_inputs, chosen.knobs, calibration, setup) if int8 else None
    forward = load_saved(example_inputs, chosen.knobs, setup, chosen.artifacts, weights, quantized,
                         on_phase or (lambda phase: None))
    if forward is None:
        return None
    checked = checked_batches(example_inputs, chosen, calibration, guard_inputs)
    return _checked(forward, example_inputs, checked, references, chosen, setup)


def checked_batches(example_inputs: Any, chosen: Deployment, calibration: Sequence[Any] = (),
                    guard_inputs: Sequence[Any] = ()) -> list[Any]:
    """The batches the guard compares with eager fp32: the example; with shapes=dynamic, the example
    cut to each shorter bucket too (one model serves every length); for every int8, the guard's own
    batches (default: the calibration batches)."""
    shorter = [buckets.fit(example_inputs, length) for length in chosen.seq_lens[:-1]] \
        if chosen.knobs.shapes == "dynamic" else []
    if not chosen.knobs.quantized:
        return [example_inputs, *shorter]
    return [example_inputs, *shorter, *(guard_inputs or calibration)]


def eager_outputs(model: Any, batches: Sequence[Any]) -> list[list[Any]]:
    """The model's output tensors on each batch, as it is (eager fp32): the guard's reference."""
    import torch

    with torch.no_grad():
        return [leaves(call(model.eval(), batch)) for batch in batches]


def _checked(forward: Callable[[Any], Any], example_inputs: Any, checked: list[Any],
             references: list[list[Any]] | None, chosen: Deployment, setup: dict[str, Any]) -> Applied:
    """The first call timed, the output described, and with `references` the guard applied."""
    import torch

    with torch.no_grad():
        start = time.perf_counter()
        output = forward(example_inputs)
        setup["first_forward_s"] = time.perf_counter() - start
    setup["output_dtype"] = str(leaves(output)[0].dtype).replace("torch.", "")
    setup["output_digest"] = digest(output)
    if references:
        guard(references[0], leaves(output), chosen.knobs.precision, chosen.tolerance, setup)
    if references and not chosen.knobs.quantized:
        _other_lengths_guard(forward, checked[1:], references[1:], chosen, setup)
    if references and chosen.knobs.quantized:
        _int8_guard(forward, leaves(output), checked, references, chosen, setup)
    _report(chosen)
    return Applied(forward, chosen.knobs, setup)


def _other_lengths_guard(forward: Callable[[Any], Any], checked: list[Any], references: list[list[Any]],
                         chosen: Deployment, setup: dict[str, Any]) -> None:
    """fp32's and bf16's guard on the further checked batches (shapes=dynamic: the shorter lengths);
    the worst relative error is recorded."""
    import torch

    for batch, reference in zip(checked, references, strict=True):
        each: dict[str, Any] = {}
        with torch.no_grad():
            guard(reference, leaves(forward(batch)), chosen.knobs.precision, chosen.tolerance, each)
        if each["max_rel_err"] > setup["max_rel_err"]:
            setup.update(each)


def _int8_guard(forward: Callable[[Any], Any], first: list[Any], checked: list[Any], references: list[list[Any]],
                chosen: Deployment, setup: dict[str, Any]) -> None:
    """The guard of every int8 precision over every checked batch. Its figures are a property of the artifact and the
    inputs, so they are kept in the artifact's description; a later process reuses them (the
    tolerance judged again) only when its own answer on the example batch is the one the guarded
    process got (`_reusable`): the same artifact computing the same thing."""
    import torch

    precision, tolerance = chosen.knobs.precision, chosen.tolerance
    artifact = Path(setup["artifact_file"]) if setup.get("artifact_file") else None
    key = quantize.guard_key(checked, references)
    record = artifacts.guard_record(artifact, key) if artifact else None
    if record is not None and _reusable(record, setup["output_digest"]):
        setup["guard_reused"] = True
        quantize.judge(record, precision, tolerance, setup)
        return
    with torch.no_grad():
        outputs = [first] + [leaves(forward(batch)) for batch in checked[1:]]
    quantize.agreement_guard(references, outputs, precision, tolerance, setup)
    if artifact is not None:
        figures = {name: setup[name] for name in ("top1_agreement", "min_cosine", "guard_items")}
        artifacts.remember_guard(artifact, key, figures | {"output_digest": setup["output_digest"]})


def _reusable(record: dict[str, Any], now: list[float]) -> bool:
    """A whole record whose output digest (`digest`) equals this one but for float summation order."""
    recorded = record.get("output_digest")
    figures = [record.get(name) for name in ("top1_agreement", "min_cosine", "guard_items")]
    if not all(isinstance(f, (int, float)) for f in figures):
        return False
    if not isinstance(recorded, list) or len(recorded) != len(now):
        return False
    return all(isinstance(r, (int, float)) and abs(r - n) <= 1e-6 * max(abs(r), abs(n), 1e-12)
               for r, n in zip(recorded, now, strict=True))


def _quantized(example: Any, knobs: ModelKnobs, calibration: Sequence[Any], setup: dict[str, Any]) -> Quantized:
    """int8's graph: quantized on the calibration batches, in the layout the knobs give every input.
    Without any, on the batches kept for this model beside its artifact (the study's: what it was
    measured with), else on the example (`convert.calibrated`)."""

    def on(batches: Sequence[Any], given: bool) -> Quantized:
        calibrated = [inputs(batch, knobs) for batch in batches]
        return Quantized(lambda model, ex, folder, described: quantize.quantized_export(
                             model, ex, calibrated, setup, dynamic=knobs.shapes == "dynamic",
                             keep_fp32=knobs.int8_fallback, folder=folder, described=described),
                         quantize.digest(calibrated), quantize.load_graph, calibrated, given,
                         lambda saved: on(saved, given=False))

    return on(calibration, given=True) if calibration else on([example], given=False)


def digest(output: Any) -> list[float]:
    """Sum and absolute sum of the output's tensors: enough to tell two processes' answers apart."""
    tensors = [t.double() for t in leaves(output)]
    return [float(sum(t.sum() for t in tensors)), float(sum(t.abs().sum() for t in tensors))]


def _report(chosen: Deployment | None) -> None:
    """Tell `autotune run` (when it asked, by `envfile.REPORT_VAR`) that this process applied its knobs."""
    path = os.environ.get(envfile.REPORT_VAR)
    if not path:
        return
    record = {"pid": os.getpid(), "knobs": asdict(chosen.knobs) if chosen else None,
              "source": chosen.source if chosen else None}
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
