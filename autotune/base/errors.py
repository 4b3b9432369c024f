"""User-facing errors: each one is printed as a single `Error: ...` line with exit code 2."""

from __future__ import annotations

import signal


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


# What to do about a full disk, wherever autotune meets one (the CLI, the study storage).
FREE_DISK = ("free space there (`autotune cache` shows what compiled models take, `autotune cache --prune "
             "--older-than 1d` removes those unused for a day)")
INTERRUPTED_BY = "interrupted by"  # how every trial cut short by a stop from outside begins its reason
SIGNAL_CAUSES = {"SIGINT": "the user (Ctrl-C)", "SIGTERM": "SIGTERM (asked to stop)",
                 "SIGHUP": "SIGHUP (the terminal closed)"}


class Interrupted(KeyboardInterrupt):
    """A stop from outside: Ctrl-C or a signal; says which, and exits with 128 + its number."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def reason(self) -> str:
        name = signal.Signals(self.signum).name
        return f"{INTERRUPTED_BY} {SIGNAL_CAUSES.get(name, name)}"


def interrupt_reason(exc: KeyboardInterrupt) -> str:
    """Why a run stopped: a plain KeyboardInterrupt is Ctrl-C."""
    return exc.reason if isinstance(exc, Interrupted) else Interrupted().reason
