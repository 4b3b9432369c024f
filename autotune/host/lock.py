"""One benchmark per machine at a time: two measuring at once spoil each other's timings.

`bench`, `search`, `confirm`, `compare`, `profile` and `export --artifacts` hold an exclusive `flock` on one
file for the whole machine while they measure or compile. The kernel releases it when its holder
dies, however it dies, so a lock left by a killed autotune is simply taken over. The file holds a
small JSON description of its holder (command, pid, start time) for the one waiting; a holder
empties it on the way out, so a description found on taking the lock names a holder that was
killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from autotune.base.errors import AutotuneError

LOCK_ENV = "AUTOTUNE_LOCK"
# The same file for every user (not per uid): timings are spoiled whoever else measures.
DEFAULT_LOCK = Path("/tmp/autotune.host.lock")
EVERYONE_RW = 0o666


class MachineBusy(AutotuneError):
    """Another autotune is measuring on this machine and the user asked not to wait."""


@dataclass(frozen=True)
class Holder:
    """Who holds the lock."""

    command: str
    pid: int
    started: float  # seconds since the epoch

    def describe(self) -> str:
        started = time.strftime("%H:%M", time.localtime(self.started))
        return f"autotune {self.command}, pid {self.pid}, started {started}"


def lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or DEFAULT_LOCK)


@contextlib.contextmanager
def machine_lock(command: str, wait: bool, say: Callable[[str], None]) -> Iterator[None]:
    """Hold the machine for `command`; when another autotune holds it, wait (saying for whom) or,
    with `wait=False`, fail at once naming it."""
    path = lock_path()
    fd = _open(path)
    try:
        _acquire(fd, path, wait, say)
    except BaseException:  # busy, or Ctrl-C while waiting: the holder's description stays
        os.close(fd)
        raise
    try:
        left = read_holder(fd)
        if left is not None:
            say(f"note: took over the machine lock {path} from {left.describe()}, which was killed")
        _write(fd, Holder(command, os.getpid(), time.time()))
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # a clean exit leaves no holder behind
        os.close(fd)


def _acquire(fd: int, path: Path, wait: bool, say: Callable[[str], None]) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        holder = read_holder(fd)
    who = holder.describe() if holder else "another autotune"
    if not wait:
        raise MachineBusy(f"this machine is busy: {who} is measuring (lock {path}); run again when it has "
                          f"finished, or without --no-wait to wait for it")
    say(f"waiting for {who} (one benchmark per machine at a time; Ctrl-C to give up)")
    fcntl.flock(fd, fcntl.LOCK_EX)


def _open(path: Path) -> int:
    """Open the lock file, creating it writable by everyone. An existing file is opened without
    O_CREAT: in a sticky /tmp, O_CREAT on another user's file is refused (protected_regular)."""
    try:
        try:
            return os.open(path, os.O_RDWR)
        except FileNotFoundError:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, EVERYONE_RW)
            with contextlib.suppress(OSError):
                os.fchmod(fd, EVERYONE_RW)  # past the umask
            return fd
    except OSError as exc:
        raise AutotuneError(f"cannot open the machine lock {path}: {exc.strerror}; set {LOCK_ENV} to a file "
                            f"every autotune user can write") from None


def read_holder(fd: int) -> Holder | None:
    """The description in the lock file, or None when it is empty or unreadable."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
        return Holder(str(data["command"]), int(data["pid"]), float(data["started"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _write(fd: int, holder: Holder) -> None:
    data = json.dumps(asdict(holder)).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
