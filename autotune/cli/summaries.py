"""What `search`, `compare` and `export` report, as plain data: the bodies of their `--json`
documents (`display.json_document` adds `kind` and `schema_version`). The numbers are the ones the
study stores and the tables print; nothing is measured or recomputed here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.cli.common import EXIT_FAILED, EXIT_OK
from autotune.deploy import export
from autotune.measure.objectives import Metric, unit_of
from autotune.measure.stats import Interval, PairedComparison, RegressionCheck, median
from autotune.model import envfile
from autotune.search import warm
from autotune.search.rounds import Rounds
from autotune.study import confirmations, efficiency, quality_records, records
from autotune.study.storage import shown

# What each best trial reports besides its number, configuration and values.
TRIAL_METRICS = ("latency_p50_ms", "latency_p90_ms", "throughput_ips", "peak_rss_mb")
SPEEDUPS = ("speedup_latency", "speedup_throughput")


def trial(found: FrozenTrial, study_attrs: dict[str, Any]) -> dict[str, Any]:
    """One trial as the tables show it: knobs, parameters, objective values, metrics, and speedups
    over the baseline as the study knows it now (`records.speedup`)."""
    attrs = found.user_attrs
    return {"number": found.number, "config": attrs.get("config", ""), "params": dict(found.params),
            "values": list(found.values or ()), "recipe": attrs.get("recipe"),
            **{key: attrs.get(key) for key in TRIAL_METRICS},
            **{key: records.speedup(found, key, study_attrs) for key in SPEEDUPS},
            "quality": attrs.get(records.QUALITY), "feasible": attrs.get("feasible", True)}


def search(study: optuna.Study, storage: str, best: list[FrozenTrial], stopped: str,
           confirmed_now: bool, cost: dict[str, Any] | None = None) -> dict[str, Any]:
    """The end of a search: the study, its best trials, the winner against the best expert recipe,
    what it cost, why it stopped early, the confirmation verdict the study holds, and, when this
    run confirmed, what the confirmation cost of it (`confirmation_cost`)."""
    attrs = study.user_attrs
    return {"study": study.study_name, "storage": shown(storage), "objective": attrs.get("objective"),
            "model": attrs.get("model"), "batch_size": attrs.get("batch_size"),
            "trials": {"finished": records.finished(study), "total": len(study.get_trials(deepcopy=False)),
                       "distinct_configurations": records.distinct_configs(study)},
            "best": [trial(t, attrs) for t in best],
            "versus_recipes": export.recipe_comparison(study, best[0]) if best else None,
            "accounting": attrs.get("accounting"), "stopped": stopped or None,
            "confirmation": attrs.get("confirmation"), "confirmations": confirmations.count(attrs),
            "confirmed_now": confirmed_now, "confirmation_cost": cost,
            "baseline_remeasured": records.remeasured_baselines(attrs),
            "efficiency": efficiency.of_recommended(study),
            "speed_vs_quality": [trial(t, attrs) for t in quality_records.quality_front(study)],
            "max_quality_drop": attrs.get("max_quality_drop"),
            "warm_start": warm.summary(study.get_trials(deepcopy=False), best[0] if best else None)}


def confirmation_cost(verdict: dict[str, Any], command_s: float) -> dict[str, Any]:
    """What a search's confirmation took: its rounds of the cap, the look it stopped at and why
    (`stopped_by`: decided, cap, time), the noisy runs it ran again, its wall time, and its share
    of the command's `command_s` (the whole search, the confirmation included)."""
    wall_s = float(verdict.get("wall_s") or 0.0)
    return {"rounds": verdict["rounds"], "rounds_cap": verdict.get("rounds_cap"), "look": verdict.get("look"),
            "looks": len(verdict.get("looks") or []), "stopped_by": verdict.get("stopped_by"),
            "noisy_reruns": verdict.get("noisy_reruns", 0), "wall_s": round(wall_s, 1),
            "command_s": round(command_s, 1), "share": round(wall_s / command_s, 3) if command_s > 0 else None}


def comparison(measured: Rounds, metric: Metric, result: PairedComparison | None) -> dict[str, Any]:
    """`compare`: both contenders with their per-round values, the running orders, and the paired
    comparison of the second against the first (None, with the reason, when none could be made)."""
    body: dict[str, Any] = {
        "metric": metric, "unit": unit_of(metric), "seed": measured.seed,
        "contenders": [_contender(measured, position) for position in range(len(measured.contenders))],
        "orders": [list(order) for order in measured.orders], "comparison": None, "reason": ""}
    if result is None:
        failed = next((r for series in measured.runs for r in series if r.value is None), None)
        body["reason"] = f"a run failed ({failed.reason})" if failed else "not enough rounds to compare"
        return body
    body["comparison"] = {"speedup": result.speedup, "p_value": result.p_value, "significant": result.significant,
                          "rounds": result.rounds, "min_effect": result.min_effect,
                          "interval": _interval(result.interval)}
    return body


def _interval(interval: Interval) -> dict[str, Any]:
    return {"low": interval.low, "high": interval.high, "label": interval.label, "coverage": interval.coverage}


def gate(check: RegressionCheck | None, margin: float) -> dict[str, Any]:
    """`compare --fail-if-slower`: the two-sided verdict and its numbers (None: a run failed)."""
    verdict = {"margin": margin, "failed": check is None or check.slower_than_margin, "exit_code": EXIT_FAILED}
    if check is None:
        return verdict | {"reason": "a run failed, so there is no verdict"}
    return verdict | {"exit_code": EXIT_FAILED if check.slower_than_margin else EXIT_OK, "speedup": check.speedup,
                      "p_value": check.p_value, "difference_p_value": check.difference_p, "rounds": check.rounds,
                      "test": "two-sided exact sign test, H0: the second's median is exactly `margin` slower",
                      "interval": _interval(check.interval)}


def _contender(measured: Rounds, position: int) -> dict[str, Any]:
    contender = measured.contenders[position]
    runs = measured.runs[position]
    ran = [r.value for r in runs if r.value is not None]
    return {"position": position, "label": contender.label, "trial": contender.trial,
            "config": contender.plan.config.describe(), "median": median(ran) if ran else None,
            "runs_ok": len(ran), "values": [r.value for r in runs], "p90_ms": [r.p90_ms for r in runs],
            "failures": [r.reason for r in runs if r.value is None]}


def exported(path: Path, study: optuna.Study, chosen: FrozenTrial, text: str,
             artifacts: Path | None) -> dict[str, Any]:
    """`export`: where it wrote which trial, the variables the file sets and unsets, and what the
    study's confirmation says of that trial."""
    parsed = envfile.parse(text)
    confirmation = study.user_attrs.get("confirmation")
    return {"path": str(path), "study": study.study_name, "trial": chosen.number,
            "config": chosen.user_attrs.get("config", ""), "env": parsed.env, "unset": list(parsed.unset),
            "artifacts": str(artifacts) if artifacts else None, "host_class": export.host_class_of(chosen),
            "confirmation": {"status": export.confirmation_status(confirmation, chosen.number),
                             "number": confirmations.number(study.user_attrs),
                             "of": confirmations.count(study.user_attrs),
                             "message": confirmation["message"] if confirmation else None}}
