"""An internal error (a bug in autotune, or a failure it did not expect): one line for stderr,
and its traceback in a file of the temporary folder to report, with the command line, autotune's
version, Python and the platform."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shlex
import sys
import tempfile
import time
import traceback

import autotune

PREFIX, SUFFIX = "autotune-crash-", ".txt"
_PASSWORD = re.compile(r"(://[^/:@\s]*:)[^/@\s]+@")  # scheme://user:password@host, as in --storage


def error_line(exc: BaseException, args: list[str]) -> str:
    """What went wrong and where its traceback is, or why it could not be saved; one line."""
    what = f"internal error ({summary(exc)})"
    try:
        path = save(exc, args)
    except Exception as failed:  # the report is a courtesy: it must never hide the error itself
        return f"{what}; its traceback could not be saved ({summary(failed)}); rerun with --debug and please report it"
    return f"{what}; the traceback is in {path}; please report it"


def summary(exc: BaseException) -> str:
    """The exception's type and the first line of its message."""
    lines = redacted(str(exc)).splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def save(exc: BaseException, args: list[str]) -> str:
    """The report in a new file only this user can read (mkstemp: no name taken over); its path."""
    text = report(exc, args)
    fd, path = tempfile.mkstemp(prefix=PREFIX, suffix=SUFFIX, text=True)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as out:
            out.write(text)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)  # no half-written report left to mislead
        raise
    return path


def report(exc: BaseException, args: list[str]) -> str:
    header = [
        "autotune internal error",
        f"command: {shlex.join(['autotune', *args])}",
        f"autotune: {autotune.__version__}",
        f"python: {platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        f"platform: {platform.platform()}",
        f"time: {time.strftime('%Y-%m-%d %H:%M:%S %z')}",
    ]
    trace = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return redacted("\n".join(header) + "\n\n" + "".join(trace))


def redacted(text: str) -> str:
    """The text without the passwords of URLs: a report is meant to be shared."""
    return _PASSWORD.sub(r"\1***@", text)
