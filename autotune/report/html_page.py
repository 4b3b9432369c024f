"""`autotune report`'s page: one self-contained HTML file, plotly's JavaScript inlined once.

Nothing on the page is fetched: no CDN script, no MathJax, no web fonts, so it opens offline and
from a CI artifact. Every text that came from the study is escaped. The file is written
atomically: a failed write leaves nothing behind.
"""

from __future__ import annotations

import html
import math
import os
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from autotune.base.errors import AutotuneError
from autotune.measure.objectives import Metric, lower_is_better
from autotune.model.files import write_atomically
from autotune.report.contents import (
    METRIC_LABELS,
    FailureGroup,
    Forest,
    ForestRow,
    History,
    Quality,
    Report,
    TradeoffPoint,
)
from autotune.report.importance import IMPORTANCE_EVALUATOR, Importance, Marginal
from autotune.study import confirmations, efficiency

HISTORY, IMPORTANCE, FOREST, TRADEOFF, QUALITY = "history", "importance", "forest", "tradeoff", "quality"
MARGINAL_COLUMNS = 3
TRIAL_TICKS = 20  # at most this many trial numbers on a history's axis, whole numbers only
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
TEMPLATE = "plotly_white"
STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1300px;color:#222}
h2{border-bottom:1px solid #ccc;margin-top:2em}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top;font-size:.9em}
.note{color:#666}code{font-size:.9em}"""


class ReportWriteError(AutotuneError):
    """Nowhere to write the report."""


def marginal_id(metric: Metric) -> str:
    return f"marginals-{metric}"


def page(report: Report, folder: Path) -> str:
    """The whole document; `folder` is where it will be written (trace links are relative to it)."""
    sections = [_summary(report), _history(report.histories), _importance(report.importances),
                *(_marginals(report, m) for m in report.metrics), _forest(report.forest),
                _tradeoff(report.tradeoff, len(report.metrics) > 1), _quality(report.quality),
                _failures(report.failures),
                _traces(report.traces, folder), _context(report.context)]
    title = html.escape(f"autotune report: {report.name}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{STYLE}</style><script>{get_plotlyjs()}</script></head>\n<body><h1>{title}</h1>\n"
            + "\n".join(sections) + "\n</body></html>\n")


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _figure(fig: go.Figure, div_id: str) -> str:
    fig.update_layout(template=TEMPLATE, margin={"t": 60, "b": 50, "l": 60, "r": 30})
    return str(pio.to_html(fig, full_html=False, include_plotlyjs=False, include_mathjax=False,
                           div_id=div_id, config=PLOT_CONFIG))


def _section(title: str, *parts: str) -> str:
    return f"<section><h2>{_esc(title)}</h2>\n" + "\n".join(parts) + "</section>"


def _note(text: str) -> str:
    return f"<p class=\"note\">{_esc(text)}</p>"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary(report: Report) -> str:
    counts = report.counts
    lines = [f"{counts['trials']} trials: {counts['complete']} completed, {counts['pruned']} pruned, "
             f"{counts['fail']} failed" + (f", {counts['undecided']} undecided (stopped on a noisy window)"
                                            if counts.get("undecided") else "")
             + (f", {counts['running']} running" if counts["running"] else "")]
    if report.best is not None:
        best = report.best
        lines.append(f"best trial {best.trial} ({best.config}): " + "; ".join(
            f"{METRIC_LABELS[m]} {best.values[m]:.4g} vs baseline {best.baseline.get(m, math.nan):.4g} "
            f"({best.speedups[m]:.2f}x)" for m in report.metrics))
        if best.versus_recipes:
            lines.append(best.versus_recipes)
    if report.forest is not None:
        lines.append(_heading(report.forest) + report.forest.message)
    if report.efficiency is not None:
        lines.append(f"against this CPU: {efficiency.words(report.efficiency)}")
    return "<section>" + "".join(f"<p>{_esc(line)}</p>" for line in lines) + "</section>"


def _history(histories: Sequence[History]) -> str:
    fig = make_subplots(rows=len(histories), cols=1, vertical_spacing=0.12,
                        subplot_titles=[METRIC_LABELS[h.metric] for h in histories])
    for row, hist in enumerate(histories, start=1):
        _history_traces(fig, hist, row)
        fig.update_yaxes(title_text=METRIC_LABELS[hist.metric], row=row, col=1)
        last = max((p.trial for p in hist.points), default=1)
        fig.update_xaxes(title_text="trial", dtick=max(1, math.ceil(last / TRIAL_TICKS)), row=row, col=1)
    fig.update_layout(height=420 * len(histories), title="Optimisation history")
    return _section("History", _figure(fig, HISTORY), _note(
        "Each measured trial's value; pruned trials (x) show the median of the replicates they ran. "
        "The line is the best completed trial so far (feasible ones only, under --max-latency-ms and --max-tpot-ms)."))


def _history_traces(fig: go.Figure, hist: History, row: int) -> None:
    first = row == 1
    for pruned, name, symbol in ((False, "completed", "circle"), (True, "pruned", "x")):
        points = [p for p in hist.points if p.pruned == pruned]
        if not points:
            continue
        fig.add_trace(go.Scatter(x=[p.trial for p in points], y=[p.value for p in points], mode="markers",
                                 name=name, legendgroup=name, showlegend=first, marker={"symbol": symbol},
                                 text=[_point_text(p.config, p.recipe) for p in points],
                                 hovertemplate="trial %{x}: %{y:.4g}<br>%{text}<extra></extra>"), row=row, col=1)
    steps = [p for p in hist.points if p.best_so_far is not None]
    fig.add_trace(go.Scatter(x=[p.trial for p in steps], y=[p.best_so_far for p in steps], mode="lines",
                             line={"shape": "hv"}, name="best so far", legendgroup="best", showlegend=first),
                  row=row, col=1)
    for line, dash in ((hist.baseline, "dash"), (hist.recipe, "dot")):
        if line is not None:
            fig.add_hline(y=line.value, line_dash=dash, row=row, col=1, annotation_position="top left",
                          annotation_text=f"{line.label} (trial {line.trial}): {line.value:.4g}")


def _point_text(config: str, recipe: str | None) -> str:
    return _esc(f"recipe {recipe}: {config}" if recipe else config)


def _importance(importances: Sequence[Importance]) -> str:
    shown = [imp for imp in importances if imp.knobs]
    notes = [_note(f"{METRIC_LABELS[imp.metric]}: {imp.note}") for imp in importances if not imp.knobs]
    if not shown:
        return _section("Knob importance", *notes)
    fig = make_subplots(rows=1, cols=len(shown), subplot_titles=[
        f"{METRIC_LABELS[imp.metric]} ({imp.trials} measured trials)" for imp in shown])
    for col, imp in enumerate(shown, start=1):
        knobs = list(reversed(imp.knobs))
        fig.add_trace(go.Bar(x=[v for _, v in knobs], y=[k for k, _ in knobs], orientation="h", showlegend=False,
                             hovertemplate="%{y}: %{x:.1%}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="share of the variance", tickformat=".0%", row=1, col=col)
    fig.update_layout(height=max(300, 32 * max(len(imp.knobs) for imp in shown) + 120),
                      title=f"Knob importance ({IMPORTANCE_EVALUATOR})")
    within = [_note(f"{METRIC_LABELS[imp.metric]}, {w.knob}: {w.share:.0%} of the variance among the {w.trials} "
                    f"trials with {w.where}") for imp in shown for w in imp.within]
    return _section("Knob importance", _figure(fig, IMPORTANCE), *notes, *within, _note(
        f"{IMPORTANCE_EVALUATOR}: how much of the objective's variance over the measured trials each knob "
        "explains on its own (Optuna's FanovaImportanceEvaluator, fixed seed); a knob left unset counts as its "
        "default value. The bars rank the knobs that apply in every trial; a knob that applies only under a "
        "condition (ONNX Runtime's with backend=onnxruntime) is ranked among the trials where it applies."))


def _marginals(report: Report, metric: Metric) -> str:
    panels = [m for m in report.marginals if m.metric == metric]
    title = f"Marginal effects on {METRIC_LABELS[metric]}"
    if not panels:
        return _section(title, _note("no knob took more than one value among the measured trials"))
    rows = math.ceil(len(panels) / MARGINAL_COLUMNS)
    fig = make_subplots(rows=rows, cols=MARGINAL_COLUMNS,
                        subplot_titles=[f"{m.knob} ({m.where})" if m.where else m.knob for m in panels],
                        vertical_spacing=min(0.3 / rows, 0.12), horizontal_spacing=0.06)
    for index, marginal in enumerate(panels):
        _marginal_traces(fig, marginal, index // MARGINAL_COLUMNS + 1, index % MARGINAL_COLUMNS + 1)
    fig.update_layout(height=300 * rows, showlegend=False, title=title)
    return _section(title, _figure(fig, marginal_id(metric)), _note(
        "Every measured trial's value, grouped by the value each knob had (\"default\": the knob was not set); "
        "a knob with a condition in parentheses, over the trials where it holds."))


def _marginal_traces(fig: go.Figure, marginal: Marginal, row: int, col: int) -> None:
    for value, values in marginal.groups:
        fig.add_trace(go.Box(y=list(values), name=value, boxpoints="all", jitter=0.4, pointpos=0,
                             hovertemplate=f"{_esc(marginal.knob)}={_esc(value)}: %{{y:.4g}}<extra></extra>"),
                      row=row, col=col)
    fig.update_xaxes(type="category", row=row, col=col)


def _forest(forest: Forest | None) -> str:
    title = "Confirmation"
    if forest is None:
        return _section(title, _note("not confirmed: `autotune confirm` re-measures the best candidates against "
                                     "the baseline in interleaved rounds"))
    tested = [r for r in forest.rows if r.speedup is not None and r.interval is not None]
    untested = [(f"trial {r.trial}", r.config, r.reason) for r in forest.rows if r.speedup is None]
    parts = [_note(_heading(forest) + forest.message)] + ([_note(f"Outcomes: {forest.outcomes}.")]
                                                          if forest.outcomes else [])
    if tested:
        parts.insert(0, _figure(_forest_figure(forest, tested), FOREST))
    if untested:
        parts.append(_table(("candidate", "knobs", "why it was not tested"), untested))
    return _section(title, *parts)


def _forest_figure(forest: Forest, rows: Sequence[Any]) -> go.Figure:
    labels = {r.interval_label for r in rows}
    what = "higher throughput" if not lower_is_better(forest.metric) else "lower latency"
    fig = go.Figure(go.Scatter(
        x=[r.speedup for r in rows], y=[_contender(r, forest.winner_trial) for r in rows], mode="markers",
        marker={"size": 11, "color": ["#1a7f37" if r.significant else "#888" for r in rows]},
        error_x={"type": "data", "symmetric": False, "array": [r.interval[1] - r.speedup for r in rows],
                 "arrayminus": [r.speedup - r.interval[0] for r in rows]},
        text=[_esc(f"{r.interval_label} {r.interval[0]:.3f}-{r.interval[1]:.3f}, p={r.p_value:.3g}, "
                   f"{_outcome(r)}<br>{r.config}") for r in rows],
        hovertemplate="%{y}: %{x:.3f}x<br>%{text}<extra></extra>", showlegend=False))
    fig.add_vline(x=1.0, line_dash="dash", annotation_text="baseline", annotation_position="top right")
    fig.add_vline(x=1.0 + forest.min_effect, line_dash="dot", annotation_position="bottom right",
                  annotation_text=f"+{forest.min_effect:.0%} minimum effect")
    label = labels.pop() if len(labels) == 1 else "interval as labelled per candidate"
    fig.update_layout(height=160 + 60 * len(rows), xaxis_title=f"speedup over trial {forest.baseline_trial} "
                      f"({what}), {label}", yaxis={"autorange": "reversed"},
                      title=f"Confirmation: {forest.rounds} interleaved rounds, paired per round")
    return fig


def _outcome(row: ForestRow) -> str:
    """A row's outcome against the baseline (a verdict from before the four outcomes: significant or not)."""
    if row.outcome is None:
        return "significant" if row.significant else "not significant"
    return f"{row.outcome}{' (winner)' if row.significant else ''}"


def _contender(row: ForestRow, winner: int) -> str:
    if row.reference:
        return f"trial {row.trial} ({row.reference} reference)"
    return f"trial {row.trial} (winner)" if row.trial == winner else f"trial {row.trial}"


def _tradeoff(points: Sequence[TradeoffPoint], pareto: bool) -> str:
    title = "Latency against throughput"
    if not points:
        return _section(title, _note("no completed trial recorded both latency and throughput"))
    fig = go.Figure()
    groups = sorted({(p.instances, p.batch_size) for p in points})
    for instances, batch in groups:
        group = [p for p in points if (p.instances, p.batch_size) == (instances, batch)]
        fig.add_trace(go.Scatter(x=[p.latency_p50_ms for p in group], y=[p.throughput_ips for p in group],
                                 mode="markers", name=f"{instances} instance(s), batch {batch}", marker={"size": 9},
                                 text=[_esc(f"trial {p.trial}: {p.config}") for p in group],
                                 hovertemplate="%{x:.4g} ms, %{y:.4g} items/s<br>%{text}<extra></extra>"))
    front = sorted((p for p in points if p.pareto), key=lambda p: p.latency_p50_ms)
    if pareto and front:
        fig.add_trace(go.Scatter(x=[p.latency_p50_ms for p in front], y=[p.throughput_ips for p in front],
                                 mode="lines", name="Pareto front", line={"dash": "dash", "color": "#d62728"}))
    fig.update_layout(height=520, xaxis_title="p50 latency (ms)", yaxis_title="throughput (items/s)", title=title)
    return _section(title, _figure(fig, TRADEOFF))


def _quality(found: Quality | None) -> str:
    """Speed against quality on the user's data: every judged trial, its drop's interval as error bars,
    the front (no trial both faster and of a smaller drop) joined, --max-quality-drop as a line."""
    title = "Speed against quality"
    if found is None:
        return _section(title, _note("no trial was judged on your data: search with --eval-data (and "
                                     "--max-quality-drop) to see what each configuration's speed costs"))
    fig = go.Figure()
    for inside, name, colour in ((True, "within the limit", "#1f77b4"), (False, "over the limit", "#7f7f7f")):
        group = [p for p in found.points if p.within_limit == inside]
        if not group:
            continue
        fig.add_trace(go.Scatter(
            x=[p.speed for p in group], y=[p.drop for p in group], mode="markers", name=name,
            marker={"size": 9, "color": colour},
            error_y={"type": "data", "symmetric": False, "array": [p.drop_interval[1] - p.drop for p in group],
                     "arrayminus": [p.drop - p.drop_interval[0] for p in group]},
            text=[_esc(f"trial {p.trial}: {p.config} ({found.kind} {p.value:.4g})") for p in group],
            hovertemplate="%{x:.4g}, drop %{y:.3g}<br>%{text}<extra></extra>"))
    front = sorted((p for p in found.points if p.front), key=lambda p: p.speed)
    fig.add_trace(go.Scatter(x=[p.speed for p in front], y=[p.drop for p in front], mode="lines",
                             name="Pareto front", line={"dash": "dash", "color": "#d62728"}))
    if found.limit is not None:
        fig.add_hline(y=found.limit, line={"dash": "dot", "color": "#2ca02c"},
                      annotation_text=f"--max-quality-drop {found.limit:g}")
    fig.update_layout(height=520, xaxis_title=METRIC_LABELS[found.metric],
                      yaxis_title=f"{found.kind} drop from fp32 eager ({found.unit}; bars: 95% CI)", title=title)
    return _section(title, _figure(fig, QUALITY), _note(
        f"Each point is a configuration judged once on the search's held-out part of --eval-data beside fp32 "
        f"eager on the same items; a drop is positive when the configuration is worse ({found.unit})."))


def _failures(groups: Sequence[FailureGroup]) -> str:
    if not groups:
        return _section("Failures", _note("no trial failed or was pruned"))
    rows = [(g.state, g.cause, len(g.trials), ", ".join(map(str, g.trials)), g.reason) for g in groups]
    return _section("Failures", _table(("state", "cause", "trials", "which", "reason (first of the group)"), rows))


def _traces(paths: Sequence[Path], folder: Path) -> str:
    if not paths:
        return ""
    items = "".join(f"<li><a href=\"{_esc(_link(p, folder))}\">{_esc(p.name)}</a></li>" for p in paths)
    return _section("Profiles", f"<ul>{items}</ul>", _note(
        "Chrome/Perfetto traces from `autotune profile`: open them in chrome://tracing or the Perfetto UI."))


def _link(path: Path, folder: Path) -> str:
    """Relative to the report's folder, so the pair can be moved together; absolute as a last resort."""
    try:
        target = os.path.relpath(path.resolve(), folder.resolve())
    except ValueError:
        return path.resolve().as_uri()
    return urllib.parse.quote(Path(target).as_posix())


def _context(context: Mapping[str, Mapping[str, Any]]) -> str:
    tables = [f"<h3>{_esc(name)}</h3>" + _table(("what", "value"), ((k, _shown(v)) for k, v in values.items()))
              for name, values in context.items() if values]
    return _section("Study, host, settings and search cost", *tables)


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return "default" if value is None else str(value)


def check_output(path: Path) -> None:
    """Refuse, before any work, a path the page could not be written to."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ReportWriteError(f"cannot write {path}: it is a directory; give a file name like report.html")
    if not folder.is_dir():
        raise ReportWriteError(f"cannot write {path}: the folder {folder} does not exist; create it or give "
                               f"-o a path in an existing folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ReportWriteError(f"cannot write {path}: the folder {folder} is not writable; give -o a writable "
                               f"location")


def write(path: Path, text: str) -> None:
    """Atomically: the file is complete or not there at all."""
    check_output(path)
    try:
        write_atomically(path, text)
    except OSError as exc:
        raise ReportWriteError(f"cannot write {path}: {exc.strerror}; give -o a writable location") from None


def _heading(forest: Forest) -> str:
    return confirmations.heading(forest.significant, forest.number, forest.of)
