"""The peer runtimes' packages, named twice: in each backend's module (found, versioned, told how
to install) and as pyproject.toml's extras (what `pip install 'autotune[openvino]'` installs)."""

from __future__ import annotations

import re

import pytest

from autotune.model import backends
from tests.conftest import ROOT

tomllib = pytest.importorskip("tomllib")


def test_each_runtime_s_extra_installs_exactly_the_packages_it_needs() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    concerns = [backends.needs(b.name, generates) for b in backends.REGISTRY for generates in (False, True)]
    for spec in (packages for packages in concerns if packages):
        names = tuple(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0] for requirement in extras[spec.extra])
        assert names == spec.distributions, spec.extra
        assert f"'autotune[{spec.extra}]'" in spec.install


def setup_extras() -> set[str]:
    """The extras ./setup.sh installs autotune with (`-e ".[test,...]"`)."""
    found = re.search(r'extras="([\w,-]+)"', (ROOT / "setup.sh").read_text())
    assert found, "setup.sh installs autotune without extras"
    return set(found.group(1).split(","))


def test_setup_installs_llama_cpp_for_the_tests_and_when_asked() -> None:
    text = (ROOT / "setup.sh").read_text()
    assert 'extras+=",llamacpp"' in text and '[ "${1:-}" = "--test" ] && LLAMACPP=1' in text
    assert "--llamacpp" in text and "--llamacpp" in (ROOT / "README.md").read_text()


def test_setup_installs_the_peers_extras() -> None:
    assert {"openvino", "openvino-genai", "onnxruntime"} <= setup_extras()
