"""Adding a text-generation runtime is one module and one registry line: the toy runtime of
tests/support/toy_generator.py, registered as a pytest plugin, is run by the contract suite
(tests/model/test_generator_contract.py) like every registered one, without a line of the suite
naming it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autotune.model import backends
from tests.conftest import ROOT

SUITE = "tests/model/test_generator_contract.py"


def test_the_contract_suite_runs_a_runtime_added_by_one_module_and_one_registry_line() -> None:
    assert "toy" not in [b.name for b in backends.generating()]  # registered only where the plugin is loaded
    pytest.importorskip("transformers")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", SUITE, "-p", "tests.support.toy_generator", "-k", "toy", "-q",
         "-p", "no:cacheprovider", "-o", "addopts=--strict-markers -rs",
         "-W", "ignore::pytest.PytestAssertRewriteWarning"],  # the plugin imports tests.support before rewriting
        cwd=ROOT, env={**os.environ, "CI": "true"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = subprocess.run([sys.executable, "-m", "pytest", SUITE, "--collect-only", "-q", "-p",
                                "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    per_runtime = sum(1 for line in collected.stdout.splitlines() if "[eager]" in line)
    assert per_runtime >= 5 and f"{per_runtime} passed" in done.stdout, done.stdout[-3000:]
    assert "[toy]" not in collected.stdout  # the toy ran because it was registered, not because it is named
