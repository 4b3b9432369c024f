"""The peer runtimes' packages, named twice: in child/runtimes.py (found, versioned, told how to
install) and as pyproject.toml's extras (what `pip install 'autotune[openvino]'` installs)."""

from __future__ import annotations

import re

import pytest

from autotune.child import runtimes
from tests.conftest import ROOT

tomllib = pytest.importorskip("tomllib")


def test_each_runtime_s_extra_installs_exactly_the_packages_it_needs() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for backend, spec in runtimes.RUNTIMES.items():
        names = tuple(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0] for requirement in extras[backend])
        assert names == spec.distributions, backend
        assert f"'autotune[{backend}]'" in spec.install


def setup_extras() -> set[str]:
    """The extras ./setup.sh installs autotune with (`-e ".[test,...]"`)."""
    found = re.search(r'-e "\.\[([\w,]+)\]"', (ROOT / "setup.sh").read_text())
    assert found, "setup.sh installs autotune without extras"
    return set(found.group(1).split(","))


def test_setup_installs_both_extras() -> None:
    assert {"openvino", "onnxruntime"} <= setup_extras()
