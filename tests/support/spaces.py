"""Sampling a search space without optuna."""

from __future__ import annotations

from typing import Any


class FakeTrial:
    """Picks the last choice and the top of each range: the hardest case for the constraints."""

    def __init__(self) -> None:
        self.asked: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.asked[name] = list(choices)
        return choices[-1]

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        self.asked[name] = (low, high)
        return high


def every(space: Any) -> list[Any]:
    """Every configuration of a space small enough to list: a test over them must not pass on none
    (`configurations()` gives None for a space too large to list)."""
    found = space.configurations()
    assert found, f"{space.source} lists no configuration (None: too large to list); test a smaller space"
    return list(found)
