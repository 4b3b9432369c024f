"""The two failures a configuration can have inside the child and in `autotune.apply`."""

from __future__ import annotations

LOAD_FAILED = "cannot load the model file"  # how a .pt/.pt2 that torch cannot load is reported, child to harness


class ApplyError(Exception):
    """A configuration that cannot run here or answers wrongly; the message says why and what to do."""


class WrongAnswers(ApplyError):
    """The converted model's output differs from eager fp32 beyond the tolerance."""
