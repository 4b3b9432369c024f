"""The env file format `autotune export` writes: bash `unset` and `export` lines, comments, all
values single-quoted. Parsed without a shell, by the parent (`autotune run`) and by `apply`."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

HEADER = "# autotune configuration"


class EnvFileError(ValueError):
    """Text that is not an env file `autotune export` wrote; the message names the line."""


@dataclass(frozen=True)
class Parsed:
    env: dict[str, str]
    unset: tuple[str, ...]


SWITCH = {"on": True, "off": False}  # how a switch is spelled everywhere: CLI, YAML, env files


def value_text(value: object) -> str:
    """A knob value as users type it: switches are on/off, everything else as it prints."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def quote(value: str) -> str:
    """Always single-quoted, so no value is ever expanded or split by the shell; a control
    character (a newline would end the line this format reads) cannot be carried at all."""
    if has_control(value):
        raise EnvFileError(f"{value!r} holds a control character (newline, CR, NUL, ...) that an env file "
                           f"cannot carry safely")
    return "'" + value.replace("'", "'\"'\"'") + "'"


def has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def comment(text: str) -> str:
    """A comment line that stays one comment line: control characters are shown escaped."""
    return "".join(repr(c)[1:-1] if ord(c) < 32 or ord(c) == 127 else c for c in text)


def read(path: str | os.PathLike[str]) -> Parsed:
    """The env file at `path`, for `autotune run`, `compare`, `profile`, `cache` and `apply` alike;
    the EnvFileError it raises names the file, what was wrong with it and what to do."""
    name = os.fspath(path)
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not text"
        raise EnvFileError(f"cannot read env file {name}: {reason}; give a file made by `autotune export`") from None
    if not text.startswith(HEADER):
        raise EnvFileError(f"{name} is not an autotune env file; make one with `autotune export {name}`")
    try:
        return parse(text)
    except EnvFileError as exc:
        raise EnvFileError(f"{name}: {exc}; export it again") from None


def parse(text: str) -> Parsed:
    """The `export` and `unset` lines of an env file (comments and blank lines ignored)."""
    if not text.startswith(HEADER):
        raise EnvFileError("not an autotune env file (it does not start with the autotune header)")
    env: dict[str, str] = {}
    unset: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise EnvFileError(f"line {number}: {exc}") from None
        if words[0] == "unset":
            unset += words[1:]
        elif words[0] == "export" and len(words) == 2 and "=" in words[1]:
            key, _, value = words[1].partition("=")
            env[key] = value
        else:
            raise EnvFileError(f"line {number}: not an export or unset line: {line[:80]!r}")
    return Parsed(env, tuple(unset))
