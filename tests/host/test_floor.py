"""This host's spread floor (host/floor.py): what a window's spread is judged against, learned from
the windows nothing disturbed, kept per host in the cache folder and shown by `autotune doctor`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.host import floor


def test_no_floor_is_said_before_enough_undisturbed_windows() -> None:
    few = floor.Floor((0.05,) * (floor.MIN_WINDOWS - 1))
    assert few.threshold is None and "not known yet (7 of the 8" in few.describe()
    assert floor.Floor((0.05,) * floor.MIN_WINDOWS).threshold == 0.05


def test_the_floor_is_the_spread_19_in_20_undisturbed_windows_stay_under() -> None:
    spreads = tuple(i / 100 for i in range(1, 101))  # 1% .. 100%
    found = floor.Floor(spreads)
    assert found.threshold == 0.95
    assert found.describe().startswith("95.0% IQR/median (95% of 100 undisturbed windows spread less")


def test_adding_keeps_the_most_recent_windows_and_drops_what_is_not_a_spread() -> None:
    full = floor.Floor((0.5,) * floor.KEPT).adding([0.01, float("nan"), -1.0, float("inf")])
    assert len(full.spreads) == floor.KEPT and full.spreads[-1] == 0.01 and full.spreads[0] == 0.5
    same = floor.Floor((0.1,)).adding([float("nan")])
    assert same == floor.Floor((0.1,))


def test_a_floor_is_kept_per_host_in_the_cache_folder_and_read_back(tmp_path: Path) -> None:
    kept = floor.here(tmp_path, 2).adding([0.12] * 10)
    floor.save(kept)
    assert kept.path is not None and kept.path.parent == tmp_path / "floor"
    again = floor.here(tmp_path, 2)
    assert again.spreads == (0.12,) * 10 and again.threshold == 0.12
    assert floor.here(tmp_path, 4).spreads == ()  # another core count: another host as far as timing goes


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", '{"spreads": "wide"}', '{"spreads": [0.1, "x"]}'])
def test_a_damaged_floor_file_is_no_floor_and_the_next_save_replaces_it(tmp_path: Path, text: str) -> None:
    where = floor.here(tmp_path, 2).path
    assert where is not None
    where.parent.mkdir(parents=True)
    where.write_text(text)
    damaged = floor.here(tmp_path, 2)
    assert damaged.spreads == ()
    floor.save(damaged.adding([0.2] * 8))
    assert json.loads(where.read_text())["spreads"] == [0.2] * 8


def test_a_floor_that_cannot_be_written_is_kept_in_memory_only(tmp_path: Path) -> None:
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder should be")
    kept = floor.here(blocked, 2).adding([0.1] * 8)
    floor.save(kept)  # no exception: a search goes on with the floor it has
    assert kept.threshold == 0.1
