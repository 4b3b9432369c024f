"""What the command-line tests share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder autotune runs in, where nothing may be written."""
    folder = tmp_path / "here"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder
