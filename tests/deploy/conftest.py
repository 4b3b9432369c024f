"""What the deploy tests share: a finished study to export from."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.host.machine import Machine
from autotune.search import loop, opening
from tests.support.studies import SPACE, fake_runner


@pytest.fixture
def searched(tmp_path: Path, here: Machine) -> optuna.Study:
    """A finished, seeded 8-trial search of the fake runner, its study under tmp_path/studies."""
    opened = opening.open_search(opening.SearchRequest(
        model="resnet18", trials=8, space=SPACE, studies_dir=tmp_path / "studies", seed=0), here)
    loop.run_search(opened, here, lambda e: None, runner=fake_runner)
    return opened.study
