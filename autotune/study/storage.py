"""Where studies live: names, storage URLs, creating and loading them, and the one path by which a
storage failure becomes a user-facing error."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import optuna
import sqlalchemy.exc
from optuna.trial import TrialState

from autotune.base.errors import FREE_DISK, AutotuneError

NAME_LENGTH = 100
NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_LENGTH - 1}}}$")
UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
SQLITE = "sqlite:///"
CREATE_ATTEMPTS = 3  # a brand-new database opened by several processes at once can race on its schema
SCHEMA_RACE = ("UNIQUE constraint", "already exists", "duplicate key")
LOCK_WAIT_S = 120.0  # how long a write waits for a study database another process holds locked
LOCK_PAUSE_S = (0.5, 5.0)  # first and longest pause between two attempts (doubling in between)
LOCKED = ("database is locked", "database table is locked")
DAMAGED = ("malformed", "file is not a database", "database disk image")
FULL = ("database or disk is full", "No space left on device", "Disk quota exceeded")
WAITING = "note: waiting for the study database (locked by another process)"
T = TypeVar("T")
# A running trial's autotune writes a heartbeat this often; a RUNNING trial without one for
# GRACE_PERIOD_S was left by a killed autotune (on any host: containers change hostnames).
HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 60
RETRIES_OF_A_DEAD_WORKERS_TRIAL = 1  # its configuration is enqueued again once, for any worker to run
ADVISORY_LOCK_BASE = 0x6175746F << 16  # "auto": the key space of autotune's per-study PostgreSQL locks


class StudyError(AutotuneError):
    """A study that does not exist, does not match the request, or cannot be used."""


class StudyLocked(StudyError):
    """Another process held the study database locked for longer than LOCK_WAIT_S."""


def safe_name(text: str) -> str:
    """`text` with every character outside letters, digits, '.', '_' and '-' replaced by '_'."""
    return UNSAFE.sub("_", text)


def check_name(name: str) -> str:
    if len(name) > NAME_LENGTH:
        raise StudyError(f"--study is {len(name)} characters long; give a name of at most {NAME_LENGTH}")
    if not NAME.match(name):
        raise StudyError(f"--study {name!r} is not a usable name; use letters, digits, '.', '_', '-'")
    return name


def storage_url(name: str, storage: str | None, studies_dir: Path) -> str:
    if storage:
        if "://" not in storage:
            raise StudyError(f"--storage {storage!r} is not a storage URL; use e.g. "
                             f"sqlite:///studies/{name}.db or postgresql://user@host/db")
        return storage
    return f"{SQLITE}{(studies_dir / f'{name}.db').resolve()}"


@contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Every way a storage can fail, as one `StudyError` naming it and what to do."""
    try:
        yield
    except sqlalchemy.exc.NoSuchModuleError:
        kind = url.partition("://")[0]
        raise StudyError(f"--storage {shown(url)}: {kind!r} is not a database autotune can use; give "
                         f"sqlite:///PATH.db or postgresql+psycopg://user@host/db") from None
    except ImportError as exc:  # the URL's database is known, its Python driver is not installed
        driver = getattr(_root(exc), "name", None) or _root_reason(exc)
        raise StudyError(f"--storage {shown(url)} needs the Python driver {driver!r}, which "
                         f"is not installed; install it into autotune's environment, or use "
                         f"postgresql+psycopg://user@host/db (setup.sh installs psycopg)") from None
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, ValueError) as exc:
        root = _root(exc)
        if isinstance(root, StudyError):  # raised inside, then a cleanup failed: already said, not again
            raise root from None
        raise storage_error(url, _root_reason(exc)) from None


def storage_error(url: str, reason: str) -> StudyError:
    if any(mark in reason for mark in DAMAGED):
        where = url[len(SQLITE):] if url.startswith(SQLITE) else shown(url)
        return StudyError(f"the study database {where} is damaged ({reason}); restore it from a copy or use "
                          "another --study")
    if any(mark in reason for mark in FULL):
        return StudyError(f"the disk holding the study database {shown(url)} is full ({reason}); {FREE_DISK} and "
                          "run again: the trials recorded so far are kept")
    if any(mark in reason for mark in LOCKED):
        return StudyLocked(f"the study database {shown(url)} is locked by another process ({reason}); close what "
                           "holds it (optuna-dashboard, sqlite3) and rerun")
    return StudyError(f"cannot open the study storage {shown(url)}: {reason}; check --storage (and the driver it "
                      f"needs)")


def shown(url: str) -> str:
    """The storage URL as printed or stored in a report: its password as ***."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        return url


def check_existing(url: str) -> None:
    """A SQLite file that a command reads must already be a study database: Optuna would make
    one of a missing file, an empty one or another program's database instead of saying so."""
    if not url.startswith(SQLITE):
        return
    path = Path(url[len(SQLITE):])
    if not path.is_file():
        raise StudyError(f"no study database at {path}; give the file a search wrote (--storage "
                         f"sqlite:///studies/NAME.db), or run `autotune search --storage {url}` to make one")
    try:
        with _closing(sqlite3.connect(path)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        if any(mark in str(exc) for mark in LOCKED):
            return  # the reads that follow wait for the lock
        raise storage_error(url, str(exc)) from None
    if "studies" not in tables:
        what = "an empty file" if not tables else "another program's database"
        raise StudyError(f"{path} is not a study database ({what}); give the file a search wrote, e.g. "
                         f"--storage sqlite:///studies/NAME.db")


def _root(exc: BaseException) -> BaseException:
    """The innermost cause: optuna wraps sqlalchemy, which wraps the driver."""
    inner = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    while inner is not None:
        exc, inner = inner, inner.__cause__ or (None if inner.__suppress_context__ else inner.__context__)
    return exc


def _root_reason(exc: BaseException) -> str:
    """The first line of the innermost cause."""
    exc = _root(exc)
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0] if text else type(exc).__name__


def patiently(url: str, action: Callable[[], T], note: Callable[[str], None] | None = None) -> T:
    """`action` (reads and writes of the study at `url`), retried with backoff while another
    process holds the database locked, up to LOCK_WAIT_S; one note says why it waits. Any other
    storage failure, or the lock outlasting the wait, is a `StudyError`."""
    deadline, pause, attempt = time.monotonic() + LOCK_WAIT_S, LOCK_PAUSE_S[0], 0
    while True:
        try:
            with storage_errors(url), _repeatable(attempt):
                return action()
        except StudyLocked:
            if time.monotonic() + pause > deadline:
                raise StudyLocked(f"the study database {shown(url)} stayed locked by another process for "
                                  f"{LOCK_WAIT_S:g} s") from None
        if attempt == 0:
            (note or _to_stderr)(WAITING)
        time.sleep(pause)
        pause, attempt = min(2 * pause, LOCK_PAUSE_S[1]), attempt + 1


@contextmanager
def _repeatable(attempt: int) -> Iterator[None]:
    """A retried action repeats what went through before the lock: Optuna warns about re-reported
    intermediate values, which are the same values."""
    with warnings.catch_warnings():
        if attempt:
            warnings.filterwarnings("ignore", message=".*is already reported", category=UserWarning)
        yield


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def keep_aside(url: str, studies_dir: Path, stem: str, data: dict[str, Any]) -> Path:
    """What could not be written to the study, as a JSON file beside it (`stem`.unsaved.json)."""
    folder = _aside(url, studies_dir)
    path = folder / f"{safe_name(stem)}.unsaved.json"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def kept_aside(url: str, studies_dir: Path, name: str) -> list[Path]:
    """The files `keep_aside` wrote for study `name`'s trials, oldest trial first."""
    return sorted(_aside(url, studies_dir).glob(f"{safe_name(name)}.trial-*.unsaved.json"))


def _aside(url: str, studies_dir: Path) -> Path:
    return Path(url[len(SQLITE):]).parent if url.startswith(SQLITE) else studies_dir


def check_intact(url: str) -> None:
    """A SQLite study file whose pages were damaged fails later, in any read; say so at open."""
    path = Path(url[len(SQLITE):]) if url.startswith(SQLITE) else None
    if path is None or not path.is_file():
        return
    try:
        with _closing(sqlite3.connect(path)) as db:
            rows = db.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.DatabaseError as exc:
        if any(mark in str(exc) for mark in LOCKED):
            return  # the writes that follow wait for the lock
        raise storage_error(url, str(exc)) from None
    if rows != [("ok",)]:
        detail = " ".join(str(rows[0][0]).replace("*** in database main ***", "").split())
        raise storage_error(url, f"database disk image is malformed: {detail}")


@contextmanager
def _closing(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    try:
        yield db
    finally:
        db.close()


@contextmanager
def quiet_optuna() -> Iterator[None]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _rdb(url: str) -> optuna.storages.RDBStorage:
    """The one storage construction for every study opened here, heartbeat enabled."""
    with quiet_optuna():
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=RETRIES_OF_A_DEAD_WORKERS_TRIAL)
        return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_INTERVAL_S,
                                          grace_period=GRACE_PERIOD_S, heartbeat_stale_trial_callback=retry)


def is_server(url: str) -> bool:
    """A database server (PostgreSQL, MySQL) that several workers share, not a SQLite file."""
    return not url.startswith("sqlite")


@contextmanager
def exclusive(study: optuna.Study) -> Iterator[None]:
    """The block runs in one worker of the study at a time: a PostgreSQL advisory lock on the
    study, which the server releases if the worker dies. Elsewhere (SQLite: one search per study)
    nothing to do."""
    engine = getattr(getattr(study._storage, "_backend", study._storage), "engine", None)
    if engine is None or engine.dialect.name != "postgresql":
        yield
        return
    key = {"key": ADVISORY_LOCK_BASE + study._study_id}
    with storage_errors(str(engine.url)), engine.connect() as conn:
        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), key)
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), key)
            conn.commit()


def create(name: str, url: str, directions: list[optuna.study.StudyDirection],
           sampler: optuna.samplers.BaseSampler, pruner: optuna.pruners.BasePruner) -> optuna.Study:
    """Create or load; the schema-creation race of a brand-new SQLite file is retried."""
    if url.startswith(SQLITE):
        Path(url[len(SQLITE):]).parent.mkdir(parents=True, exist_ok=True)
    check_intact(url)
    with storage_errors(url):
        for attempt in range(CREATE_ATTEMPTS):
            try:
                with quiet_optuna():
                    return optuna.create_study(study_name=name, storage=_rdb(url), load_if_exists=True,
                                               directions=directions, sampler=sampler, pruner=pruner)
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as exc:
                if not _schema_race(exc):
                    raise
                if attempt == CREATE_ATTEMPTS - 1:
                    raise storage_error(url, "the database is being created by another process") from None
                time.sleep(0.5)
    raise AssertionError("unreachable")


def _schema_race(exc: sqlalchemy.exc.DBAPIError) -> bool:
    """Another process created the same table, type or study a moment before."""
    return isinstance(exc, sqlalchemy.exc.IntegrityError) or any(m in _root_reason(exc) for m in SCHEMA_RACE)


def find_study(studies_dir: Path, name: str | None, storage: str | None) -> optuna.Study:
    """Load an existing study without creating anything: by name, or the newest under studies/."""
    if storage:
        if name is None:
            check_existing(storage)
            check_intact(storage)
            with storage_errors(storage):
                names = optuna.get_all_study_names(storage)
            if len(names) != 1:
                raise StudyError(f"--storage holds {len(names)} studies; pick one with --study")
            name = names[0]
        return load(name, storage)
    if name is None:
        dbs = sorted(studies_dir.glob("*.db"), key=lambda p: p.stat().st_mtime)
        if not dbs:
            raise StudyError(f"no study in {studies_dir}/; run `autotune search --model M` first")
        name = dbs[-1].stem
    path = studies_dir / f"{name}.db"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in studies_dir.glob("*.db"))) or "none"
        raise StudyError(f"no study {name!r} in {studies_dir}/ (studies there: {known})")
    return load(name, f"{SQLITE}{path.resolve()}")


def load(name: str, storage: str) -> optuna.Study:
    """An existing study; nothing is created."""
    check_existing(storage)
    check_intact(storage)
    try:
        with quiet_optuna(), storage_errors(storage):
            return optuna.load_study(study_name=name, storage=_rdb(storage))
    except KeyError:
        raise StudyError(f"no study {name!r} in {shown(storage)}") from None


def ask(study: optuna.Study) -> optuna.Trial:
    """A new trial: the oldest trial enqueued through Optuna when one waits, as `study.ask` does.
    Optuna warns that heartbeats are meant for `optimize`, but `heartbeat` below does that loop's
    job for ask/tell."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage", category=UserWarning)
        return study.ask()


def take(study: optuna.Study, waiting_id: int | None) -> optuna.Trial:
    """The enqueued trial `waiting_id` (None, or taken by another meanwhile: a new trial), never
    another one that waits, as `study.ask` would take."""
    study._thread_local.cached_all_trials = None  # what study.ask does first: the sampler reads afresh
    backend = study._storage
    if waiting_id is None or not backend.set_trial_state_values(waiting_id, state=TrialState.RUNNING):
        waiting_id = backend.create_new_trial(study._study_id)
    return optuna.Trial(study, waiting_id)


@contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Beat for `trial` while the block runs, so that another autotune can tell it is alive."""
    stop = threading.Event()
    beater = threading.Thread(target=_beat, args=(study._storage, trial._trial_id, stop),
                              name="autotune-heartbeat", daemon=True)
    beater.start()
    try:
        yield
    finally:
        stop.set()
        beater.join()


def _beat(storage: optuna.storages.BaseStorage, trial_id: int, stop: threading.Event) -> None:
    """A missed beat is not fatal: the grace period spans several. Any error is a missed beat
    (Optuna turns a failed commit into StorageInternalError): a beater that died on the first
    one would leave a live worker's trial to be failed and measured again elsewhere."""
    while True:
        with contextlib.suppress(Exception):
            storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
        if stop.wait(HEARTBEAT_INTERVAL_S):
            return


def first_beat(trial: optuna.Trial) -> None:
    """The trial's first heartbeat, written while it is claimed: Optuna finds a trial stale only
    by a heartbeat, so a worker killed before its beater's first beat would leave it RUNNING."""
    backend = trial.study._storage
    if optuna.storages._heartbeat.is_heartbeat_enabled(backend):
        backend.record_heartbeat(trial._trial_id)  # type: ignore[attr-defined]


def after_stale(study: optuna.Study, trial_id: int) -> None:
    """What the storage's heartbeat callback does with a dead worker's trial (retry it), as
    optuna.storages.fail_stale_trials does after failing it."""
    callback = study._storage.get_heartbeat_stale_trial_callback()  # type: ignore[attr-defined]
    if callback is not None:
        callback(study, study._storage.get_trial(trial_id))


def stale_trial_ids(study: optuna.Study) -> set[int]:
    """RUNNING trials whose heartbeat stopped more than GRACE_PERIOD_S ago (Optuna's own test)."""
    backend = study._storage
    if not optuna.storages._heartbeat.is_heartbeat_enabled(backend):
        return set()
    return set(backend._get_stale_trial_ids(study._study_id))  # type: ignore[attr-defined]
