"""Files that appear whole or not at all: every file autotune writes for someone else to read
(a result, an artifact and its description, an env file, a report) goes through here."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: Path, suffix: str = "") -> Iterator[Path]:
    """A fresh temporary path beside `path` to write into (a file, or a folder): renamed over `path`
    when the block ends, removed when it raises. `suffix` ends the temporary name (a writer that
    wants `.pt2`, say). A folder is renamed only where `path` is not one already (OSError)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
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


NOT_REGULAR = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFCHR: "a device",
               stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}


class NotAFile(OSError):
    """A path autotune reads that holds something other than a regular file; `kind` says what."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(errno.EINVAL, f"it is {kind}, not a file", path)
        self.kind = kind


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of the regular file at `path`. Anything else is refused before a byte is
    read (`NotAFile`): it is opened without blocking and judged by fstat, so a named pipe with no
    writer or a device can never hang the reader. Raises OSError or UnicodeDecodeError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotAFile(os.fspath(path), NOT_REGULAR.get(stat.S_IFMT(mode), "not a regular file"))
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")


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
