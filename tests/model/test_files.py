"""`model.files`: every file autotune writes for someone else appears whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.model.files import replacing, write_atomically


def test_a_write_that_fails_halfway_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), replacing(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed while writing")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_the_temporary_keeps_the_suffix_a_writer_needs_and_is_renamed_over(tmp_path: Path) -> None:
    path = tmp_path / "model.pt2"
    with replacing(path, suffix=".pt2") as tmp:
        assert tmp.parent == tmp_path and tmp.name.endswith(".tmp.pt2") and not tmp.exists()
        tmp.write_bytes(b"graph")
    assert path.read_bytes() == b"graph"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt2"]


def test_a_link_is_written_through_and_a_pipe_refused(tmp_path: Path) -> None:
    (tmp_path / "real.env").write_text("old")
    (tmp_path / "link.env").symlink_to(tmp_path / "real.env")
    write_atomically(tmp_path / "link.env", "new")
    assert (tmp_path / "link.env").is_symlink() and (tmp_path / "real.env").read_text() == "new"
    assert oct((tmp_path / "real.env").stat().st_mode & 0o777) == "0o644"
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(OSError, match="not a regular file"):
        write_atomically(tmp_path / "pipe", "x")
