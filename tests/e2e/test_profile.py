"""`autotune profile` for real: a two-trial resnet18 study, profiled in the trials' own launches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import autotune

pytestmark = pytest.mark.e2e

QUICK = ["--duration", "0.3", "--warmup", "1", "--warmup-time", "0.1", "--min-iterations", "5"]
# Trial 1 is certain: the only configuration this space holds (two bound instances, jemalloc).
SPACE = "knobs:\n  instances: {low: 2, high: 2}\n  allocator: [jemalloc]\n"
STUDY = "resnet18-bs1-latency"


@pytest.fixture(scope="module")
def studied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("profile")
    (cwd / "space.yaml").write_text(SPACE)
    made = autotune(cwd, "search", "--model", "resnet18", "--space", "space.yaml", *QUICK, "--trials", "2",
                    "--replicates", "1", "--confirm-top", "0")
    assert made.returncode == 0, made.stderr
    return cwd


def test_profile_saves_both_traces_and_the_baseline_runs_aten_ops(studied: Path) -> None:
    proc = autotune(studied, "profile", "--trial", "1", "--iterations", "3")
    assert proc.returncode == 0, proc.stderr
    folder = studied / "studies" / "profiles" / STUDY
    for name in ("baseline", "trial-1"):
        assert json.loads((folder / f"{name}.trace.json").read_text())["traceEvents"]
    summary = json.loads((folder / "profile.json").read_text())
    base, chosen = summary["configurations"]
    assert (base["label"], chosen["label"], chosen["instances"]) == ("baseline", "trial 1", 2)
    assert "aten::conv2d" in {op["name"] for op in base["ops"]}
    assert base["ops"][0]["name"].startswith("aten::") and summary["changed"]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("│ 1 ")]
    assert rows and rows[0].split("│")[2].strip().startswith("aten::"), proc.stdout
    assert "trial 1 runs 2 instances: instance 0 was profiled" in proc.stdout
    assert "jemalloc" in chosen["runtime"]["malloc_library"] and len(chosen["runtime"]["affinity"]) == 1
    assert "jemalloc" not in base["runtime"]["malloc_library"]


def test_profile_of_an_env_file_alone(studied: Path) -> None:
    exported = autotune(studied, "export", "fast.env", "--trial", "1")
    assert exported.returncode == 0, exported.stderr
    proc = autotune(studied, "profile", "fast.env", "--no-baseline", "--iterations", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    [only] = json.loads(proc.stdout)["configurations"]
    assert (only["label"], only["config"], only["instances"]) == ("fast.env", "allocator=jemalloc instances=2", 2)
    assert sorted(p.name for p in (studied / "profiles" / "fast").iterdir()) == ["fast.trace.json", "profile.json"]
