"""What a JSON file autotune keeps must hold, said once per file as a schema and checked where the
file is read: the kernel probe (`autotune.host.capabilities`), an artifact's description
(`autotune.model.artifacts`), a measurement kept beside a study (`autotune.study.records`).

A schema is a checker: a function of the value and where it is (`kernels[2].runs`) that returns
the value as its reader may use it, or raises `SchemaError` saying where and what was wrong. A
file whose schema fails is never half used: its reader refuses it in one line, or, for a cache,
treats it as missing and says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")
Check = Callable[[Any, str], T]


class SchemaError(ValueError):
    """A value that is not what its schema says; the message names where it is and what it holds."""


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _wrong(where: str, value: Any, wanted: str) -> SchemaError:
    return SchemaError(f"{where or 'the file'}: {_shown(value)} is not {wanted}")


def text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _wrong(where, value, "a string")
    return value


def integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(where, value, "a whole number")
    return value


def positive(value: Any, where: str) -> int:
    if integer(value, where) < 1:
        raise _wrong(where, value, "a whole number above 0")
    return int(value)


def number(value: Any, where: str) -> float:
    """A finite number (JSON allows NaN and Infinity to be read, not to be measured)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _wrong(where, value, "a finite number")
    return float(value)


def real(value: Any, where: str) -> float:
    """A number, NaN and infinity included (a measured error that is no number says so)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong(where, value, "a number")
    return float(value)


def flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _wrong(where, value, "true or false")
    return value


def scalar(value: Any, where: str) -> str | int | float | bool | None:
    """A knob's value: a string, a number, true or false, or null."""
    if value is not None and not isinstance(value, (str, int, float, bool)):
        raise _wrong(where, value, "a string, number, true, false or null")
    return value


def choice(*allowed: str) -> Check[str]:
    """One of `allowed` (a state, a cause)."""

    def check(value: Any, where: str) -> str:
        if value not in allowed:
            raise _wrong(where, value, f"one of {', '.join(allowed)}")
        return str(value)

    return check


def anything(value: Any, where: str) -> Any:
    return value


def optional(check: Check[T]) -> Check[T | None]:
    """`check`'s value, or null."""
    return lambda value, where: None if value is None else check(value, where)


def list_of(item: Check[T]) -> Check[list[T]]:
    def check(value: Any, where: str) -> list[T]:
        if not isinstance(value, list):
            raise _wrong(where, value, "a list")
        return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]

    return check


def map_of(item: Check[T], key: Check[Any] = text) -> Check[dict[str, T]]:
    """An object whose every value passes `item` (and key, `key`: `numbered` for thread counts)."""

    def check(value: Any, where: str) -> dict[str, T]:
        if not isinstance(value, dict):
            raise _wrong(where, value, "an object")
        for k in value:
            key(k, f"{where}.{k}")
        return {k: item(v, f"{where}.{k}") for k, v in value.items()}

    return check


def numbered(value: Any, where: str) -> str:
    """An object's key that is a count (a thread count: "1", "16")."""
    if not (isinstance(value, str) and value.isdigit() and int(value) > 0):
        raise SchemaError(f"{where}: the key {_shown(value)} is not a whole number above 0")
    return value


def record(required: Mapping[str, Check[Any]],
           present: Mapping[str, Check[Any]] | None = None) -> Check[dict[str, Any]]:
    """An object with every `required` key and, where present, the `present` ones, each passing its
    check; other keys are kept as they are (a newer autotune may add some)."""
    known = {**(present or {}), **required}

    def check(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _wrong(where, value, "an object")
        missing = [k for k in required if k not in value]
        if missing:
            raise SchemaError(f"{where or 'the file'}: {missing[0]!r} is missing")
        inner = f"{where}." if where else ""
        return {k: known[k](v, f"{inner}{k}") if k in known else v for k, v in value.items()}

    return check


def loads(data: str, check: Check[T]) -> T:
    """A JSON text as `check` says it must be; SchemaError when it is not JSON, or not that."""
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise SchemaError(f"not JSON: {exc}") from None
    except RecursionError:
        raise SchemaError("not JSON: nested too deeply") from None
    return check(value, "")
