"""autotune's temporary folders, named after the process that owns them, so that a later start
removes those a killed autotune (`kill -9`) left behind, and never a live one's."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from autotune.base.processes import alive

# autotune-run-PID-*: a plan's result files; autotune-apply-PID-*: `run`'s report;
# autotune-profile-PID-*: `profile`'s traces until every configuration has been profiled
KINDS = ("run", "apply", "profile")
OWNED = re.compile(rf"^autotune-(?:{'|'.join(KINDS)})-(\d+)-")


def prefix(kind: str) -> str:
    """The name a folder of this kind starts with, for `tempfile.TemporaryDirectory(prefix=...)`."""
    assert kind in KINDS, kind
    return f"autotune-{kind}-{os.getpid()}-"


def remove_orphans(root: Path | None = None) -> list[Path]:
    """Remove the folders whose owning autotune is gone; return them."""
    removed = []
    for path in sorted((root or Path(tempfile.gettempdir())).glob("autotune-*")):
        owner = OWNED.match(path.name)
        if owner and path.is_dir() and not path.is_symlink() and not alive(int(owner[1])):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
