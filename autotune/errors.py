"""User-facing errors: each one is printed as a single `Error: ...` line with exit code 2."""

from __future__ import annotations


class AutotuneError(Exception):
    """A mistake the user can fix: the message says what was wrong and what to do."""


class ConfigError(AutotuneError):
    """A knob name or value that is not allowed."""


class ModelError(AutotuneError):
    """A model specification that cannot be resolved."""


class LibraryMissing(AutotuneError):
    """A library a knob needs is not installed on this machine."""


class TopologyError(AutotuneError):
    """A CPU description that cannot be read or a placement that cannot fit."""


class RunFailed(Exception):
    """A measurement that ran and failed (exit code 1): not the user's input, but not a success."""
