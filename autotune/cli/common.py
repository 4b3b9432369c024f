"""What every command shares: exit codes, the studies folder, holding the machine, its output."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import click

from autotune.child.settings import STUDIES_DIR
from autotune.cli import display
from autotune.host.lock import machine_lock

# the exit codes, named once: 0 success; 1 a measured result failed; 2 bad input; 3 a bug in autotune
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
STUDIES = Path(STUDIES_DIR)


def holding(command: str, no_wait: bool) -> AbstractContextManager[None]:
    """The machine to ourselves while measuring: one benchmark per machine at a time."""
    return machine_lock(command, wait=not no_wait,
                        say=lambda line: display.err.print(line, markup=False, soft_wrap=True))


def note(line: str) -> None:
    """A line for the user beside the output (on stderr): `note: ...`."""
    display.err.print(f"note: {line}", markup=False, soft_wrap=True)


def emit(kind: str, data: dict[str, Any], as_json: bool, render: Any) -> None:
    if as_json:
        click.echo(json.dumps(display.json_document(kind, data), indent=2, default=str))
    else:
        render(data)
