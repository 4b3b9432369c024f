"""A side by side's numbers and table (benchmarks/peers.py, transformer_buckets.py): paired speedups
with the project's own statistics, and the winner against the peers round by round."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from autotune.measure import stats

from lib import common


def summarise(contenders: Sequence[Any], runs: list[list[dict[str, Any]]], objective: str) -> dict[str, Any]:
    """Per contender: median and range of its rounds, speedup over the defaults (position 0); then
    the winner (last) against the best peer of each round and against the best peer by median."""
    lower = objective == "latency"
    values = [[r["value"] for r in series] for series in runs]
    rows = [row(values[0], series, runs[i], lower) for i, series in enumerate(values)]
    peers = [i for i, c in enumerate(contenders) if c.kind == "peer"]
    return {"rows": rows, "versus_peers": versus_peers(values, peers, len(contenders) - 1, lower,
                                                       [c.label for c in contenders])}


def row(reference: list[float | None], values: list[float | None], runs: list[dict[str, Any]],
        lower: bool) -> dict[str, Any]:
    ran = [v for v in values if v is not None]
    failed = [r["reason"] for r in runs if not r["ok"]]
    found: dict[str, Any] = {"ok_rounds": len(ran), "rounds": len(values), "failures": sorted(set(failed))}
    if ran:
        found |= {"median": stats.median(ran), "min": min(ran), "max": max(ran)}
    found["speedup"] = paired(ratios(reference, values, lower))
    return found


def ratios(reference: list[float | None], candidate: list[float | None], lower: bool) -> list[float]:
    """Per round, how much faster the candidate is (> 1: faster), over rounds where both ran."""
    pairs = [(r, c) for r, c in zip(reference, candidate, strict=True) if r is not None and c is not None]
    return [r / c if lower else c / r for r, c in pairs]


def paired(per_round: list[float]) -> dict[str, Any] | None:
    """Hodges-Lehmann speedup with the inverted signed-rank interval and its coverage; the one-sided
    p is against 'no faster at all' (min_effect 0)."""
    if len(per_round) < 2:
        return None
    found = stats.paired_speedup(per_round, min_effect=0.0)
    return {"speedup": found.speedup, "low": found.interval.low, "high": found.interval.high,
            "label": found.interval.label, "p_value": found.p_value, "rounds": found.rounds,
            "ratios": per_round}


def versus_peers(values: list[list[float | None]], peers: list[int], winner: int, lower: bool,
                 labels: list[str]) -> dict[str, Any]:
    best_of_round: list[float | None] = []
    for number in range(len(values[winner])):
        ran = [v for p in peers if (v := values[p][number]) is not None]
        best_of_round.append((min(ran) if lower else max(ran)) if ran else None)
    per_round = ratios(best_of_round, values[winner], lower)
    medians = {p: stats.median([v for v in values[p] if v is not None]) for p in peers
               if any(v is not None for v in values[p])}
    best = (min if lower else max)(medians, key=medians.__getitem__) if medians else None
    fixed = ratios(values[best], values[winner], lower) if best is not None else []
    return {"per_round": paired(per_round), "faster_rounds": sum(r > 1 for r in per_round),
            "best_by_median": labels[best] if best is not None else None, "against_best": paired(fixed)}


def markdown(found: dict[str, Any], part: dict[str, Any]) -> str:
    lower = part["objective"] == "latency"
    unit = "p50 ms" if lower else "items/s"
    lines = [f"### {part['model']}, {part['objective']} (batch {part['batch_size']})", "",
             common.provenance_line(found), "",
             f"| contender | knobs | {unit}: median (min-max) | speedup over defaults (Hodges-Lehmann, interval) "
             "| rounds ok | note |", "|---|---|---|---|---|---|"]
    for contender, summary in zip(part["contenders"], part["summary"]["rows"], strict=True):
        lines.append(table_row(contender, summary))
    lines += ["", winner_line(part["summary"]["versus_peers"], lower), verdict_line(part), ""]
    return "\n".join(lines) + "\n"


def table_row(contender: dict[str, Any], summary: dict[str, Any], before_value: Sequence[str] = ()) -> str:
    """A contender's row; `before_value`: cells of its own (one per sequence length) before its value."""
    knobs = "-" if contender.get("unavailable") else " ".join(contender["knobs"]) or "defaults"
    value = (f"{summary['median']:.1f} ({summary['min']:.1f}-{summary['max']:.1f})" if "median" in summary
             else "failed: " + "; ".join(summary["failures"])[:200].replace("|", "/"))
    speedup = "1.00x (the reference)" if contender["kind"] == "defaults" else speedup_text(summary["speedup"])
    note = contender["note"].replace("|", "/")
    kind = {"expert": " (expert recipe)", "peer": " (peer recipe)"}.get(contender["kind"], "")
    own = "".join(f"{cell} | " for cell in before_value)
    return (f"| {contender['label']}{kind} | {knobs} | {own}{value} | {speedup} "
            f"| {summary['ok_rounds']}/{summary['rounds']} | {note} |")


def within(paired: dict[str, Any] | None, tolerance: float) -> str:
    """Whether a paired ratio's whole interval lies within 1/(1+tolerance)..1+tolerance ("yes"), wholly
    beyond it ("no"), or neither ("undecided"); "-" without one."""
    if paired is None:
        return "-"
    low, high = 1 / (1 + tolerance), 1 + tolerance
    if low <= paired["low"] and paired["high"] <= high:
        return "yes"
    if paired["high"] < low or paired["low"] > high:
        return "no"
    return "undecided"


def speedup_text(found: dict[str, Any] | None) -> str:
    if found is None:
        return "-"
    return f"{found['speedup']:.2f}x ({found['label']} {found['low']:.2f}-{found['high']:.2f})"


def winner_line(versus: dict[str, Any], lower: bool) -> str:
    each, best = versus["per_round"], versus["against_best"]
    if each is None:
        return "- winner against the peers: fewer than two rounds where both the winner and a peer ran"
    ratios = each["ratios"]
    return (f"- winner against the fastest peer of each round: {speedup_text(each)}, per round "
            f"{min(ratios):.2f}-{max(ratios):.2f}x, faster in {versus['faster_rounds']} of {len(ratios)} rounds "
            f"(one-sided signed-rank p={each['p_value']:.3g}); against {versus['best_by_median']} (the best peer "
            f"by median): {speedup_text(best)}. Above 1: the winner is faster ({'latency' if lower else 'items/s'}).")


def verdict_line(part: dict[str, Any]) -> str:
    """The search's own confirmation: its message, and its winner against the best expert recipe and
    the best peer where it recorded them (`against_peer` from the verdict that knows peers)."""
    verdict = part.get("verdict") or {}
    exits = f"search exit {part['search_exit']}, export exit {part['export_exit']}"
    found = [f"- the search's own verdict ({exits}, study {part['study']}): {verdict.get('message', 'none recorded')}"]
    for key in ("against_recipe", "against_peer"):
        versus = verdict.get(key) or {}
        if versus.get("status"):
            ci = versus.get("ci") or [math.nan, math.nan]
            shown = (f": {versus['speedup']:.2f}x ({versus.get('ci_label')} {ci[0]:.2f}-{ci[1]:.2f})"
                     if versus.get("speedup") is not None else "")
            found.append(f"- {key}: {versus['status']} {versus.get('recipe')!r} (trial {versus.get('trial')}){shown}")
    return "\n".join(found)
