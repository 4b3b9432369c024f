"""Names that reach the file system: one rule for the parent (study files) and the child (caches)."""

from __future__ import annotations

import re

UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(text: str) -> str:
    """`text` with every character outside letters, digits, '.', '_' and '-' replaced by '_'."""
    return UNSAFE.sub("_", text)
