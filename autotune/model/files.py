"""Files that appear whole or not at all: every file autotune writes for someone else to read
(a result, an artifact and its description, an env file, a report) goes through here."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: Path, suffix: str = "") -> Iterator[Path]:
    """A fresh temporary path beside `path` to write into: renamed over `path` when the block ends,
    removed when it raises. `suffix` ends the temporary name (a writer that wants `.pt2`, say)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """`text` into `path`, complete or not at all. A symbolic link's target is written, not replaced
    by a file; a device, pipe or socket is refused (renamed over, it would be gone). Raises OSError."""
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        raise OSError(errno.EINVAL, "not a regular file (a device, pipe or socket)")
    with replacing(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, 0o644)


def unwritable(folder: Path, make: bool = True) -> str:
    """Why `folder` cannot be made or written into ("" when it can). With `make`, it is made where
    missing and a file is tried in it; without, nothing is written: a missing folder is judged by the
    nearest folder above it that exists."""
    if not make and not folder.exists():
        above = next((p for p in folder.parents if p.exists()), Path("."))
        if not above.is_dir():
            return os.strerror(errno.ENOTDIR)
        return "" if os.access(above, os.W_OK | os.X_OK) else os.strerror(errno.EACCES)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return str(exc.strerror or exc)
    return ""
