"""No circle among autotune's modules: every import, at module level, inside a function or under
`if TYPE_CHECKING:`, points one way, so each module can be read (and imported) after the ones it names.

import-linter's layers contract holds the packages in order; inside one package it sees nothing, and
the model package once grew a ring (the knob table imported the backends' registry, the backends
imported conversion, conversion imported the kernel probe, which read the registry). grimp, the
graph import-linter builds on, draws every import; a circle is a strongly connected set of modules.
Imports that only name types count too: a ring closed by them (the backends naming the knob table's
`ModelKnobs` while the table reads the backends' registry) is the same tangle for a reader, and the
types a module below needs live below it (`knobdefs.ModelSettings`, `backends.base.Quantized`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Set
from pathlib import Path

import grimp
import pytest


def imports_of(package: str) -> dict[str, set[str]]:
    """Each module of `package` and the modules of `package` it imports, those under TYPE_CHECKING too."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=False, cache_dir=None)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}


def circles(edges: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in edges.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            ring = []
            while True:
                member = stack.pop()
                ring.append(member)
                if member == node:
                    break
            if len(ring) > 1:
                found.append(sorted(ring))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for node in edges:
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    """autotune's imports, drawn once for the module's tests."""
    return imports_of("autotune")


def test_no_circle_among_autotune_modules(edges: dict[str, set[str]]) -> None:
    assert len(edges) > 100  # the whole package was drawn
    rings = circles(edges)
    assert not rings, "modules that import each other around a circle:\n" + "\n".join(
        " ".join(ring) + "\n  " + "\n  ".join(f"{m} -> {sorted(edges[m] & set(ring))}" for m in ring)
        for ring in rings)


def test_the_model_package_reads_in_one_order(edges: dict[str, set[str]]) -> None:
    """The row type, the backends, their registry, the knob table, conversion, the probe's child:
    each imports only what comes before it."""
    order = ["autotune.model.knobdefs", "autotune.model.backends.base", "autotune.model.backends.pytorch",
             "autotune.model.backends", "autotune.model.knobs", "autotune.model.convert",
             "autotune.model.backends.probe"]
    for later, name in enumerate(order):
        above = set(order[later + 1:])
        assert not edges[name] & above, f"{name} imports {sorted(edges[name] & above)}, which come after it"
    assert "autotune.model.envfile" not in edges["autotune.model.knobdefs"]  # the row type is not the file format


@pytest.mark.parametrize("body", ["import planted.b\n", "def late():\n    from planted import b\n",
                                  "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import planted.b\n"])
def test_a_planted_circle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(body)
    (package / "b.py").write_text("from planted import c\n")
    (package / "c.py").write_text("import planted.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert circles(imports_of("planted")) == [["planted.a", "planted.b", "planted.c"]]


def test_a_circle_is_a_strongly_connected_set() -> None:
    assert circles({"a": {"b"}, "b": set()}) == []
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"c"}}) == [["a", "b"]]
