"""Verdicts for people: the confirmation's table and words, a comparison and the regression gate,
and the progress of their interleaved rounds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.cli.display import clock, err, new_table, number, out
from autotune.measure import quality
from autotune.measure.objectives import Metric, lower_is_better, unit_of
from autotune.measure.stats import median
from autotune.study import confirmations


def confirm_progress(event: Any) -> None:
    result = event.result
    outcome = (f"p50 {result.latency_p50_ms:.2f} ms, {result.throughput_ips:.2f} items/s" if result.ok
               else f"FAILED: {result.reason}")
    again = f" (run again: {event.attempt})" if event.attempt else ""
    noisy = f" NOISY ({event.noisy})" if event.noisy else ""
    err.print(f"round {event.round + 1}/{event.rounds}: {event.contender.label}{again}: {outcome}{noisy}",
              markup=False, soft_wrap=True)


def confirmation(verdict: Mapping[str, Any]) -> None:
    unit = unit_of(verdict["metric"])
    table = new_table(f"Confirmation: {verdict['rounds']} interleaved rounds{_looked(verdict)} against trial "
                      f"{verdict['baseline_trial']} (baseline)", "trial", "knobs", f"median {unit}", "speedup",
                      "interval", "p", "vs baseline", "failed runs", "noisy reruns")
    for row, kind in [*((c, "") for c in verdict["candidates"]), *_reference_rows(verdict)]:
        ci = f"{row['ci_label']} {row['ci'][0]:.3f}-{row['ci'][1]:.3f}" if row["ci"] else "-"
        p_value = f"{row['p_value']:.3g}" if row["p_value"] is not None else "-"
        table.add_row(f"{row['trial']}{f' ({kind})' if kind else ''}", str(row["config"]),
                      number(row["median"]), number(row["speedup"], "x"), ci, p_value, _judged(row, kind, verdict),
                      str(row["failed_runs"]), str(row.get("reruns", 0)))
    out.print(table)
    which = int(verdict.get("number", 1))
    out.print(confirmations.heading(verdict["significant"], which, which) + verdict["message"],
              markup=False, soft_wrap=True)
    if per_bucket := confirmations.buckets_sentence(verdict, confirmations.recommended(verdict)):
        out.print(per_bucket, markup=False, soft_wrap=True)
    if verdict.get("quality"):
        rechecked = verdict["quality"]
        against = f": {rechecked['against_limit']}" if rechecked.get("against_limit") else ""
        out.print(f"quality of trial {rechecked['trial']} re-checked on the confirmation's own held-out part of "
                  f"--eval-data: {quality.describe(rechecked)}{against}", markup=False, soft_wrap=True)
    if verdict.get("quality_breach"):
        out.print(f"Not recommended: {verdict['quality_breach']}", markup=False, soft_wrap=True)
    if "host" in verdict:
        out.print(f"measured on host {verdict['host']} (host class {verdict['host_class']})", markup=False,
                  soft_wrap=True)
    if "order_seed" in verdict:
        err.print(f"rounds ran in a random balanced order, seed {verdict['order_seed']} (--seed repeats it)",
                  markup=False)


def _looked(verdict: Mapping[str, Any]) -> str:
    """' (look 1 of 3, at most 20)': where a sequential verdict stopped ('' for one look, or an old verdict)."""
    looks = len(verdict.get("looks") or [])
    return f" (look {verdict['look']} of {looks}, at most {verdict['rounds_cap']})" if looks > 1 else ""


def _judged(row: Mapping[str, Any], kind: str, verdict: Mapping[str, Any]) -> str:
    """A row's word against the baseline: its outcome (the winner's marked), or why it was not tested."""
    if row["status"] != "ok":
        return f"no: {row['reason']}"
    if kind:
        return f"{row.get('outcome') or '-'} ({'peer reference' if kind == 'peer' else 'reference'})"
    outcome = row.get("outcome") or ("beats" if row["significant"] else "-")
    return f"{outcome} (winner)" if row["significant"] and row["trial"] == verdict["winner_trial"] else outcome


def cost(found: Mapping[str, Any]) -> None:
    """What the search's confirmation took of the command (`summaries.confirmation_cost`)."""
    why = {"decided": f"every decision made at look {found['look']} of {found['looks']}",
           "cap": "undecided at the cap", "time": "stopped at the time budget's share"}.get(found["stopped_by"], "")
    n = found["noisy_reruns"]
    reruns = f"; {n} noisy {'run' if n == 1 else 'runs'} run again" if n else ""
    share = "" if found["share"] is None else f": {found['share']:.0%} of this command's {clock(found['command_s'])}"
    out.print(f"the confirmation ran {found['rounds']} of at most {found['rounds_cap']} rounds ({why}{reruns}) in "
              f"{clock(found['wall_s'])}{share}", markup=False, soft_wrap=True)


def _reference_rows(verdict: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], str]]:
    """The rows of the references that ran beside the candidates, each against the baseline, with
    which it is: "recipe" (the best expert recipe) or "peer" (the best peer)."""
    found = (("recipe", verdict.get("against_recipe")), ("peer", verdict.get("against_peer")))
    return [(versus["against_baseline"], kind) for kind, versus in found if versus and versus.get("against_baseline")]


def _contenders(measured: Any, metric: Metric) -> None:
    table = new_table("Comparison", "configuration", f"median {unit_of(metric)}", "runs ok")
    for position, contender in enumerate(measured.contenders):
        values = measured.values(position)
        ran = [v for v in values if v is not None]
        table.add_row(contender.label, number(median(ran) if ran else None), f"{len(ran)}/{len(values)}")
    out.print(table)


def _not_compared(measured: Any) -> None:
    failed = next((r for series in measured.runs for r in series if r.value is None), None)
    out.print(f"Not compared: a run failed ({failed.reason})" if failed else "Not enough rounds to compare.",
              markup=False, soft_wrap=True)


def comparison(measured: Any, metric: Metric, result: Any) -> None:
    _contenders(measured, metric)
    first, second = (c.label for c in measured.contenders)
    if result is None:
        _not_compared(measured)
        return
    verdict = "faster" if lower_is_better(metric) else "more throughput"
    out.print(f"{second} vs {first}: {result.describe()}; "
              f"{'significantly ' + verdict if result.significant else 'no significant difference'}",
              markup=False, soft_wrap=True)
    err.print(f"rounds ran in a random balanced order, seed {measured.seed} (--seed repeats it)", markup=False)


def regression(measured: Any, metric: Metric, check: Any, margin: float) -> None:
    """`compare --fail-if-slower`: the table and one verdict line (FAIL exits 1)."""
    _contenders(measured, metric)
    first, second = (c.label for c in measured.contenders)
    if check is None:
        _not_compared(measured)
        out.print("FAIL: no verdict without every run", markup=False)
        return
    verdict = (f"FAIL: {second} is slower than {first} by more than {margin:.0%}" if check.slower_than_margin else
               f"PASS: no slowdown of {second} beyond {margin:.0%} of {first} shown")
    out.print(f"{verdict}; {second} vs {first}: {check.describe()}", markup=False, soft_wrap=True)
    err.print(f"rounds ran in a random balanced order, seed {measured.seed} (--seed repeats it)", markup=False)
