"""`autotune compare A B --fail-if-slower PCT`: a regression gate for CI (a fake runner stands in
for the benchmark processes; the protocol is the same interleaved one)."""

from __future__ import annotations

import json
import random

import pytest

from autotune.measure import runner
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import PlanRunner, one_by_one
from autotune.measure.results import RunResult
from tests.support.cli import run_cli
from tests.support.studies import fake_result


def fake_pair(slow_knob: str, slowdown: float) -> PlanRunner:
    """Latency 100 ms with 3% noise per run; `slowdown` times that when the plan sets `slow_knob`."""
    rng = random.Random(3)

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        base = 100.0 * (slowdown if plan.config.get(slow_knob) == "jemalloc" else 1.0) * rng.uniform(0.97, 1.03)
        return fake_result([base - 0.5, base, base + 0.5])

    return runner


@pytest.mark.parametrize(("second", "slowdown", "code", "verdict"), [
    ("allocator=jemalloc", 1.25, 1, "FAIL: allocator=jemalloc is slower than defaults by more than 5%"),
    ("defaults", 1.0, 0, "PASS: no slowdown of defaults #2 beyond 5% of defaults #1 shown"),
    ("allocator=jemalloc", 1.02, 0, "PASS: no slowdown of allocator=jemalloc beyond 5% of defaults shown"),
    ("allocator=jemalloc", 0.7, 0, "PASS: no slowdown of allocator=jemalloc beyond 5% of defaults shown"),
])
def test_the_gate_exits_1_only_for_a_significant_slowdown_past_the_margin(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], second: str, slowdown: float, code: int,
        verdict: str) -> None:
    monkeypatch.setattr(runner, "run_series", one_by_one(fake_pair("allocator", slowdown)))
    got, out, err = run_cli(capsys, "compare", "defaults", second, "--model", "resnet18", "--rounds", "10",
                            "--fail-if-slower", "5%", "--seed", "1")
    assert got == code, err
    assert verdict in out
    assert "two-sided sign test p=" in out and "against a 5% slowdown" in out


def test_a_failed_run_fails_the_gate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def crashing(plan: LaunchPlan, timeout_s: float) -> RunResult:
        return RunResult(False, "instance 0: crashed with SIGSEGV", (), 1.0)

    monkeypatch.setattr(runner, "run_series", one_by_one(crashing))
    got, out, _ = run_cli(capsys, "compare", "defaults", "defaults", "--model", "resnet18", "--rounds", "6",
                          "--fail-if-slower", "5")
    assert got == 1 and "FAIL: no verdict without every run" in out


def test_a_comparison_a_failed_run_prevented_exits_1(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Without the gate too: a contender that failed is a measured result that failed, not a bad input."""
    def crashing(plan: LaunchPlan, timeout_s: float) -> RunResult:
        return RunResult(False, "instance 0: crashed with SIGSEGV", (), 1.0)

    monkeypatch.setattr(runner, "run_series", one_by_one(crashing))
    got, out, _ = run_cli(capsys, "compare", "defaults", "allocator=jemalloc", "--model", "resnet18", "--rounds", "5",
                          "--json")
    data = json.loads(out)
    assert got == 1 and data["comparison"] is None
    assert data["reason"] == "a run failed (instance 0: crashed with SIGSEGV)"


GIVE = "give a percentage from 0 to 100, like 5%"


@pytest.mark.parametrize(("args", "message"), [
    (["--fail-if-slower", "x"], f"Error: --fail-if-slower 'x' is not a margin; {GIVE}"),
    (["--fail-if-slower", "-1%"], f"Error: --fail-if-slower '-1%' is not a margin; {GIVE}"),
    (["--fail-if-slower", "5%", "--rounds", "5"], "Error: --rounds 5 can never show a slowdown with "
                                                  "--fail-if-slower: the smallest two-sided signed-rank p is 2/32; "
                                                  "use --rounds 6 or more"),
])
def test_bad_gate_flags_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    got, out, err = run_cli(capsys, "compare", "defaults", "defaults", "--model", "resnet18", *args)
    assert (got, out) == (2, "") and err == message + "\n"


def test_a_configuration_needs_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    got, _, err = run_cli(capsys, "compare", "defaults", "allocator=jemalloc")
    assert got == 2 and err == ("Error: 'defaults' is a configuration; comparing configurations needs --model\n")


def test_the_gate_says_its_numbers_in_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "run_series", one_by_one(fake_pair("allocator", 1.25)))
    got, out, _ = run_cli(capsys, "compare", "defaults", "allocator=jemalloc", "--model", "resnet18", "--rounds", "8",
                          "--fail-if-slower", "5%", "--seed", "1", "--json")
    data = json.loads(out)
    assert got == 1 and (data["kind"], data["schema_version"]) == ("compare", 1)
    gate = data["gate"]
    assert gate["failed"] is True and gate["exit_code"] == 1 and gate["margin"] == 0.05 and gate["rounds"] == 8
    assert gate["p_value"] < 0.05 and gate["speedup"] < 0.85 and gate["interval"]["label"] == "95% CI"
    assert [c["label"] for c in data["contenders"]] == ["defaults", "allocator=jemalloc"]
