"""A configuration's quality on the user's data (`--eval-data`): one probe child judges it on a
held-out part beside fp32 eager (`autotune.child.quality` counts), and the counts become figures
with 95% intervals here.

- Accuracy (a classifier): the share of items right, with Wilson's score interval; its drop from
  fp32 eager in points on the same items, with the Agresti-Min interval of a paired difference
  (half an item added to each of the four paired cells).
- Perplexity (a causal LM): exp of the mean negative log-likelihood of the scored tokens, windows
  equal-sized, with a t interval over windows (a window's tokens are not independent; windows
  nearly are); its drop from fp32 in percent, exp of the paired mean difference over the same
  windows (a t interval too); the KL divergence from fp32's next-token distribution (mean with its
  interval over windows, percentiles and maximum over positions) and the share of positions whose
  top token is fp32's, as llama.cpp's `llama-perplexity` reports them.

A drop is positive when the configuration is worse. `--max-quality-drop` bounds its estimate.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from scipy import stats as scipy_stats

from autotune.base.thresholds import CONFIDENCE
from autotune.measure.plan import LaunchPlan, worker_command
from autotune.measure.runner import run_plan

UNITS = {"accuracy": "points", "perplexity": "%", "custom": ""}  # what a drop is counted in, by kind ("": the metric's)


def measure(plan: LaunchPlan, split: str, timeout_s: float) -> dict[str, Any]:
    """The plan's configuration judged on `split` of its eval data, in one unbound probe child:
    its figures (`figures`), or {"error": why} when the child failed."""
    first = plan.instances[0]
    command = (*worker_command(sys.executable, plan.bench, plan.config), "--probe", "--eval-split", split)
    trial = replace(plan, binding="none", instances=(replace(first, command=command),))
    result = run_plan(trial, timeout_s)
    counts = result.instances[0].metrics.get("quality") if result.ok else None
    if not counts:
        return {"split": split, "error": result.reason.removeprefix("instance 0: ") or "no quality figures"}
    return figures(counts, split)


def figures(counts: Mapping[str, Any], split: str) -> dict[str, Any]:
    """The child's counts as the figures a trial records."""
    kind = str(counts["kind"])
    found = {"accuracy": accuracy, "perplexity": perplexity, "custom": custom}[kind](counts)
    change = found["value"] - found["reference_value"]
    worse = change if kind == "perplexity" or counts.get("direction") == "lower" else -change
    return {"kind": kind, "split": split, "unit": UNITS[kind], "confidence": CONFIDENCE, **found,
            "drop_absolute": worse, "drop_relative": 100 * worse / abs(found["reference_value"])
            if found["reference_value"] else None, "eval_s": counts.get("eval_s")}


def accuracy(counts: Mapping[str, Any]) -> dict[str, Any]:
    n = int(counts["items"])
    both, ref_only, cand_only = (int(counts[k]) for k in ("both_right", "reference_only_right",
                                                          "candidate_only_right"))
    right, ref_right = both + cand_only, both + ref_only
    low, high = wilson(right, n)
    drop_low, drop_high = paired_difference(ref_only, cand_only, n)
    return {"items": n, "value": 100 * right / n, "interval": [100 * low, 100 * high],
            "reference_value": 100 * ref_right / n, "reference_interval": [100 * x for x in wilson(ref_right, n)],
            "drop": 100 * (ref_only - cand_only) / n, "drop_interval": [100 * drop_low, 100 * drop_high],
            "top1_agreement": int(counts["top1_agreement_items"]) / n}


def perplexity(counts: Mapping[str, Any]) -> dict[str, Any]:
    nll, nll_ref = [float(x) for x in counts["nll"]], [float(x) for x in counts["nll_reference"]]
    differences = [a - b for a, b in zip(nll, nll_ref, strict=True)]
    value, interval = _exp_mean(nll)
    reference, reference_interval = _exp_mean(nll_ref)
    ratio, ratio_interval = _exp_mean(differences)
    kl_mean_low, kl_mean_high = mean_interval([float(x) for x in counts["kl_per_window"]])
    quantiles = dict(counts["kl_quantiles"])
    positions = int(counts["positions"])
    return {"items": int(counts["windows"]), "windows": int(counts["windows"]),
            "window_tokens": int(counts["window_tokens"]), "scored_per_window": int(counts["scored_per_window"]),
            "value": value, "interval": interval, "reference_value": reference,
            "reference_interval": reference_interval,
            "drop": 100 * (ratio - 1), "drop_interval": [100 * (x - 1) for x in ratio_interval],
            "kl_mean": float(counts["kl_mean"]), "kl_mean_interval": [kl_mean_low, kl_mean_high],
            "kl_p99": float(quantiles.get("0.99", math.nan)), "kl_quantiles": quantiles,
            "kl_max": float(counts["kl_max"]), "same_top": int(counts["same_top"]) / positions,
            "positions": positions}


def custom(counts: Mapping[str, Any]) -> dict[str, Any]:
    """The user's metric (`--eval`): one number for the configuration and one for fp32 eager on the
    same batches; the drop in the metric's own units, fp32's minus the configuration's where higher is
    better (its share of fp32's is `drop_relative`, as for every kind). One number has no spread: no interval."""
    value, reference = float(counts["value"]), float(counts["reference_value"])
    higher = counts["direction"] == "higher"
    drop = reference - value if higher else value - reference
    return {"items": int(counts["batches"]), "metric": str(counts["metric"]), "direction": counts["direction"],
            "value": value, "interval": None, "reference_value": reference, "drop": drop, "drop_interval": None}


def _exp_mean(values: Sequence[float]) -> tuple[float, list[float]]:
    """exp of the mean and of its interval's ends."""
    low, high = mean_interval(values)
    return math.exp(statistics.fmean(values)), [math.exp(low), math.exp(high)]


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Student's t interval of the mean; the mean itself at both ends for one value (no spread is known)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean
    half = float(scipy_stats.t.ppf((1 + confidence) / 2, len(values) - 1)) * statistics.stdev(values) / \
        math.sqrt(len(values))
    return mean - half, mean + half


def wilson(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson's score interval of a binomial share."""
    z = float(scipy_stats.norm.ppf((1 + confidence) / 2))
    share = successes / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(first_only: int, second_only: int, n: int,
                      confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The interval of (first's share right - second's) on the same n items, from the discordant
    counts (Agresti & Min 2005: half an item added to each of the four cells, then Wald's)."""
    z = float(scipy_stats.norm.ppf((1 + confidence) / 2))
    b, c, total = first_only + 0.5, second_only + 0.5, n + 2.0
    difference = (b - c) / total
    half = z * math.sqrt(max((b + c) - (b - c) ** 2 / total, 0.0)) / total
    return max(-1.0, difference - half), min(1.0, difference + half)


def drop_of(found: Mapping[str, Any] | None) -> float | None:
    """A trial's recorded drop (None when its quality was not measured or failed; NaN counts as none)."""
    if not found or "drop" not in found:
        return None
    drop = float(found["drop"])
    return drop if math.isfinite(drop) else None


def against_limit(found: Mapping[str, Any], limit: float) -> str:
    """How a drop stands against --max-quality-drop `limit`, read with its interval: within it with
    the whole interval, within it on the estimate only (not shown within: the interval reaches past
    it), or over it. A custom metric has no interval: its estimate alone."""
    drop = drop_of(found)
    if drop is None:
        return "not measured"
    unit = "%" if found.get("unit") == "%" else f" {found.get('unit')}".rstrip()
    shown = f"{limit:g}{unit}"
    high = (found.get("drop_interval") or [None, None])[1]
    label = int(100 * float(found.get("confidence", CONFIDENCE)))
    if drop > limit:
        return f"over the {shown} limit"
    if high is None:
        return f"within the {shown} limit"
    if high <= limit:
        return f"within the {shown} limit, its whole {label}% interval too"
    return (f"within the {shown} limit on its estimate, not shown within it: its {label}% interval reaches "
            f"{high:+.2f}{unit} (more held-out data would narrow it)")


def describe(found: Mapping[str, Any]) -> str:
    """One line: the figure with its interval, fp32's, the drop; for perplexity the KL and same-top share."""
    if "error" in found:
        return f"quality not measured: {found['error']}"
    label = int(100 * float(found.get("confidence", CONFIDENCE)))
    if found["kind"] == "custom":
        relative = "" if found.get("drop_relative") is None else f" ({found['drop_relative']:+.2f}%)"
        return (f"{found['metric']} {found['value']:.6g} ({found['direction']} is better) on {found['items']} "
                f"batch(es), fp32 {found['reference_value']:.6g}: a drop of {found['drop']:+.6g}{relative}")
    low, high = found["interval"]
    drop_low, drop_high = found["drop_interval"]
    if found["kind"] == "accuracy":
        return (f"accuracy {found['value']:.2f}% ({label}% CI {low:.2f}-{high:.2f}) on {found['items']} held-out "
                f"items, fp32 {found['reference_value']:.2f}%: a drop of {found['drop']:+.2f} points "
                f"({label}% CI {drop_low:+.2f} to {drop_high:+.2f}); top-1 as fp32 on {found['top1_agreement']:.1%}")
    return (f"perplexity {found['value']:.3f} ({label}% CI {low:.3f}-{high:.3f}) over {found['windows']} held-out "
            f"windows of {found['window_tokens']} tokens, fp32 {found['reference_value']:.3f}: a drop of "
            f"{found['drop']:+.2f}% ({label}% CI {drop_low:+.2f} to {drop_high:+.2f}); KL divergence from fp32 mean "
            f"{found['kl_mean']:.3g}, p99 {found['kl_p99']:.3g}, max {found['kl_max']:.3g}; same top token "
            f"{found['same_top']:.1%} of {found['positions']} positions")
