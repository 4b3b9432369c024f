"""What a study and its trials record (Optuna user attributes), written here and read back here.

The study records what it was made for and on which host; each trial records its configuration,
the plan it ran, its metrics or the reason it failed. Readers (confirmation, export, display) ask
this module, so an attribute's name and meaning have one owner.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import INTERRUPTED_BY
from autotune.config.knobs import identity_of
from autotune.measure.objectives import Metric
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import Measurement
from autotune.measure.results import STDERR_TAIL_CHARS, RunResult

FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
# Why a trial failed (`fail_cause`), which decides whether its configuration is worth running again:
CUT_SHORT = "cut_short"  # the user or a killed autotune stopped it: says nothing, always run again
KILLED = "killed"  # ended by a signal (a crash, or the kill of a timeout): run again once
ERROR = "error"  # wrong answers, an exception, an exit code: the configuration's own, reused
CANNOT_RUN = "cannot_run"  # no launch plan here (threads x instances above the cores, a library missing): never run
UNDECIDED = "undecided"  # stopped early on a noisy window: measured again later (study/undecided.py)
UNDECIDED_FINAL = "undecided_final"  # a trial's: its configuration's last attempt, undecided for good
KILLED_RERUNS = 1
LEGACY_CUT_SHORT = (INTERRUPTED_BY, "left running by")  # trials from before fail_cause
SKIPPED = "not_compiled"  # a trial's: pruned before it ran, its compile predicted to lose
SKIPPED_ON = "not_compiled_on"  # a skipped trial's: what its prediction read (compile_skip.Evidence.mark)
HOST_CLASS = "host_class"  # a trial's: the class id of the host that ran it (fleet.py owns the study's)
WRONG_ANSWERS = "wrong_answers"  # a failed trial's: its converted model failed the guard (`wrong_models`)
QUALITY, QUALITY_KEY = "quality", "quality_key"  # a trial's quality on the user's data, and what it is of
# On the study, + a host's name: the reference that host's speedups are over (fleet.py writes it),
# whether it was measured on a noisy window, and, once it was measured again (search/loop.py, by
# study/undecided.py's rule), `remeasured`: what it was, every attempt, and whether one was quiet
# (then the reference is that one, and every trial's speedup reads over it: `speedup`).
HOST_BASELINE = "host_baseline:"


def baseline(study: optuna.Study, klass: str | None = None) -> FrozenTrial | None:
    """The completed baseline trial (of host class `klass`, when given: one per class)."""
    return next((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if t.user_attrs.get("baseline") and klass in (None, t.user_attrs.get(HOST_CLASS, klass))), None)


def finished(study: optuna.Study) -> int:
    """The trials that count toward --trials (`counted`)."""
    return len(counted(study.get_trials(deepcopy=False)))


def counts(trial: FrozenTrial) -> bool:
    """A trial may count toward --trials once finished, unless cut short (Ctrl-C, a killed
    autotune: it runs again), a configuration this machine cannot run (`CANNOT_RUN`: no plan, so
    nothing ran), pruned before compiling (`SKIPPED`) or stopped on a noisy window with a retry left
    (`awaits_retry`): none of them decided anything, so none takes a trial of --trials, as a
    proposal that repeats a measured configuration never becomes one."""
    return (trial.state in FINISHED and fail_cause(trial) not in (CUT_SHORT, CANNOT_RUN)
            and not trial.user_attrs.get(SKIPPED) and not awaits_retry(trial))


def awaits_retry(trial: FrozenTrial) -> bool:
    """Stopped early on a noisy window with a retry left: measured again later (study/undecided.py)."""
    return fail_cause(trial) == UNDECIDED and not trial.user_attrs.get(UNDECIDED_FINAL)


def counted(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The trials of `trials` that count toward --trials: those that `counts`, less the failed ones
    whose configuration a later trial measured again (`measured_again`: a crash's rerun is the
    configuration's trial, the crash is shown as what the rerun retried). So --trials N runs N
    distinct configurations."""
    again = measured_again(trials)
    return [t for t in trials if counts(t) and t.number not in again]


def measured_again(trials: Sequence[FrozenTrial]) -> set[int]:
    """Failed trials (not cut short) whose configuration, batch size and settings a later trial
    measured, or measures now (RUNNING): a KILLED one's rerun (`KILLED_RERUNS`), a failed
    baseline's next baseline."""
    latest: dict[tuple[str, Any, Any], int] = {}
    for t in trials:
        if "config" in t.user_attrs and not is_duplicate(t) and (t.state == TrialState.RUNNING or counts(t)):
            latest[_key(t.user_attrs)] = max(latest.get(_key(t.user_attrs), -1), t.number)
    return {t.number for t in trials if _failed_run(t) and latest.get(_key(t.user_attrs), -1) > t.number}


def mark_rerun(trial: optuna.Trial, trials: Sequence[FrozenTrial]) -> int | None:
    """`trial`, about to measure its configuration, measures again the latest earlier failed trial
    of it (`measured_again`'s rule): recorded as its `retry_of`, and returned (None: none)."""
    key = _key(trial.user_attrs)
    earlier = [t.number for t in trials if _failed_run(t) and _key(t.user_attrs) == key and t.number < trial.number]
    if not earlier:
        return None
    trial.set_user_attr("retry_of", earlier[-1])
    return earlier[-1]


def _failed_run(trial: FrozenTrial) -> bool:
    return (trial.state == TrialState.FAIL and fail_cause(trial) != CUT_SHORT and not is_duplicate(trial)
            and "config" in trial.user_attrs)


def _key(attrs: Mapping[str, Any]) -> tuple[str, Any, Any]:
    """What a rerun shares with the trial it retries: the configuration's launch, batch size, settings."""
    return identity_of(str(attrs.get("config"))), attrs.get("batch_size"), attrs.get("settings_digest")


def best_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The best trial (single objective) or the Pareto front (two objectives), best first."""
    if len(study.directions) > 1:
        return sorted(study.best_trials, key=lambda t: t.values[0])
    completed = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if t.user_attrs.get("feasible", True)]
    reverse = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return sorted(completed, key=lambda t: t.values[0], reverse=reverse)


def best_measured(study: optuna.Study) -> list[FrozenTrial]:
    """The best trials that measured their own configuration (no reused duplicates)."""
    return [t for t in best_trials(study) if not is_duplicate(t)]


def distinct_configs(study: optuna.Study) -> int:
    """Distinct (configuration, batch size) among the trials that count toward --trials, the
    baseline included."""
    return len({(_identity(t), t.user_attrs.get("batch_size"))
                for t in counted(study.get_trials(deepcopy=False)) if "config" in t.user_attrs})


def record_end(study: optuna.Study, ended: dict[str, Any]) -> None:
    """What ended a search before `--trials` (the time budget), with its numbers: `ended_by`."""
    study.set_user_attr("ended_by", dict(ended))


def speedup_key(metric: Metric) -> str:
    """The trial attribute holding its speedup over the baseline in `metric`."""
    return "speedup_latency" if metric == "latency_p50_ms" else "speedup_throughput"


def speedup(trial: FrozenTrial, key: str, study_attrs: Mapping[str, Any]) -> float | None:
    """The trial's speedup (`key`: speedup_latency or speedup_throughput) over its host's baseline
    as the study knows it now: over the quiet re-measure when that baseline was measured again, else
    as the trial recorded it (the reference it was measured against); None when it recorded none."""
    recorded = trial.user_attrs.get(key)
    reference = quiet_baseline(study_attrs, str(trial.user_attrs.get("host")))
    if recorded is None or reference is None or trial.user_attrs.get("baseline"):
        return None if recorded is None else float(recorded)
    if key == "speedup_throughput":
        return round(float(trial.user_attrs["throughput_ips"]) / float(reference["throughput_ips"]), 4)
    return round(float(reference["latency_p50_ms"]) / float(trial.user_attrs["latency_p50_ms"]), 4)


def quiet_baseline(study_attrs: Mapping[str, Any], host: str) -> Mapping[str, Any] | None:
    """A host's baseline when it was measured on a noisy window and again on a quiet one: the
    reference its speedups read over (None: its baseline trial's, or the one it first measured)."""
    reference = study_attrs.get(HOST_BASELINE + host) or {}
    return reference if (reference.get("remeasured") or {}).get("quiet") else None


def remeasured_baselines(study_attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Per host, its baseline's quiet re-measure ({} when none was measured again)."""
    return {key[len(HOST_BASELINE):]: value["remeasured"] for key, value in study_attrs.items()
            if key.startswith(HOST_BASELINE) and isinstance(value, dict) and value.get("remeasured")}


def is_duplicate(trial: FrozenTrial) -> bool:
    return "duplicate_of" in trial.user_attrs


def replicate_values(trial: FrozenTrial, metric: Metric) -> list[float]:
    """The metric of each replicate (fresh process) the trial ran, as it recorded them."""
    key = "replicate_p50_ms" if metric == "latency_p50_ms" else "replicate_throughput_ips"
    return [float(v) for v in trial.user_attrs.get(key, [])]


def plan_of(trial: FrozenTrial) -> LaunchPlan:
    """The plan a trial ran, exactly as it recorded it."""
    return LaunchPlan.from_json(trial.user_attrs["plan"])


def _identity(trial: FrozenTrial) -> str:
    """What the trial's configuration launches (`Config.identity`): the key every dedupe uses."""
    return identity_of(str(trial.user_attrs.get("config")))


def identity(trial: FrozenTrial) -> tuple[str, int]:
    """(config, batch size): what a trial measures, as proposals and `measured_configs` name it."""
    return _identity(trial), int(trial.user_attrs.get("batch_size", 0))


def same_config(study: optuna.Study, number: int, config: str, batch: int, digest: str) -> FrozenTrial | None:
    """The earlier trial whose result this configuration reuses (None: measure it). Only trials that
    measured it under the same settings count, never one cut short nor one skipped on a prediction
    (`SKIPPED`: a prediction is not a measurement); a killed one counts once it was run again
    KILLED_RERUNS times, and then the latest outcome is reused."""
    finished = study.get_trials(deepcopy=False, states=FINISHED)
    ran = [t for t in _measured(finished, digest) if _identity(t) == config and t.number != number
           and t.user_attrs.get("batch_size", batch) == batch]
    return _reused(ran)


def measured_configs(trials: Sequence[FrozenTrial], digest: str) -> set[tuple[str, int]]:
    """(config, batch size) of every configuration among `trials` whose result a new trial would
    reuse: a search never proposes these again. The same rule as `same_config`."""
    groups: dict[tuple[str, int], list[FrozenTrial]] = {}
    for t in _measured(trials, digest):
        groups.setdefault(identity(t), []).append(t)
    baselines = {identity(t) for t in trials
                 if t.state == TrialState.COMPLETE and t.user_attrs.get("baseline")
                 and t.user_attrs.get("settings_digest") == digest}
    return {key for key, ran in groups.items() if _reused(ran) is not None} | baselines


def _measured(trials: Sequence[FrozenTrial], digest: str) -> list[FrozenTrial]:
    """Finished trials that measured a configuration under these settings: not cut short, not
    skipped on a prediction (which measured nothing) and not waiting for the retry of a noisy stop."""
    return [t for t in trials if t.state in FINISHED
            and t.user_attrs.get("settings_digest") == digest and "config" in t.user_attrs
            and not t.user_attrs.get("baseline") and not is_duplicate(t) and fail_cause(t) != CUT_SHORT
            and not t.user_attrs.get(SKIPPED) and not awaits_retry(t)]


def _reused(ran: list[FrozenTrial]) -> FrozenTrial | None:
    """Among trials of one configuration: the settled one, or the last once killed runs were retried."""
    settled = [t for t in ran if fail_cause(t) != KILLED]
    if settled:
        return settled[0]
    return ran[-1] if len(ran) > KILLED_RERUNS else None


def fail_cause(trial: FrozenTrial) -> str | None:
    """CUT_SHORT, KILLED or ERROR for a failed trial (None otherwise); read from the text for
    trials recorded before causes were."""
    if trial.state != TrialState.FAIL:
        return None
    if "fail_cause" in trial.user_attrs:
        return str(trial.user_attrs["fail_cause"])
    return CUT_SHORT if str(trial.user_attrs.get("fail_reason", "")).startswith(LEGACY_CUT_SHORT) else ERROR


def copy_result(trial: optuna.Trial, duplicate: FrozenTrial) -> None:
    """A duplicate trial carries the earlier one's records and intermediate values."""
    for key, value in duplicate.user_attrs.items():
        if key not in ("host", "pid", "baseline", HOST_CLASS, "retry_of"):
            trial.set_user_attr(key, value)
    trial.set_user_attr("duplicate_of", duplicate.number)
    for step, value in duplicate.intermediate_values.items():
        trial.report(value, step)


def end_reason(trial: FrozenTrial) -> str:
    return str(trial.user_attrs.get("prune_reason") or trial.user_attrs.get("fail_reason", ""))


def record_plan(trial: optuna.Trial, plan: LaunchPlan) -> None:
    trial.set_user_attr("plan", plan.to_json())
    for inst in plan.instances:  # readable in optuna-dashboard, which truncates long JSON values
        trial.set_user_attr(f"instance_{inst.index}_env", " ".join(f"{k}={v}" for k, v in inst.env.items()))
        trial.set_user_attr(f"instance_{inst.index}_command", shlex.join(inst.command))


def record_failure(trial: optuna.Trial, reason: str, cause: str, stderr_tail: str = "") -> None:
    trial.set_user_attr("status", "failed")
    trial.set_user_attr("fail_reason", reason)
    trial.set_user_attr("fail_cause", cause)
    if stderr_tail:
        trial.set_user_attr("stderr_tail", stderr_tail[-STDERR_TAIL_CHARS:])


def record_failed_run(trial: optuna.Trial, measurement: Measurement) -> None:
    failed = next(r for r in measurement.runs if not r.ok)
    tail = next((i.stderr_tail for i in failed.instances if not i.ok and i.stderr_tail), "")
    record_failure(trial, measurement.reason, _run_cause(failed), tail)
    trial.set_user_attr("instances", failed.summary()["instances"])
    if answered_wrong(measurement):
        trial.set_user_attr(WRONG_ANSWERS, True)


def answered_wrong(measurement: Measurement) -> bool:
    """Whether a failed measurement's model failed the guard: an instance of its failed run answered
    differently from eager fp32 (whatever stopped the others: the verdict is on the model)."""
    return any(i.wrong_answers for i in next(r for r in measurement.runs if not r.ok).instances)


def _run_cause(failed: RunResult) -> str:
    """KILLED when every failed instance died of a signal (the orchestrator kills a timed-out or
    stopped instance with SIGKILL); an exit code, an error result or a failed start is ERROR."""
    codes = [i.returncode for i in failed.instances if not i.ok]
    return KILLED if codes and all(code is not None and code < 0 for code in codes) else ERROR


def failure_cause(measurement: Measurement) -> str:
    """KILLED or ERROR for a measurement with a failed run."""
    return _run_cause(next(r for r in measurement.runs if not r.ok))


def record_pruned(trial: optuna.Trial, reason: str) -> None:
    trial.set_user_attr("status", "pruned")
    trial.set_user_attr("prune_reason", reason)


def not_compiled(trials: Sequence[FrozenTrial]) -> int:
    """How many of `trials` were pruned before compiling (`record_skipped`)."""
    return sum(bool(t.user_attrs.get(SKIPPED)) for t in trials)


def not_compiled_configs(trials: Sequence[FrozenTrial], digest: str) -> int:
    """How many distinct (config, batch size) among `trials` were skipped on a prediction under
    these settings and never measured."""
    skipped = {identity(t) for t in trials
               if t.user_attrs.get(SKIPPED) and t.user_attrs.get("settings_digest") == digest}
    return len(skipped - measured_configs(trials, digest))


def record_skipped(trial: optuna.Trial, reason: str, evidence: str) -> None:
    """Pruned before it ran: its compile was predicted to lose (compile_skip.skip_compile), on
    `evidence` (what the prediction read, compile_skip.Evidence.mark)."""
    record_pruned(trial, reason)
    trial.set_user_attr(SKIPPED, True)
    trial.set_user_attr(SKIPPED_ON, evidence)



def record_metrics(trial: optuna.Trial, measurement: Measurement, reference: Mapping[str, float] | None) -> None:
    """The trial's metrics, and its speedups over `reference`: its own host's baseline (None: the
    trial is that baseline)."""
    summary = measurement.summary()
    trial.set_user_attr("status", "ok")
    for key, value in summary.items():
        trial.set_user_attr(key, value)
    speedups = (1.0, 1.0) if reference is None else (
        reference["latency_p50_ms"] / measurement.latency_p50_ms,
        measurement.throughput_ips / reference["throughput_ips"])
    trial.set_user_attr("speedup_latency", round(speedups[0], 4))
    trial.set_user_attr("speedup_throughput", round(speedups[1], 4))
    trial.set_user_attr("instances", measurement.runs[-1].summary()["instances"])
    trial.set_user_attr("first_call_s", first_call(measurement))
    work = next((inst.metrics["setup"]["flops_per_item"] for run in measurement.runs for inst in run.instances
                 if "flops_per_item" in inst.metrics.get("setup", {})), None)
    if work:
        trial.set_user_attr("flops_per_item", work)  # the model's work, counted by the baseline's process


def first_call(measurement: Measurement) -> dict[str, float]:
    """Set-up costs never mixed into latency (`InstanceResult.setup_costs`: build, convert, compile,
    first forward, warm-up...), each the worst instance's."""
    costs: dict[str, float] = {}
    for run in measurement.runs:
        for inst in run.instances:
            for key, value in inst.setup_costs().items():
                costs[key] = round(max(costs.get(key, 0.0), value), 3)
    return costs


