"""Where studies live: names, storage URLs, creating and loading them, and the one path by which a
storage failure becomes a user-facing error."""

from __future__ import annotations

import contextlib
import re
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import sqlalchemy.exc

from autotune.errors import AutotuneError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
SQLITE = "sqlite:///"
CREATE_ATTEMPTS = 3  # a brand-new SQLite file opened by two processes at once can race on its schema
# A running trial's autotune writes a heartbeat this often; a RUNNING trial without one for
# GRACE_PERIOD_S was left by a killed autotune (on any host: containers change hostnames).
HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 60


class StudyError(AutotuneError):
    """A study that does not exist, does not match the request, or cannot be used."""


def safe_name(text: str) -> str:
    """`text` with every character outside letters, digits, '.', '_' and '-' replaced by '_'."""
    return UNSAFE.sub("_", text)


def check_name(name: str) -> str:
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
    """Every way a storage can fail to open, as one `StudyError` naming it and what to check."""
    try:
        yield
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        raise storage_error(url, str(exc).splitlines()[0]) from None


def storage_error(url: str, reason: str) -> StudyError:
    return StudyError(f"cannot open the study storage {url}: {reason}; check --storage (and the driver it needs)")


@contextmanager
def quiet_optuna() -> Iterator[None]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _rdb(url: str) -> optuna.storages.RDBStorage:
    """The one storage construction for every study opened here, heartbeat enabled."""
    with quiet_optuna():
        return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_INTERVAL_S,
                                          grace_period=GRACE_PERIOD_S)


def create(name: str, url: str, directions: list[optuna.study.StudyDirection],
           sampler: optuna.samplers.BaseSampler, pruner: optuna.pruners.BasePruner) -> optuna.Study:
    """Create or load; the schema-creation race of a brand-new SQLite file is retried."""
    if url.startswith(SQLITE):
        Path(url[len(SQLITE):]).parent.mkdir(parents=True, exist_ok=True)
    with storage_errors(url):
        for attempt in range(CREATE_ATTEMPTS):
            try:
                with quiet_optuna():
                    return optuna.create_study(study_name=name, storage=_rdb(url), load_if_exists=True,
                                               directions=directions, sampler=sampler, pruner=pruner)
            except sqlalchemy.exc.IntegrityError:
                if attempt == CREATE_ATTEMPTS - 1:
                    raise storage_error(url, "the database is being created by another process") from None
                time.sleep(0.5)
    raise AssertionError("unreachable")


def find_study(studies_dir: Path, name: str | None, storage: str | None) -> optuna.Study:
    """Load an existing study without creating anything: by name, or the newest under studies/."""
    if storage:
        if name is None:
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
    try:
        with quiet_optuna(), storage_errors(storage):
            return optuna.load_study(study_name=name, storage=_rdb(storage))
    except KeyError:
        raise StudyError(f"no study {name!r} in {storage}") from None


def ask(study: optuna.Study) -> optuna.Trial:
    """A new trial; Optuna warns that heartbeats are meant for `optimize`, but `heartbeat` below
    does that loop's job for ask/tell."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage", category=UserWarning)
        return study.ask()


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
    """A missed beat (database busy) is not fatal: the grace period spans several."""
    while True:
        with contextlib.suppress(sqlalchemy.exc.SQLAlchemyError):
            storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
        if stop.wait(HEARTBEAT_INTERVAL_S):
            return


def stale_trial_ids(study: optuna.Study) -> set[int]:
    """RUNNING trials whose heartbeat stopped more than GRACE_PERIOD_S ago (Optuna's own test)."""
    backend = study._storage
    if not optuna.storages._heartbeat.is_heartbeat_enabled(backend):
        return set()
    return set(backend._get_stale_trial_ids(study._study_id))  # type: ignore[attr-defined]
