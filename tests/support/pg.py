"""A real PostgreSQL server for the tests: Debian's binaries, `initdb` + `pg_ctl` in a temporary
folder, on a free port, stopped at the end. `initdb` refuses root, so as root the server runs as
the `postgres` user (created by Debian's package) in a folder that user owns."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

INSTALL = "apt-get install -y postgresql (setup.sh --test does it)"
MAX_CONNECTIONS = 100  # PostgreSQL's own default; benchmarks/fleet_scale.py asks for what its workers need
START_TIMEOUT_S = 60


class NoServer(RuntimeError):
    """PostgreSQL's server binaries are not installed."""


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    user: str
    max_connections: int = MAX_CONNECTIONS

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database on the server; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(host=self.host, port=self.port, user=self.user, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def connections(self, database: str) -> int:
        """Client connections to `database` now (pg_stat_activity)."""
        import psycopg

        with psycopg.connect(host=self.host, port=self.port, user=self.user, dbname="postgres",
                             autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)).fetchone()
        return int(row[0]) if row else 0


def bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        raise NoServer(f"PostgreSQL's server binaries (initdb, pg_ctl) are not installed; {INSTALL}")
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(max_connections: int = MAX_CONNECTIONS) -> Iterator[Server]:
    """A running server for the block, stopped and removed after it. `max_connections` counts every
    client (a worker of the fleet holds two or three: its main thread's, the study lock's, its
    heartbeat's); one more is refused at once ("too many clients"), never kept waiting."""
    binaries, port = bin_dir(), free_port()
    folder = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    data = folder / "data"
    owner = _owner(folder)
    try:
        _as(owner, [str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"])
        options = (f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c max_connections={max_connections} "
                   "-c fsync=off -c synchronous_commit=off")
        _as(owner, [str(binaries / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-o", options,
                    "-w", "-t", str(START_TIMEOUT_S), "start"])
        try:
            yield Server("127.0.0.1", port, "postgres", max_connections)
        finally:
            _as(owner, [str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _owner(folder: Path) -> pwd.struct_passwd | None:
    """As root: the `postgres` user, made owner of `folder`; otherwise None (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    user = pwd.getpwnam("postgres")
    os.chown(folder, user.pw_uid, user.pw_gid)
    return user


def _as(owner: pwd.struct_passwd | None, command: list[str]) -> None:
    def drop() -> None:
        if owner is not None:
            os.setgid(owner.pw_gid)
            os.setuid(owner.pw_uid)

    done = subprocess.run(command, preexec_fn=drop, capture_output=True, text=True, cwd="/")
    if done.returncode:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
