"""An OpenVINO or ONNX Runtime configuration deployed for real, as a user does: `search` measures it,
`export --artifacts` converts it once, and the user's program, run by `autotune run`, deploys it
with the same single `apply` line as a PyTorch configuration, getting torch tensors back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.model import envfile
from tests.conftest import NEEDS_PEERS
from tests.fixtures.models import tinynets
from tests.support.cli import AUTOTUNE

pytestmark = [pytest.mark.e2e, NEEDS_PEERS]

QUICK = ["--duration", "0.2", "--warmup", "1", "--warmup-time", "0", "--min-iterations", "3"]
PROGRAM = """
import json, torch, autotune, tinynets
model = tinynets.cnn()
example = torch.randn(1, 3, 32, 32)
served = autotune.apply(model, example)            # the one line a user's program has
output = served(example)
print(json.dumps({"type": type(output).__name__, "shape": list(output.shape), "hit": served.setup["artifact_hit"],
                  "file": served.setup["artifact_file"], "knobs": served.knobs.describe(),
                  "err": float((output - model(example)).abs().max())}))
"""


def autotune_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUTOTUNE, *args], cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize(("space", "knobs"), [
    ("knobs:\n  backend: [openvino]\n  ov_hint: [throughput]\n", "backend=openvino ov_hint=throughput"),
    ("knobs:\n  backend: [onnxruntime]\n  ort_execution: [parallel]\n", "backend=onnxruntime ort_execution=parallel"),
])
def test_search_export_and_run_deploy_a_peer_with_one_apply_line(tmp_path: Path, space: str, knobs: str) -> None:
    shutil.copy(tinynets.__file__, tmp_path / "tinynets.py")
    (tmp_path / "space.yaml").write_text(space)
    found = autotune_cli(tmp_path, "search", "--model", "tinynets:cnn", "--input-shape", "3x32x32", "--trials", "3",
                         "--space", "space.yaml", "--replicates", "1", "--confirm-top", "0", "--json", *QUICK)
    assert found.returncode == 0, found.stderr
    measured = {t["config"]: t["number"] for t in json.loads(found.stdout)["best"]}  # the peer recipe ran too
    assert set(measured) == {"defaults", knobs.split()[0], knobs}, measured
    exported = autotune_cli(tmp_path, "export", "best.env", "--trial", str(measured[knobs]), "--artifacts", "compiled")
    assert exported.returncode == 0, exported.stderr
    [artifact] = (tmp_path / "compiled").glob("*.json")
    env = envfile.parse((tmp_path / "best.env").read_text()).env
    assert env["AUTOTUNE_BACKEND"] == knobs.split()[0].partition("=")[2]
    served = autotune_cli(tmp_path, "run", "best.env", "--", sys.executable, "-c", PROGRAM)
    assert served.returncode == 0 and "warning" not in served.stderr, served.stderr
    result = json.loads(served.stdout)
    assert result["type"] == "Tensor" and result["shape"] == [1, 10] and result["knobs"] == knobs
    assert result["hit"] is True and result["file"] == str(artifact)[:-5]  # export's artifact, loaded
    assert result["err"] < 1e-4


ZETA = "import torch\nclass Zeta(torch.nn.Module):\n    def forward(self, x):\n" \
       "        return torch.special.zeta(x.abs() + 2, x.abs() + 1)\ndef make():\n    return Zeta()\n"


@pytest.mark.parametrize("command", [("bench",), ("search", "--trials", "2")])
def test_a_model_the_converter_rejects_is_a_bad_input_and_nothing_is_written(tmp_path: Path,
                                                                              command: tuple[str, ...]) -> None:
    (tmp_path / "zeta.py").write_text(ZETA)
    before = sorted(p.name for p in tmp_path.iterdir())
    refused = autotune_cli(tmp_path, *command, "--model", "zeta:make", "--input-shape", "4", "--set",
                           "backend=openvino", *QUICK)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines()[-1] == (
        "Error: backend=openvino: openvino.convert_model could not convert the model at aten.special_zeta "
        "(OpConversionFailure: Check 'false' failed at src/frontends/common_translators/src/"
        "unconverted_ops_report.cpp:151:); use another backend for it")
    assert "Traceback" not in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == before
