"""One study shared by many workers on a real PostgreSQL server (tests/pg.py)."""

from __future__ import annotations

import optuna
import pytest

from autotune import storage

pytestmark = pytest.mark.postgres


def test_a_study_on_postgresql_is_created_and_loaded_with_heartbeats(pg_url: str) -> None:
    made = storage.create("s", pg_url, [optuna.study.StudyDirection.MINIMIZE], optuna.samplers.RandomSampler(),
                          optuna.pruners.NopPruner())
    made.set_user_attr("model", "m")
    loaded = storage.load("s", pg_url)
    assert loaded.user_attrs == {"model": "m"}
    assert loaded._storage.get_heartbeat_interval() == storage.HEARTBEAT_INTERVAL_S
