"""What `autotune studies`, `report` and `profile` print: a row per study, a report's page in a few
lines, the hot ops of a profile side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.markup import escape

from autotune.cli.display import new_table, out
from autotune.measure.objectives import Metric, unit_of
from autotune.study import confirmations


def studies(data: Mapping[str, Any]) -> None:
    """`autotune studies`: one row per study (or per database that could not be read)."""
    if not data["studies"]:
        out.print(f"no studies in {data['folder']}/; make one with `autotune search --model resnet18 --trials 20`",
                  markup=False, soft_wrap=True)
        return
    table = new_table("Studies", "study", "model", "objective", "batch", "trials", "best", "confirmed", "host")
    for row in data["studies"]:
        if row["error"]:
            table.add_row(row["name"], f"[red]{row['error']}[/red]", "", "", "", "", "", "")
            continue
        table.add_row(row["name"], str(row["model"]), str(row["objective"]), str(row["batch_size"]),
                      f"{row['trials']['complete']}/{row['trials']['total']}", _best(row["best"]),
                      _verdict(row["confirmation"]), _host(row["host"]))
    out.print(table)


def _best(best: Mapping[str, Any] | None) -> str:
    if best is None:
        return "-"
    speedup = f" ({best['speedup']:.2f}x)" if best["speedup"] is not None else ""
    drop = best.get("quality_drop")
    judged = "" if drop is None else \
        f", quality drop {drop:+.2f} {best['quality_unit']} ({best['quality_front']} on the speed-quality front)"
    return f"trial {best['trial']}: {best['value']:.2f} {best['unit']}{speedup}{judged}"


def _verdict(verdict: Mapping[str, Any] | None) -> str:
    if verdict is None:
        return "not yet"
    which = f" ({verdict['number']} of {verdict['of']})" if verdict.get("of", 1) > 1 else ""
    if verdict["word"] == "confirmed":
        return (f"yes: trial {verdict['winner_trial']}, {verdict['speedup']:.2f}x{_recommends(verdict)}"
                f"{_recipe(verdict)}{_peer(verdict.get('against_peer'))}{which}")
    why = {"equivalent": " (equivalent)", "slower": " (slower)",
           "undecided": f" (undecided after {verdict.get('rounds')} rounds)"}.get(str(verdict.get("outcome")), "")
    return f"no: baseline kept{why}{which}"


def _recommends(verdict: Mapping[str, Any]) -> str:
    """Which reference a confirmed study recommends instead of its winner ("" for the winner)."""
    chosen = verdict.get("recommended_trial", verdict["winner_trial"])
    if chosen == verdict["winner_trial"]:
        return ""
    if (verdict.get("against_peer") or {}).get("trial") == chosen:
        return f", peer trial {chosen} recommended"
    status = (verdict.get("against_recipe") or {"status": "ties"})["status"]
    if status in ("ties", "equivalent"):  # "ties": a verdict from before the four outcomes
        return f", {'equivalent to' if status == 'equivalent' else 'ties with'} recipe trial {chosen} (the simpler)"
    if status == "undecided":
        return f", recipe trial {chosen} recommended (the better estimate)"
    return f", recipe trial {chosen} recommended"


def _recipe(verdict: Mapping[str, Any]) -> str:
    """The winner against the best expert recipe when it is still undecided ("" otherwise: the
    recommendation says the rest)."""
    versus = verdict.get("against_recipe") or {}
    if versus.get("status") != "undecided" or verdict.get("recommended_trial") == versus.get("trial"):
        return ""
    return f"; vs recipe trial {versus['trial']}: undecided, the winner the better estimate"


def _peer(versus: Mapping[str, Any] | None) -> str:
    """The winner against the best peer, in a few words ("" when no peer ran)."""
    if not versus:
        return ""
    speedup = f"{versus['speedup']:.2f}x, " if versus["speedup"] is not None else ""
    return f"; vs peer trial {versus['trial']}: {speedup}{versus['status']}"


def _host(host: Mapping[str, Any]) -> str:
    cores = host.get("usable_physical_cores")
    return f"{host.get('cpu_model', 'unknown')}, {cores} cores" if host else "unknown"


def report_summary(data: Mapping[str, Any]) -> None:
    """`autotune report`'s page in a few lines."""
    counts = data["counts"]
    lines = [f"study {data['study']}: {counts['trials']} trials, {counts['complete']} completed, "
             f"{counts['pruned']} pruned, {counts['fail']} failed"]
    best = data["best"]
    if best is not None:
        lines.append(f"best: trial {best['trial']} ({best['config']}), " + ", ".join(
            f"{_metric_value(m, v)} vs baseline {_metric_value(m, best['baseline'].get(m))} "
            f"({best['speedups'][m]:.2f}x)" for m, v in best["values"].items()))
        if best["versus_recipes"]:
            lines.append(best["versus_recipes"])
    verdict = data["confirmation"]
    lines.append("not confirmed: run `autotune confirm`" if verdict is None else
                 confirmations.heading(verdict["significant"], verdict.get("number", 1), verdict.get("of", 1))
                 + verdict["message"])
    for metric, found in data["importance"].items():
        top = ", ".join(f"{k} {v:.0%}" for k, v in list(found["knobs"].items())[:3]) or found["note"]
        lines.append(f"top knobs for {unit_of(metric)} ({found['evaluator']}, {found['trials']} trials): {top}")
    lines += [f"{len(g['trials'])} {g['state']} ({g['cause']}): {g['reason']}" for g in data["failures"]]
    lines.append(f"wrote {data['output']}")
    for line in lines:
        out.print(line, markup=False, soft_wrap=True, highlight=False)


def _metric_value(metric: Metric, value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} {unit_of(metric)}"


def profile(data: Mapping[str, Any], top: int, open_with: str) -> None:
    """`autotune profile`: the hot ops side by side, what changed most, where the traces are."""
    configs = data["configurations"]
    for c in configs:
        out.print(f"{c['label']}: {c['config'] or 'defaults'}, {c['instances']} instance(s)", markup=False,
                  soft_wrap=True)
    columns = [name for c in configs for name in (f"{escape(c['label'])}: op", "ms", "share", "calls")]
    table = new_table(f"Top {top} ops by self CPU time, per forward call ({data['iterations']} calls profiled)",
                   "#", *columns)
    for rank in range(min(top, max(len(c["ops"]) for c in configs))):
        table.add_row(str(rank + 1), *(cell for c in configs for cell in _op_cells(c["ops"], rank)))
    table.add_section()
    table.add_row("", *(cell for c in configs for cell in ("all ops", f"{c['self_ms_per_iteration']:.3f}", "100%",
                                                             "")))
    out.print(table)
    walls = ", ".join(f"{c['label']} {c['wall_ms_per_iteration']:.3f} ms ({c['outside_ops_ms_per_iteration']:.3f} "
                      f"outside any op)" for c in configs)
    out.print(f"wall time per profiled call (profiler overhead included): {walls}", markup=False, soft_wrap=True)
    for c in (c for c in configs if c["mostly_outside_ops"]):
        out.print(f"note: {c['label']} spent most of its time outside any recorded op: compiled code (an AOTInductor "
                  f"package) runs its kernels without profiler events; its trace shows where the gaps are",
                  markup=False, soft_wrap=True)
    for c in (c for c in configs if c["instances"] > 1):
        out.print(f"{c['label']} runs {c['instances']} instances: instance {data['profiled_instance']} was profiled "
                  f"while the others ran their timed loop beside it", markup=False, soft_wrap=True)
    if data["changed"]:
        _changed(data["changed"], configs[0]["label"], configs[-1]["label"])
    out.print(f"traces: {', '.join(c['trace'] for c in configs)}; summary: {data['summary_file']}", markup=False,
              soft_wrap=True)
    out.print(f"{open_with}; op names are as the profiler recorded them (eager: aten:: ops; inductor: its own "
              f"kernels)", markup=False, soft_wrap=True)


def _op_cells(ops: Sequence[Mapping[str, Any]], rank: int) -> tuple[str, ...]:
    if rank >= len(ops):
        return ("", "", "", "")
    op = ops[rank]
    return (escape(op["name"]), f"{op['self_ms']:.3f}", f"{op['share']:.1%}", f"{op['calls']:g}")


def _changed(rows: Sequence[Mapping[str, Any]], before: str, after: str) -> None:
    table = new_table(f"Ops whose self CPU time changed most, ms per forward call ({escape(before)} -> "
                   f"{escape(after)})", "op", escape(before), escape(after), "change")
    for row in rows:
        table.add_row(escape(row["name"]), f"{row['before_ms']:.3f}", f"{row['after_ms']:.3f}",
                      f"{row['delta_ms']:+.3f}")
    out.print(table)
