"""How close a trial comes to what this CPU can do: the model's work per item (counted once, by
the baseline's process, with torch's FLOP counter) times the trial's items/s, against this CPU's
one peak for the trial's precision: the most any runtime's probe kernel measured on the operation
the model spends its time in (`autotune.host.capabilities`), or a trial that computed more. "62% of
this CPU's measured int8 peak" says how much is left to find, whichever runtime the trial ran."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import ConfigError
from autotune.config.knobs import Config
from autotune.host.capabilities import precision_peak
from autotune.model.backends import RUNTIME_OF
from autotune.study import confirmations, records

WORK = "flops_per_item"  # the user attribute of the trial whose process counted it (the baseline)


def of_generation(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any] | None:
    """--task generate: the weights a decode step reads over its time per output token, against this
    CPU's measured memory bandwidth (the limit of decode at batch 1: every weight read once per step).
    None where the study kept no bandwidth or the trial no generation figures."""
    probe = study.user_attrs.get("probe") or {}
    found = trial.user_attrs.get("generation") or {}
    bandwidth, tpot, weights = probe.get("bandwidth_gbs"), found.get("tpot_p50_ms"), found.get("weight_bytes")
    if not bandwidth or not tpot or not weights:
        return None
    found_ttft = found.get("ttft_p50_ms")
    return bandwidth_fraction(trial.number, float(weights), float(tpot), float(bandwidth)) | (
        {"ttft_ms": round(float(found_ttft), 1)} if found_ttft else {})


def bandwidth_fraction(trial: int, weight_bytes: float, tpot_ms: float, bandwidth_gbs: float) -> dict[str, Any]:
    """A decode step's weight traffic (GB/s) and its fraction of `bandwidth_gbs`, with the ceiling it implies."""
    read = weight_bytes / (tpot_ms / 1e3) / 1e9
    return {"trial": trial, "weight_gb": round(weight_bytes / 1e9, 3), "tpot_ms": round(tpot_ms, 2),
            "read_gbs": round(read, 1), "bandwidth_gbs": round(bandwidth_gbs, 1),
            "fraction": round(read / bandwidth_gbs, 3),
            "ceiling_tokens_per_s": round(bandwidth_gbs * 1e9 / weight_bytes, 1)}


def of_trial(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any] | None:
    """`trial`'s achieved GOP/s and its fraction of its precision's peak on this machine (`peak`);
    None where the study kept no probe, or no process counted the model's work (a model with length
    buckets). A generating model's is its decode's share of the memory bandwidth (`of_generation`)."""
    if trial.user_attrs.get("generation"):
        return of_generation(study, trial)
    base = records.baseline(study)
    counted = base.user_attrs.get(WORK) if base is not None else None
    work = float(counted) if counted else 0.0
    achieved = _achieved(trial, work) if work else None
    if achieved is None:
        return None
    config = Config.from_description(str(trial.user_attrs.get("config", "defaults")))
    precision = config.text("precision")
    found = peak(study, precision, work)
    if found is None:
        return None
    return {"trial": trial.number, "runtime": RUNTIME_OF[config.text("backend")], "precision": precision,
            "gflop_per_item": round(work / 1e9, 3), "achieved_gops": round(achieved, 1), **found,
            "fraction": round(achieved / found["peak_gops"], 3),
            "bandwidth_gbs": (study.user_attrs.get("probe") or {}).get("bandwidth_gbs")}


def peak(study: optuna.Study, precision: str, work: float) -> dict[str, Any] | None:
    """This CPU's peak for `precision`: the most any runtime's probe kernel measured on the model's
    operation (`capabilities.precision_peak`), or, where a trial of this study computed more, that
    trial's GOP/s (a model's operations may run better than the probe's): so no share exceeds 100%,
    and the report and the search's summary set every trial of a precision against one figure."""
    probe = study.user_attrs.get("probe")
    if not probe:
        return None
    found = precision_peak(probe.get("peaks", {}), precision, probe.get("op", "conv"))
    measured = [(gops, t.number) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if _precision(t) == precision and (gops := _achieved(t, work)) is not None]
    best = max(measured, default=None)
    if found is not None and (best is None or best[0] <= float(found[1]["gops"])):
        runtime, _, op = found[0].split(":")
        kernel = found[1]
        return {"peak_gops": round(float(kernel["gops"]), 1), "peak_runtime": runtime, "op": op,
                "peak_threads": kernel["threads"], "peak_instances": kernel["instances"]}
    if best is None or found is None:
        return None
    return {"peak_gops": round(best[0], 1), "peak_trial": best[1], "op": probe.get("op", "conv"),
            "probe_gops": round(float(found[1]["gops"]), 1)}


def _achieved(trial: FrozenTrial, work: float) -> float | None:
    items = trial.user_attrs.get("throughput_ips")
    return work * float(items) / 1e9 if items else None


def _precision(trial: FrozenTrial) -> str:
    """The precision a trial ran ("" for one of a knob this autotune no longer knows)."""
    try:
        return Config.from_description(str(trial.user_attrs.get("config", "defaults"))).text("precision")
    except ConfigError:
        return ""


def of_recommended(study: optuna.Study) -> dict[str, Any] | None:
    """`of_trial` for the trial the study's confirmation recommends (the best measured, before one)."""
    verdict = study.user_attrs.get("confirmation")
    found = records.best_measured(study)
    number = confirmations.recommended(verdict) if verdict else found[0].number if found else None
    chosen = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    return of_trial(study, chosen) if chosen is not None else None


def words(found: Mapping[str, Any]) -> str:
    if "read_gbs" in found:
        first = f" after a first token at {found['ttft_ms']:.0f} ms" if "ttft_ms" in found else ""
        return (f"trial {found['trial']} decodes at {found['tpot_ms']:.1f} ms per token{first}, reading its "
                f"{found['weight_gb']:.2f} GB of weights at {found['read_gbs']:.1f} GB/s: {found['fraction']:.0%} "
                f"of this CPU's measured memory bandwidth ({found['bandwidth_gbs']:.1f} GB/s; at most "
                f"{found['ceiling_tokens_per_s']:.1f} tokens/s with these weights)")
    said = (f"trial {found['trial']} computes {found['achieved_gops']:.0f} GOP/s ({found['gflop_per_item']:.2f} "
            f"GFLOP per item): {found['fraction']:.0%} of this CPU's measured {found['precision']} peak ")
    if "peak_trial" in found:
        return said + (f"({found['peak_gops']:.0f} GOP/s by trial {found['peak_trial']}, above the "
                       f"{found['probe_gops']:.0f} GOP/s of the best probe kernel on its {found['op']})")
    arranged = f"{found['peak_instances']} x {found['peak_threads']} thread(s)"
    return said + f"({found['peak_gops']:.0f} GOP/s on the probe's {found['op']}, {found['peak_runtime']}, {arranged})"
