"""`autotune compare`: two contenders (trials, env files or knobs) in the confirmation's
interleaved rounds (rounds.interleave), the second against the first, one-sided for a gain or,
as a regression gate, two-sided for a slowdown past a margin."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import optuna
from optuna.trial import TrialState

from autotune.config.knobs import Config
from autotune.measure import stats
from autotune.measure.objectives import Metric
from autotune.measure.plan import LaunchPlan
from autotune.measure.stats import PairedComparison
from autotune.search.confirm import ConfirmError
from autotune.search.rounds import Contender, Rounds, paired, speedups
from autotune.study import records


def compared(measured: Rounds, metric: Metric, min_effect: float) -> PairedComparison | None:
    """`compare`: the second contender against the first, only when every run of both succeeded."""
    if any(r.value is None for series in measured.runs for r in series):
        return None
    return paired(measured.values(0), measured.values(1), metric, min_effect)


def distinct(contenders: Sequence[Contender]) -> list[Contender]:
    """Labels a reader can tell apart: a configuration compared with itself is '#1' and '#2'."""
    labels = [c.label for c in contenders]
    if len(set(labels)) == len(labels):
        return list(contenders)
    return [replace(c, label=f"{c.label} #{i + 1}") for i, c in enumerate(contenders)]


def is_configuration(spec: str) -> bool:
    """A `compare` operand written as knobs: `defaults`, or `KNOB=VALUE` pairs joined by commas."""
    return spec == "defaults" or ("=" in spec and not spec.endswith(".env") and "/" not in spec)


def configuration(spec: str) -> Config:
    """`defaults` or `backend=inductor,precision=bf16` as a Config (the same rules as `--set`)."""
    return Config() if spec == "defaults" else Config.from_assignments(part for part in spec.split(",") if part)


def contender_from(spec: str, study: Callable[[], optuna.Study],
                   plan_env_file: Callable[[str], LaunchPlan],
                   plan_config: Callable[[Config], LaunchPlan] | None = None) -> Contender:
    """`compare` operands: a trial number of the study, knobs (`defaults`, `K=V,K=V`, planned by
    `plan_config`), or an env file written by `autotune export`."""
    if is_configuration(spec):
        if plan_config is None:
            raise ConfirmError(f"{spec!r} is a configuration; comparing configurations needs --model")
        return Contender(spec, plan_config(configuration(spec)))
    if spec.isdigit():
        loaded = study()
        trial = next((t for t in loaded.get_trials(deepcopy=False) if t.number == int(spec)), None)
        if trial is None or "plan" not in trial.user_attrs or trial.state != TrialState.COMPLETE:
            raise ConfirmError(f"trial {spec} of study {loaded.study_name!r} did not complete; compare completed "
                               f"trials or env files")
        return Contender(f"trial {spec}", records.plan_of(trial), trial.number)
    return Contender(spec, plan_env_file(spec))


def regression(measured: Rounds, metric: Metric, margin: float) -> stats.RegressionCheck | None:
    """`compare --fail-if-slower`: the second contender against the first, two-sided, only when
    every run of both succeeded (a failed run is no evidence either way)."""
    if any(r.value is None for series in measured.runs for r in series):
        return None
    ratios = speedups(measured.values(0), measured.values(1), metric)
    return stats.regression_check(ratios, margin) if len(ratios) >= 2 else None
