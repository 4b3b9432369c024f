"""`autotune knobs`: every knob in a short table that fits a 100-column terminal, one knob in full
(`autotune knobs KNOB`: what it does, when it applies, what each value sets), or the whole table as
Markdown (`--markdown`, what docs/knobs.md holds)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence

from autotune.cli.display import new_table, out
from autotune.config.knobs import Knob
from autotune.model.knobdefs import value_text

KNOB_COLUMNS = ("knob", "values", "default", "applies when", "sets", "what it does")
SHORT_COLUMNS = ("knob", "values", "default", "sets")
WIDTH = 100  # what a knob's details are wrapped to
MODEL = "(the model: `autotune.apply`)"


def knob_rows(all_knobs: Iterable[Knob]) -> list[tuple[str, ...]]:
    """Each knob as docs/knobs.md shows it: one row of the knob table."""
    return [(k.name, k.allowed(), _default(k), _condition(k), " ".join(k.variables) or (MODEL if k.model else "-"),
             k.help) for k in all_knobs]


def knobs(all_knobs: Sequence[Knob]) -> None:
    """The short table: name, values, default and what it sets (the model, or its variables)."""
    table = new_table("Knobs (--set KNOB=VALUE)", *SHORT_COLUMNS)
    # Fits 100 columns: the values wrap, a variable's name stays whole.
    table.columns[1].max_width, table.columns[-1].min_width = 22, max(len(v) for k in all_knobs for v in k.variables)
    for k in all_knobs:
        table.add_row(k.name, _values(k), _default(k), "\n".join(k.variables) or ("model" if k.model else "-"))
    out.print(table)
    out.print("what a knob does, when it applies and what each value sets: autotune knobs KNOB; "
              "every knob in full: autotune knobs --markdown", markup=False, highlight=False)


def knob_detail(k: Knob) -> str:
    """One knob in full, wrapped to `WIDTH` columns."""
    fields = [("values", k.allowed()), ("default", _default(k) + _unset(k)), ("applies when", _condition(k)),
              ("sets", _sets(k)), ("what it does", k.help)]
    lines = [f"{k.name} ({'a model knob, applied by autotune.apply' if k.model else 'a process knob'})"]
    for label, text in fields:
        lines += textwrap.wrap(text, WIDTH, initial_indent=f"  {label + ':':<14}", subsequent_indent=" " * 16,
                               break_on_hyphens=False)
    return "\n".join(lines) + "\n"


def knobs_markdown(all_knobs: Iterable[Knob]) -> str:
    """The knob table as docs/knobs.md holds it (a test keeps the two the same)."""
    lines = ["| " + " | ".join(KNOB_COLUMNS) + " |", "|" + "---|" * len(KNOB_COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in knob_rows(all_knobs)]
    return "\n".join(lines) + "\n"


def _values(k: Knob) -> str:
    return f"{k.low}..{k.high}" if k.kind == "int" else k.allowed()


def _default(k: Knob) -> str:
    return "-" if k.default is None else value_text(k.default)


def _unset(k: Knob) -> str:
    """What leaving a knob without a default unset runs ("-": the runtime decides)."""
    if k.default is not None or k.unset_as is None:
        return ""
    return " (unset runs as the most the cores allow)" if k.unset_as == "max" else \
        f" (unset runs as {k.name}={value_text(k.unset_as)})"


def _condition(k: Knob) -> str:
    return " ".join(f"{name}={'/'.join(values)}" for name, values in k.only_when) or "always"


def _sets(k: Knob) -> str:
    """Each variable and what it holds, per value where that is not the value as typed."""
    if k.model:
        return MODEL
    said = [f"LD_PRELOAD ({'; '.join(f'{value}: {library}' for value, library in k.needs)})"] if k.needs else []
    for each in k.sets:
        texts = "; ".join(f"{value}: {text}" for value, text in each.texts)
        said.append(f"{each.variable} ({texts})" if texts else f"{each.variable} (the value)")
    return ", ".join(said) or "-"
