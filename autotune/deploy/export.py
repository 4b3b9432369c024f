"""Rendering a recorded trial as a bash env file, and reading such a file back for `autotune run`.

What is exported is the plan the trial stored when it ran, never a recomputation.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, cast, get_args

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import AutotuneError
from autotune.deploy.user_run import EnvFile
from autotune.measure import quality, requests
from autotune.measure.objectives import LIMITED, Limits, speedup_attr
from autotune.measure.plan import PRIMITIVE_CACHE_VAR, BenchSpec, Binding, LaunchPlan, serving_env
from autotune.model import envfile, hf
from autotune.model.cpu import ISA_LIMITS
from autotune.model.files import write_atomically
from autotune.model.knobdefs import value_text
from autotune.model.knobs import KNOB_VARIABLES, KNOBS
from autotune.study import confirmations, records, references

# Everything autotune's knobs may set in the process; the file unsets those its configuration leaves
# alone, so that sourcing it reproduces the trial even in a shell that had them set. Nothing else is
# unset: the shell's other variables (OPENBLAS_CORETYPE keeps some OpenBLAS builds from crashing) are
# the user's, even though a measured child did not inherit them.
TUNING_VARS = (*KNOB_VARIABLES, PRIMITIVE_CACHE_VAR, *ISA_LIMITS)
# Every variable a configuration may set (`envfile`): those a file does not set are unset, so that
# files sourced one after another never mix their knobs.
CONFIGURATION_VARS = tuple(dict.fromkeys((*envfile.FORMAT2, *envfile.OPTIONAL, *map(envfile.knob_var, KNOBS))))


class ExportError(AutotuneError):
    """Nothing to export, or nowhere to write it."""


def pick_trial(study: optuna.Study, number: int | None) -> FrozenTrial:
    """The requested trial; else the one the confirmation recommends (its winner, the simpler expert
    recipe the winner is equivalent to, the better estimate of two still undecided at the cap, or
    the baseline when nothing won); else the best."""
    trials = study.get_trials(deepcopy=False)
    if number is not None:
        trial = next((t for t in trials if t.number == number), None)
        if trial is None:
            raise ExportError(f"study {study.study_name!r} has no trial {number}; it has trials "
                              f"0 to {len(trials) - 1}")
        if trial.state != TrialState.COMPLETE:
            raise ExportError(f"trial {number} of {study.study_name!r} did not complete "
                              f"({trial.state.name.lower()}: {trial.user_attrs.get('fail_reason', '')}); "
                              f"pick a completed trial")
        return trial
    confirmation = study.user_attrs.get("confirmation")
    if confirmation:
        return next(t for t in trials if t.number == confirmations.recommended(confirmation))
    best = records.best_trials(study)
    if not best:
        failed = sum(t.state == TrialState.FAIL for t in trials)
        raise ExportError(f"study {study.study_name!r} has no completed trial ({len(trials)} trials, "
                          f"{failed} failed); run `autotune search` first or fix what fails")
    return best[0]


def fastest_within(study: optuna.Study, max_drop: float) -> FrozenTrial:
    """`export --max-quality-drop X`: the fastest completed trial (by the study's objective) whose
    quality drop on --eval-data is at most `max_drop` and that keeps the study's other limits."""
    completed = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if not records.is_duplicate(t) and t.values]
    judged = [(t, quality.drop_of(t.user_attrs.get(records.QUALITY))) for t in completed]
    if not any(drop is not None for _, drop in judged):
        raise ExportError(f"study {study.study_name!r} records no quality figures; search it with --eval-data "
                          f"(and --max-quality-drop) first")
    other = {Limits.constraint(figure) for figure in LIMITED if figure != "quality_drop"}
    fits = [t for t, drop in judged if drop is not None and drop <= max_drop
            and all(t.user_attrs.get(f"constraint_{name}", 0) <= 0 for name in other)]
    if not fits:
        least = min(drop for _, drop in judged if drop is not None)
        raise ExportError(f"no completed trial of {study.study_name!r} drops at most {max_drop:g} (the least drop "
                          f"measured is {least:.2f}); give a larger --max-quality-drop")
    reverse = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    return sorted(fits, key=lambda t: t.values[0], reverse=reverse)[0]


def render(study: optuna.Study, trial: FrozenTrial, artifacts: Path | None = None) -> str:
    """The trial's recorded plan as a file that `source`, `autotune run` and `autotune.apply` all
    understand; `artifacts` is the folder of compiled artifacts that `apply` loads."""
    plan = records.plan_of(trial)
    attrs, sattrs = trial.user_attrs, study.user_attrs
    # serving_env as well for a trial recorded before it: its child timed a few lengths per bucket,
    # which the cache held either way, so the file still reproduces what was measured
    shared = {**_shared_env([dict(i.env) for i in plan.instances]), **serving_env(plan.config, plan.bench)}
    comments = [
        f"# model {sattrs.get('model')}, batch size {sattrs.get('batch_size')}, "
        f"objective {sattrs.get('objective')}",
        f"# knobs: {attrs.get('config', 'defaults')}",
        f"# measured: p50 latency {attrs['latency_p50_ms']:.2f} ms, p90 {attrs['latency_p90_ms']:.2f} ms, "
        f"throughput {attrs['throughput_ips']:.2f} items/s, peak RSS {attrs['peak_rss_mb']:.0f} MB",
        f"# speedup over PyTorch defaults: latency {records.speedup(trial, 'speedup_latency', sattrs) or 1:.2f}x, "
        f"throughput {records.speedup(trial, 'speedup_throughput', sattrs) or 1:.2f}x",
        f"# host: {_host(sattrs.get('host', {}))}",
        f"# for host class {host_class_of(trial)}: {_measured_on(trial, sattrs.get('confirmation'))}",
        *_confirmation_lines(sattrs.get("confirmation"), trial.number),
        *([f"# this is {confirmations.which(sattrs)}, the latest; `autotune studies` lists them"]
          if confirmations.count(sattrs) > 1 else []),
        *([f"# {line}"] if (line := versus_recipes(study, trial)) else []),
        *_quality_lines(trial, sattrs.get("confirmation")),
        *(["# this study has several Pareto-optimal trials; pick another with --trial N"]
          if len(records.best_trials(study)) > 1 and len(study.directions) > 1 else []),
        "# use: `source` this file in bash, or `autotune run THIS_FILE -- python your_program.py`",
    ]
    configuration = configuration_vars(plan) | ({envfile.ARTIFACTS_VAR: str(artifacts.resolve())} if artifacts else {})
    unset = [v for v in TUNING_VARS if v not in shared]
    unset += [v for v in CONFIGURATION_VARS if v not in configuration and v != envfile.FORMAT_VAR]
    launch = ["# launch lines, as the trial ran them:"]
    for inst in plan.instances:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in inst.env.items())
        launch.append(f"#   instance {inst.index}: {' '.join(filter(None, (env, shlex.join(inst.command))))}")
    try:
        return envfile.render(f"study {study.study_name}, trial {trial.number}", comments, unset, shared,
                              configuration, launch)
    except envfile.EnvFileError as exc:
        raise ExportError(f"{exc}; rename what holds it and search again") from None


def recipe_comparison(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any] | None:
    """`trial` against the best expert recipe the study ran, in the search's own measurements:
    both speedups over the baseline and their ratio (None when no recipe completed)."""
    speedup = speedup_attr(study.user_attrs.get("objective", "latency"))
    recipe = references.best_recipe(study, speedup)
    if recipe is None or speedup not in trial.user_attrs:
        return None
    mine, theirs = (float(records.speedup(t, speedup, study.user_attrs) or 1.0) for t in (trial, recipe))
    return {"metric": "throughput" if speedup == "speedup_throughput" else "latency", "trial": trial.number,
            "speedup": mine, "recipe": recipe.user_attrs["recipe"], "recipe_trial": recipe.number,
            "recipe_speedup": theirs, "ratio": mine / theirs}


def versus_recipes(study: optuna.Study, trial: FrozenTrial) -> str:
    """`recipe_comparison` in words ("" when no recipe completed)."""
    found = recipe_comparison(study, trial)
    return recipe_words(found) if found else ""


def recipe_words(found: dict[str, Any]) -> str:
    """A `recipe_comparison` said in one line."""
    what, mine = found["metric"], found["speedup"]
    if found["recipe_trial"] == found["trial"]:
        return f"this is the best expert recipe the study ran ({found['recipe']}, {what} {mine:.2f}x)"
    return (f"best expert recipe: trial {found['recipe_trial']} ({found['recipe']}), {what} "
            f"{found['recipe_speedup']:.2f}x; trial {found['trial']} is {found['ratio']:.2f}x that (search "
            f"measurements; the confirmation tests the winner against this recipe in paired rounds)")


def confirmation_status(confirmation: dict[str, Any] | None, number: int) -> str:
    """In a few words, what the study's confirmation says of trial `number`."""
    if not confirmation:
        return "not confirmed"
    if confirmations.recommended(confirmation) != number:
        return f"not chosen: confirmation chose trial {confirmations.recommended(confirmation)}"
    if not confirmation["significant"]:
        return "baseline kept"
    if confirmation["winner_trial"] != number:
        return f"recommended: {_why_recommended(confirmation, number)}"
    return "confirmed"


def _why_recommended(confirmation: dict[str, Any], number: int) -> str:
    """Why a reference (the best expert recipe or peer) is recommended instead of the winner."""
    peer = confirmation.get("against_peer") or {}
    found, named = (peer, "the best peer") if peer.get("trial") == number else \
        (confirmation.get("against_recipe") or {}, "the best expert recipe")
    status = found.get("status")
    if status == "slower":
        return f"{named}, faster than the winner"
    if status == "undecided":
        return f"{named}, the better estimate (undecided after {found.get('rounds')} rounds)"
    if status == "ties":  # a verdict from before "equivalent" and "undecided" were told apart
        return "the simpler of two that tie"
    return "the simpler of two that are equivalent"


def _quality_lines(trial: FrozenTrial, confirmation: dict[str, Any] | None) -> list[str]:
    """What the trial's quality on the user's data was, in the search and, for the trial the
    confirmation recommended, on the confirmation's own held-out part."""
    said, verdict = [], confirmation or {}
    if isinstance(found := trial.user_attrs.get(records.QUALITY), dict):
        said.append(f"# quality on --eval-data (the search's held-out part): {quality.describe(found)}")
    rechecked = verdict.get("quality")
    if isinstance(rechecked, dict) and rechecked.get("trial") == trial.number:
        against = f": {rechecked['against_limit']}" if rechecked.get("against_limit") else ""
        said.append(f"# quality re-checked on the confirmation's held-out part: {quality.describe(rechecked)}{against}")
    return said


def _confirmation_lines(confirmation: dict[str, Any] | None, number: int) -> list[str]:
    status = confirmation_status(confirmation, number)
    if not confirmation:
        return [f"# {status}: this is the search's best single estimate; `autotune confirm` re-measures "
                "it against the baseline in interleaved rounds"]
    if confirmations.recommended(confirmation) != number:
        return [f"# note: confirmation chose trial {confirmations.recommended(confirmation)}; this file is "
                f"trial {number}"]
    if confirmation.get("quality_breach"):  # the winner's speed was confirmed, its quality was not
        return [f"# baseline exported: {confirmation['quality_breach']}"]
    said = [f"# confirmed: {confirmation['message']}" if confirmation["significant"]
            else f"# baseline exported: {confirmation['message']}"]
    if words := confirmations.outcomes(confirmation):
        said.append(f"# outcomes: {words}")
    per_bucket = confirmations.buckets_sentence(confirmation, number)
    return said + ([f"# {per_bucket}"] if per_bucket else [])


def _shared_env(envs: list[dict[str, str]]) -> dict[str, str]:
    """Variables every instance got with the same value (per-instance ones stay in launch lines)."""
    first = envs[0] if envs else {}
    return {k: v for k, v in first.items() if all(e.get(k) == v for e in envs)}


def configuration_vars(plan: LaunchPlan) -> dict[str, str]:
    """What autotune reads back (`envfile`): the model, its inputs, the backend and every other knob
    set, each once, and how the instances were launched (`AUTOTUNE_INSTANCES` is the knob's)."""
    config, bench, instances = plan.config, plan.bench, plan.instances
    knobs = {envfile.knob_var("backend"): config.text("backend")} | {
        envfile.knob_var(name): value_text(value) for name, value in config.values}
    return {
        envfile.MODEL_VAR: bench.model,
        envfile.BATCH_SIZE_VAR: str(bench.batch_size),
        **_input_vars(bench),
        **({envfile.EXAMPLE_INPUTS_VAR: bench.example_inputs} if bench.example_inputs else {}),
        **({envfile.TOLERANCE_VAR: str(bench.tolerance)} if bench.tolerance is not None else {}),
        **({envfile.CALIBRATION_VAR: str(bench.calibration_batches)}
           if bench.calibration_batches is not None and config.text("precision") == "int8" else {}),
        **knobs,
        envfile.BINDING_VAR: plan.binding,
        envfile.INSTANCE_CPUS_VAR: ";".join(",".join(map(str, i.cpus)) for i in instances),
        envfile.INSTANCE_NODES_VAR: ";".join("" if i.numa_node is None else str(i.numa_node) for i in instances),
    }


def _input_vars(bench: BenchSpec) -> dict[str, str]:
    """The inputs' shape: a transformers model's tokens per item and head, another model's item shape."""
    if hf.is_source(bench.model) and bench.buckets:
        return {envfile.SEQ_LENS_VAR: bench.buckets.text(), envfile.SEQ_LEN_WEIGHTS_VAR: bench.buckets.weights_text(),
                envfile.TASK_VAR: bench.task}
    if hf.is_source(bench.model) and bench.task == hf.GENERATE:  # its item: a prompt and the tokens generated
        return {envfile.SEQ_LEN_VAR: str(bench.item_shape[0]), envfile.NEW_TOKENS_VAR: str(bench.item_shape[1]),
                envfile.TASK_VAR: bench.task}
    if hf.is_source(bench.model):
        return {envfile.SEQ_LEN_VAR: str(bench.item_shape[0]), envfile.TASK_VAR: bench.task}
    return {envfile.INPUT_SHAPE_VAR: "x".join(map(str, bench.item_shape))}


def host_class_of(trial: FrozenTrial) -> str:
    """The class id of the host that measured the trial (machine.class_id), the class its env
    file is for; "unknown" in a study recorded before host classes."""
    return str(trial.user_attrs.get(records.HOST_CLASS, "unknown"))


def _measured_on(trial: FrozenTrial, confirmation: dict[str, Any] | None) -> str:
    said = f"trial {trial.number} was measured on host {trial.user_attrs.get('host', 'unknown')}"
    if confirmation and confirmations.recommended(confirmation) == trial.number and "host" in confirmation:
        said += f", confirmed on host {confirmation['host']} (class {confirmation['host_class']})"
    return said + "; on hosts of another class, search there"


def _host(host: dict[str, Any]) -> str:
    if not host:
        return "unknown"
    return (f"{host.get('cpu_model')}, {host.get('usable_physical_cores')} usable physical cores, "
            f"torch {host.get('torch')}, autotune {host.get('autotune')}")


def write(path: Path, text: str) -> None:
    """Atomically: the file is complete or not there at all."""
    if path.is_dir():
        raise ExportError(f"cannot write {path}: it is a directory; give a file name like best.env")
    try:
        write_atomically(path, text)
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror}; choose a writable location") from None


def read(path: Path) -> EnvFile:
    """Parse a file written by `render` (export and unset lines; comments ignored)."""
    try:
        parsed = envfile.read(path)
    except envfile.EnvFileError as exc:
        raise ExportError(str(exc)) from None
    try:
        requests.exported_request(parsed.env)
    except AutotuneError as exc:
        raise ExportError(f"{path}: {exc}") from None
    return _env_file(path, parsed.env, parsed.unset)


def _env_file(path: Path, env: dict[str, str], unset: tuple[str, ...]) -> EnvFile:
    instances = envfile.knob_var("instances")  # unset: one process, unbound
    try:
        count = int(env.get(instances, "1"))
        cpus = tuple(tuple(int(c) for c in group.split(",") if c)
                     for group in env.get(envfile.INSTANCE_CPUS_VAR, "").split(";"))
        nodes = tuple(int(n) if n else None for n in env.get(envfile.INSTANCE_NODES_VAR, "").split(";"))
    except ValueError:
        raise ExportError(f"{path}: AUTOTUNE_INSTANCE_* values are damaged; export it again") from None
    if len(cpus) != count or len(nodes) != count:
        raise ExportError(f"{path}: {instances}={count} does not match the CPU lists; export it again")
    binding = env.get(envfile.BINDING_VAR, "none")
    if binding not in get_args(Binding):
        raise ExportError(f"{path}: {envfile.BINDING_VAR}={binding!r} is not a binding autotune makes; export it again")
    return EnvFile(env, unset, count, cpus, nodes, cast(Binding, binding))
