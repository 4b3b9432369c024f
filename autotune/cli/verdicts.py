"""Verdicts for people: the confirmation's table and words, a comparison and the regression gate,
and the progress of their interleaved rounds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.cli.display import err, new_table, number, out
from autotune.measure.objectives import Metric, lower_is_better, unit_of
from autotune.measure.stats import median
from autotune.study import confirmations


def confirm_progress(event: Any) -> None:
    result = event.result
    outcome = (f"p50 {result.latency_p50_ms:.2f} ms, {result.throughput_ips:.2f} items/s" if result.ok
               else f"FAILED: {result.reason}")
    err.print(f"round {event.round + 1}/{event.rounds}: {event.contender.label}: {outcome}", markup=False,
              soft_wrap=True)


def confirmation(verdict: Mapping[str, Any]) -> None:
    unit = unit_of(verdict["metric"])
    table = new_table(f"Confirmation: {verdict['rounds']} interleaved rounds against trial "
                      f"{verdict['baseline_trial']} (baseline)", "trial", "knobs", f"median {unit}", "speedup",
                      "interval", "p", "significant", "failed runs")
    for row, kind in [*((c, "") for c in verdict["candidates"]), *_reference_rows(verdict)]:
        ci = f"{row['ci_label']} {row['ci'][0]:.3f}-{row['ci'][1]:.3f}" if row["ci"] else "-"
        judged = ("yes" if row["significant"] else "no") if row["status"] == "ok" else f"no: {row['reason']}"
        p_value = f"{row['p_value']:.3g}" if row["p_value"] is not None else "-"
        table.add_row(f"{row['trial']}{f' ({kind})' if kind else ''}", str(row["config"]),
                      number(row["median"]), number(row["speedup"], "x"), ci, p_value,
                      ("peer reference" if kind == "peer" else "reference") if kind else judged,
                      str(row["failed_runs"]))
    out.print(table)
    which = int(verdict.get("number", 1))
    out.print(confirmations.heading(verdict["significant"], which, which) + verdict["message"],
              markup=False, soft_wrap=True)
    if per_bucket := confirmations.buckets_sentence(verdict, confirmations.recommended(verdict)):
        out.print(per_bucket, markup=False, soft_wrap=True)
    if "host" in verdict:
        out.print(f"measured on host {verdict['host']} (host class {verdict['host_class']})", markup=False,
                  soft_wrap=True)
    if "order_seed" in verdict:
        err.print(f"rounds ran in a random balanced order, seed {verdict['order_seed']} (--seed repeats it)",
                  markup=False)


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
