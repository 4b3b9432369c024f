"""Issue-5 knobs and model sources for real, on tiny models: each knob's effect is reported by the
child, the guard rejects wrong answers, every model source works, bad specs are one line + exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES, NEEDS_BF16
from tests.support.cli import AUTOTUNE

pytestmark = pytest.mark.e2e

TINY = FIXTURES / "models" / "tinynets.py"
QUICK = ["--duration", "0.2", "--warmup", "1", "--warmup-time", "0", "--min-iterations", "3"]


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding tinynets.py plus the same MLP saved as TorchScript and as an exported program."""
    folder = tmp_path_factory.mktemp("models")
    shutil.copy(TINY, folder / "tinynets.py")
    script = (
        "import torch, tinynets\n"
        "m = tinynets.mlp()\n"
        "torch.jit.save(torch.jit.script(m), 'mlp.pt')\n"
        "batch = torch.export.Dim('batch', min=1, max=1024)\n"
        "ep = torch.export.export(m, (torch.randn(2, 64),), dynamic_shapes=({0: batch},))\n"
        "torch.export.save(ep, 'mlp.pt2')\n"
        "torch.save(m.state_dict(), 'weights.pt')\n"  # a zip archive, but not a model
        "torch.save(m.state_dict(), 'weights.pt2')\n"
    )
    subprocess.run([sys.executable, "-W", "ignore", "-c", script], cwd=folder, check=True, capture_output=True)
    return folder


def bench(cwd: Path, *args: str) -> tuple[int, Any, str]:
    proc = subprocess.run([AUTOTUNE, "bench", *QUICK, "--json", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


@pytest.mark.parametrize(
    ("knob", "runtime", "output_dtype"),
    [
        ("backend=torchscript", {"backend": "torchscript"}, "float32"),
        ("backend=inductor", {"backend": "inductor"}, "float32"),
        ("memory_format=channels_last", {"memory_format": "channels_last"}, "float32"),
        pytest.param("precision=bf16", {"precision": "bf16"}, "bfloat16", marks=NEEDS_BF16),
    ],
)
def test_each_knob_is_applied_and_checked(here: Path, knob: str, runtime: dict[str, str], output_dtype: str) -> None:
    code, data, err = bench(here, "--model", "tinynets:cnn", "--input-shape", "3x32x32", "--set", knob)
    assert code == 0, err
    inst = data["result"]["instances"][0]
    for key, value in runtime.items():
        assert inst["runtime"][key] == value
    setup = inst["setup"]
    assert setup["output_dtype"] == output_dtype
    assert setup["max_rel_err"] <= setup["tolerance"]
    if knob == "backend=inductor":
        assert setup["first_forward_s"] > 0  # the compile, recorded apart from latency


@NEEDS_BF16
def test_the_guard_fails_a_configuration_with_wrong_answers(here: Path) -> None:
    code, data, _ = bench(here, "--model", "tinynets:cnn", "--input-shape", "3x32x32", "--set", "precision=bf16",
                          "--tolerance", "0")
    assert code == 1
    reason = data["result"]["reason"]
    assert reason.startswith("instance 0: wrong answers: output differs from eager fp32 by max relative error")
    assert reason.endswith("> tolerance 0; raise --tolerance to accept it")
    assert data["result"]["instances"][0]["wrong_answers"] is True  # what a search reads (quality_records.wrong_models)


@pytest.mark.parametrize("model", ["tinynets:mlp", "mlp.pt", "mlp.pt2"])
def test_every_model_source_runs_a_non_image_model(here: Path, model: str) -> None:
    code, data, err = bench(here, "--model", model, "--input-shape", "64", "--batch-size", "4")
    assert code == 0, err
    assert data["plan"]["bench"]["item_shape"] == [64]
    assert data["result"]["throughput_ips"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nosuch.mod:make"], "Error: no module named 'nosuch.mod' (looked in "),
        (["--model", "tinynets:broken", "--input-shape", "64"],
         "Error: model tinynets:broken does not run on input shape 64: model factory tinynets:broken failed: "
         "ValueError: weights file missing"),
        (["--model", "tinynets:not_a_module"], "returned int, not a torch.nn.Module"),
        (["--model", "missing.pt2"], "Error: cannot read model file 'missing.pt2': No such file or directory"),
        (["--model", "weights.pt"], "Error: cannot load the model file "),
        (["--model", "weights.pt2"], "Error: cannot load the model file "),
        (["--model", "tinynets:mlp", "--input-shape", "3x32x32"],
         "Error: model tinynets:mlp does not run on input shape 3x32x32: RuntimeError: mat1 and mat2 shapes"),
        (["--model", "tinynets:mlp", "--input-shape", "64xx"], "Error: --input-shape '64xx' is not a shape"),
    ],
)
def test_bad_model_specs_are_one_line_and_exit_code_2(here: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([AUTOTUNE, "bench", *QUICK, *args], cwd=here, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.startswith("Error: ")
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""
    if "weights.pt" in args:
        assert proc.stderr.rstrip().endswith("; save the model with torch.jit.save")
    if "weights.pt2" in args:
        assert proc.stderr.rstrip().endswith("; save the model with torch.export.save")


@pytest.mark.parametrize("name", ["weights.pt", "weights.pt2"])
def test_a_file_that_is_no_model_leaves_nothing_behind(here: Path, tmp_path: Path, name: str) -> None:
    shutil.copy(here / name, tmp_path / name)  # a zip archive torch opens, then finds no model in
    proc = subprocess.run([AUTOTUNE, "bench", *QUICK, "--model", name], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "cannot load the model file" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no empty studies/cache/inductor tree


def test_throughput_search_over_batch_sizes_under_a_latency_limit(here: Path) -> None:
    space = here / "tiny.yaml"
    space.write_text("knobs:\n  backend: [eager, torchscript]\n")
    proc = subprocess.run(
        [AUTOTUNE, "search", "--model", "tinynets:mlp", "--input-shape", "64", "--objective", "throughput",
         "--batch-size", "1,8,64", "--max-latency-ms", "1000", "--trials", "4", "--space", str(space),
         "--replicates", "1", "--confirm-top", "0", *QUICK], cwd=here, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    import optuna

    study = optuna.load_study(study_name="tinynets_mlp-bs1-8-64-throughput-p90max1000ms",
                              storage=f"sqlite:///{here}/studies/tinynets_mlp-bs1-8-64-throughput-p90max1000ms.db")
    trials = [t for t in study.get_trials() if t.state.name == "COMPLETE"]
    assert trials[0].user_attrs["batch_size"] == 1 and trials[0].user_attrs["baseline"]
    assert all("feasible" in t.user_attrs and "constraint_latency_p90_over_limit_ms" in t.user_attrs for t in trials)
    assert {t.params.get("batch_size") for t in trials[1:]} <= {1, 8, 64}
