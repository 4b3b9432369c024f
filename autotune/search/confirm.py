"""Confirmation: the top candidates and the baseline re-measured in interleaved rounds, as long
as the answer needs and no longer.

A search's best trial is the minimum of many noisy estimates, biased toward luck. Here each
contender runs once per round, every run a fresh process, in a random balanced order
(`rounds.py`), a run flagged noisy run again within its round. The rounds are looked at a few
times (`measure/sequential.py`): at each look the verdict (`verdict.py`) judges every candidate
against the baseline and the winner against the best expert recipe and the best peer (beats,
slower, equivalent or undecided), and the rounds stop as soon as every decision the
recommendation depends on is made, or go on to the next look, up to the cap (`--rounds`) and, in
a search with a time budget, its share of it. The error rates hold across the looks: each look
spends its own part of ALPHA.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import AutotuneError
from autotune.base.thresholds import ALPHA
from autotune.host.floor import Kept
from autotune.measure import quality, sequential
from autotune.measure.objectives import Limits, metric_of, min_rounds
from autotune.measure.replicates import SeriesRunner
from autotune.measure.runner import Series
from autotune.search import against_recipe, verdict
from autotune.search.rounds import Contender, Rounds, RunEvent, until_decided
from autotune.study import confirmations, records, references


class ConfirmError(AutotuneError):
    """Nothing to confirm or compare."""


def check_rounds(rounds: int, candidates: int, flag: str = "--rounds", top_flag: str = "--top") -> None:
    """Refuse a round count that can never be significant for this many candidates after Holm."""
    needed = min_rounds(candidates)
    if rounds < needed:
        smallest = f"1/{2**rounds}"
        raise ConfirmError(f"{flag} {rounds} can never reach significance for {candidates} candidate(s): the "
                           f"smallest one-sided signed-rank p is {smallest}, and Holm's correction asks for "
                           f"p < {ALPHA}/{candidates}; use {flag} {needed} or more, or a smaller {top_flag}")


def candidates(study: optuna.Study, top: int) -> tuple[FrozenTrial, list[FrozenTrial]]:
    """The baseline and the best `top` distinct completed configurations."""
    base = records.baseline(study)
    if base is None:
        raise ConfirmError(f"study {study.study_name!r} has no completed baseline trial; run `autotune search`")
    seen: set[str] = set()
    chosen = []
    for trial in records.best_measured(study):
        config = str(trial.user_attrs.get("config"))
        if trial.user_attrs.get("baseline") or config in seen:
            continue
        if trial.state == TrialState.COMPLETE and "plan" in trial.user_attrs:
            seen.add(config)
            chosen.append(trial)
    return base, chosen[:top]


def confirm(study: optuna.Study, top: int, rounds: int, min_effect: float, timeout_s: float,
            on_run: Callable[[RunEvent], None], runner: SeriesRunner | None = None, seed: int | None = None,
            ran_on: Mapping[str, str] | None = None, time_limit_s: float | None = None,
            clock: Callable[[], float] = time.monotonic, floor: float | Kept | None = None) -> dict[str, Any]:
    """Re-measure, decide, and store the verdict on the study (user attribute `confirmation`):
    rounds up to `rounds` (the cap), stopping at the first look that decides (past the first look, none
    starts that would end after `time_limit_s`); `ran_on` is the host that measured it
    (`machine.host_identity`), recorded in the verdict; `floor`: this host's spread floor
    (host/floor.py), against which a run is flagged noisy and run again: the kept one is read before
    each round and taught each undisturbed run (`rounds.until_decided`)."""
    check_rounds(rounds, top)
    base, chosen = candidates(study, top)
    metric = metric_of(str(study.user_attrs.get("objective", "latency")))
    recipe, peer = against_recipe.best_recipe(study, metric), against_recipe.best_peer(study, metric)
    contenders = [Contender(f"trial {t.number}", records.plan_of(t), t.number) for t in chosen]
    contenders += [Contender(f"trial {t.number} ({'peer' if references.is_peer(t) else 'recipe'})",
                             records.plan_of(t), t.number) for t in extra_references(study, chosen)]
    reference = Contender(f"trial {base.number} (baseline)", records.plan_of(base), base.number)
    limits = Limits.of_study(study.user_attrs)
    plan = sequential.design(rounds, max(len(chosen), 1))

    def judged(measured: Rounds | None, look: sequential.Look) -> dict[str, Any]:
        return verdict.decide(base, chosen, measured, metric, plan, look, min_effect, limits, recipe, peer)

    if not chosen:
        return confirmations.record(study, {**judged(None, plan.looks[-1]), **(ran_on or {})})
    stopped = until_decided([reference, *contenders], plan, metric, timeout_s, runner or Series(), on_run,
                                lambda measured, look: bool(judged(measured, look)["decided"]), seed, time_limit_s,
                                clock, floor)
    found = judged(stopped.rounds, stopped.look)
    found.update(stopped_by=stopped.by, wall_s=round(stopped.wall_s, 1), **(ran_on or {}))
    found.update(recheck_quality(study, found, base, limits, timeout_s))
    return confirmations.record(study, found)


def recheck_quality(study: optuna.Study, found: Mapping[str, Any], base: FrozenTrial, limits: Limits,
                    timeout_s: float) -> dict[str, Any]:
    """With --eval-data: the recommended trial judged again on the confirmation's own held-out part
    (never seen by the search). One over --max-quality-drop there is not recommended: the defaults are,
    and the verdict says why."""
    number = found.get("recommended_trial")
    if number is None or number == base.number:
        return {}
    trial = study.get_trials(deepcopy=False)[int(number)]
    plan = records.plan_of(trial)
    if not plan.bench.judged:
        return {}
    figures = quality.measure(plan, "confirm", timeout_s)
    breach = replace(limits, latency_p90_ms=None, tpot_p90_ms=None).breach(
        {"quality_drop": quality.drop_of(figures)})
    drop_limit = limits.quality_drop
    said = {} if drop_limit is None else {"against_limit": quality.against_limit(figures, drop_limit)}
    rechecked = {"quality": {"trial": int(number), **figures, "within_limit": not breach, **said}}
    if not breach:
        return rechecked
    return rechecked | {"recommended_trial": base.number,
                        "quality_breach": f"trial {number} {breach} on the confirmation's held-out part of "
                                          f"--eval-data, so the defaults stay recommended"}


def extra_references(study: optuna.Study, chosen: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The best expert recipe and the best peer that the confirmation runs beside the candidates
    (those that are not among them)."""
    metric = metric_of(str(study.user_attrs.get("objective", "latency")))
    found = (against_recipe.best_recipe(study, metric), against_recipe.best_peer(study, metric))
    return [t for t in found if t is not None and verdict.position(chosen, t) is None]
