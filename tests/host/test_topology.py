from __future__ import annotations

from pathlib import Path

import pytest

from autotune.base.errors import TopologyError
from autotune.host.topology import Topology, format_cpus, from_lscpu_file, parse_lscpu
from tests.conftest import lscpu


def test_xeon_two_sockets_with_hyperthreading() -> None:
    topo = lscpu("xeon_2s_ht")
    assert topo.sockets == (0, 1)
    assert topo.nodes == (0, 1)
    assert len(topo.all_cores) == 8
    assert topo.threads_per_core == 2
    assert topo.smt_siblings()[0] == (8,)
    assert topo.usable_cores[4].cpus == (4, 12)
    assert topo.usable_cores[4].node == 1


def test_cloud_vm_with_gaps_and_no_numa_field() -> None:
    topo = lscpu("cloud_vm_gaps")
    assert sorted(topo.allowed) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert topo.nodes == (0,)
    assert [c.cpus for c in topo.usable_cores] == [(0, 1), (2, 3), (8, 9), (10, 11)]


def test_restricted_cpu_set_keeps_partially_allowed_cores() -> None:
    full = lscpu("xeon_2s_ht")
    topo = Topology(full.cpus, frozenset({2, 10, 3, 5}))
    assert [c.cpus for c in topo.usable_cores] == [(2, 10), (3,), (5,)]
    assert len(topo.all_cores) == 8


def test_parse_rejects_garbage_with_line_number() -> None:
    with pytest.raises(TopologyError, match=r"line 2: expected CPU,Core,Socket,Node numbers, got 'a,b'"):
        parse_lscpu("# CPU,Core,Socket,Node\na,b\n")


def test_parse_rejects_empty_and_duplicates() -> None:
    with pytest.raises(TopologyError, match="lists no CPUs"):
        parse_lscpu("# only comments\n")
    with pytest.raises(TopologyError, match="same CPU id twice"):
        parse_lscpu("0,0,0,0\n0,0,0,0\n")


def test_unreadable_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match=r"cannot read --lscpu file .*No such file.*lscpu --parse"):
        from_lscpu_file(tmp_path / "missing.txt")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TopologyError, match="cannot read --lscpu file"):
        from_lscpu_file(binary)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [([0, 1, 2, 3], "0-3"), ([0, 2, 3, 8], "0,2-3,8"), ([5], "5"), ([], "")],
)
def test_format_cpus(cpus: list[int], text: str) -> None:
    assert format_cpus(cpus) == text
