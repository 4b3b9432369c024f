"""Standard output and error that may be closed or unwritable: a cron job that closed them, a
daemon without them, `> /dev/full`, a reader that went away. A closed stream is replaced by the null
device before anything prints (what would have been written is discarded, and the command's own
exit code stands); a stream that cannot be written raises `OutputFailed`, one line on stderr where
stderr can still take it, exit code 1."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, TextIO

from autotune.base.errors import RunFailed


class OutputFailed(RunFailed):
    """Writing to standard output or error failed (full, or a closed pipe); `stream`: which."""

    def __init__(self, message: str, stream: str) -> None:
        super().__init__(message)
        self.stream = stream


class Guarded:
    """A text stream whose write errors say which stream failed."""

    def __init__(self, stream: TextIO, name: str, label: str) -> None:
        self._stream, self._name, self._label = stream, name, label

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise OutputFailed(self._failed(exc), self._name) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise OutputFailed(self._failed(exc), self._name) from None

    def _failed(self, exc: OSError) -> str:
        return (f"cannot write to {self._label} ({exc.strerror or exc}); what the command measured or wrote is "
                f"kept in its study and files; send the output where it can be written")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def is_terminal(stream: TextIO | None) -> bool:
    """A terminal, not a pipe, a file or nothing (a stream that was closed before autotune started)."""
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return bool(stream is not None and stream.isatty())
    return False


def guard() -> None:
    """Closed streams become the null device; open ones say which stream failed to write."""
    for name, label in (("stdout", "standard output"), ("stderr", "standard error")):
        stream = getattr(sys, name)
        if isinstance(stream, Guarded):
            continue
        if stream is None or _closed(stream):
            stream = open(os.devnull, "w")  # noqa: SIM115  # lives as long as the process
        setattr(sys, name, Guarded(stream, name, label))


def _closed(stream: TextIO) -> bool:
    """Closed, or a file descriptor the process was started without; a stream with no descriptor at
    all (one in memory, as tests capture output with) is open."""
    if getattr(stream, "closed", False):
        return True
    try:
        descriptor = stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation: no descriptor behind it
        return False
    try:
        os.fstat(descriptor)
    except OSError:
        return True
    return False


def settle() -> None:
    """Flush what is buffered while failures can still be told; after a failure, point the
    standard streams at the null device so that the interpreter's exit does not fail again."""
    for name in ("stdout", "stderr"):
        try:
            getattr(sys, name).flush()
        except (OutputFailed, OSError, ValueError):
            _to_null(name)


def discard(name: str) -> None:
    """What goes to the failed stream from now on is discarded."""
    _to_null(name)


def _to_null(name: str) -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError):
        os.dup2(null, 1 if name == "stdout" else 2)
    os.close(null)
    setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115
