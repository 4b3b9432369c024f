"""backend=openvino and backend=onnxruntime through `apply`: converted by the real runtimes, guarded
against eager fp32, saved once and loaded back, torch tensors in and out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import autotune
from autotune.deploy import cache, cache_prune
from autotune.model import apply, backends
from autotune.model.backends import base
from autotune.model.knobs import ModelKnobs
from tests.conftest import NEEDS_BF16, NEEDS_INT8, NEEDS_PEERS
from tests.fixtures.models import tinynets

pytestmark = NEEDS_PEERS

IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
CALIBRATION = [torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in range(4)]
PEERS = ("openvino", "onnxruntime")


def applied(model: nn.Module, example: object, knobs: ModelKnobs, folder: Path,
            calibration: list[object] | None = None) -> tuple[apply.Applied, dict[str, object]]:
    setup: dict[str, object] = {}
    result = apply.apply_deployment(model, example, apply.Deployment(knobs, artifacts=folder), check=True,
                                     setup=setup, calibration=calibration or CALIBRATION)
    return result, setup


@pytest.mark.parametrize(("backend", "precision"), [
    ("openvino", "fp32"), pytest.param("openvino", "int8", marks=NEEDS_INT8),
    ("onnxruntime", "fp32"), pytest.param("onnxruntime", "int8", marks=NEEDS_INT8)])
def test_converted_once_then_loaded_and_guarded(tmp_path: Path, backend: str, precision: str) -> None:
    knobs = ModelKnobs(backend=backend, precision=precision)  # type: ignore[arg-type]
    model = tinynets.cnn()
    _, built = applied(model, IMAGES, knobs, tmp_path)
    again, loaded = applied(model, IMAGES, knobs, tmp_path)
    assert built["artifact_hit"] is False and loaded["artifact_hit"] is True
    out = again(IMAGES)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 10) and out.dtype == torch.float32
    if precision == "fp32":
        assert float(loaded["max_rel_err"]) < 1e-4  # type: ignore[arg-type]
        torch.testing.assert_close(out, model(IMAGES), rtol=1e-4, atol=1e-5)
    else:
        assert loaded["top1_agreement"] == 1.0 and float(loaded["min_cosine"]) > 0.99  # type: ignore[arg-type]
        assert not torch.equal(out, model(IMAGES))  # quantized: close, not the same numbers


def test_the_runtime_settings_share_one_saved_file(tmp_path: Path) -> None:
    model = tinynets.cnn()
    _, first = applied(model, IMAGES, ModelKnobs(backend="openvino"), tmp_path)
    _, other = applied(model, IMAGES, ModelKnobs(backend="openvino", ov_hint="throughput", ov_streams=2,
                                                 ov_pinning=False), tmp_path)
    _, ort = applied(model, IMAGES, ModelKnobs(backend="onnxruntime"), tmp_path)
    _, parallel = applied(model, IMAGES, ModelKnobs(backend="onnxruntime", ort_execution="parallel",
                                                    ort_inter_threads=2, ort_optimization="basic"), tmp_path)
    assert other["artifact_hit"] is True and other["artifact_file"] == first["artifact_file"]
    assert parallel["artifact_hit"] is True and parallel["artifact_file"] == ort["artifact_file"]
    assert first["artifact_file"] != ort["artifact_file"]


@NEEDS_BF16
def test_openvino_bf16_is_guarded_by_the_bf16_tolerance(tmp_path: Path) -> None:
    _, setup = applied(tinynets.cnn(), IMAGES, ModelKnobs(backend="openvino", precision="bf16"), tmp_path)
    assert 0 < float(setup["max_rel_err"]) <= 5e-2  # type: ignore[arg-type]


class Pair(nn.Module):
    """Keyword inputs of two dtypes in, a dict of a tensor and a tuple out."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(50, 8), nn.Linear(8, 3)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> dict[str, object]:
        hidden = self.embed(input_ids) * mask[..., None]
        return {"logits": self.head(hidden.mean(dim=1)), "rest": (hidden.sum(dim=1), mask.sum(dim=1))}


@pytest.mark.parametrize("backend", PEERS)
def test_keyword_inputs_and_nested_outputs_come_back_as_torch(tmp_path: Path, backend: str) -> None:
    torch.manual_seed(0)
    model = Pair().eval()
    batch = {"input_ids": torch.randint(0, 50, (2, 6)), "mask": torch.ones(2, 6)}
    result, _ = applied(model, batch, ModelKnobs(backend=backend), tmp_path)  # type: ignore[arg-type]
    out, expected = result(**batch), model(**batch)
    swapped = result(mask=batch["mask"], input_ids=batch["input_ids"])  # keyword inputs in another order
    torch.testing.assert_close(swapped["logits"], out["logits"])
    assert set(out) == {"logits", "rest"} and isinstance(out["rest"], tuple)
    torch.testing.assert_close(out["logits"], expected["logits"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["rest"][0], expected["rest"][0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", PEERS)
def test_another_shape_is_refused(tmp_path: Path, backend: str) -> None:
    result, _ = applied(tinynets.cnn(), IMAGES, ModelKnobs(backend=backend), tmp_path)  # type: ignore[arg-type]
    with pytest.raises(autotune.ApplyError, match=r"^the compiled model takes inputs .*not .*; apply it with"):
        result(torch.randn(3, 3, 32, 32))


class Zeta(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.zeta(x.abs() + 2, x.abs() + 1)


@pytest.mark.parametrize(("backend", "model", "message"), [
    ("openvino", Zeta(), r"^backend=openvino: openvino.convert_model could not convert the model at "
                         r"aten.special_zeta \(.*\); use another backend for it$"),
    ("onnxruntime", tinynets.Branchy(), r"^backend=onnxruntime: torch.onnx.export could not convert the model at "
                                        r".*; use another backend for it$"),
])
def test_a_model_the_converter_rejects_is_one_line_and_nothing_saved(tmp_path: Path, backend: str, model: nn.Module,
                                                                     message: str) -> None:
    example = IMAGES if backend == "onnxruntime" else torch.randn(2, 4)
    with pytest.raises(autotune.ApplyError, match=message) as raised:
        applied(model.eval(), example, ModelKnobs(backend=backend), tmp_path)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)
    assert not list(tmp_path.iterdir())


def test_a_runtime_not_installed_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = base.importlib.util.find_spec
    monkeypatch.setattr(base.importlib.util, "find_spec", lambda name: None if name == "nncf" else real(name))
    with pytest.raises(autotune.ApplyError) as raised:
        applied(tinynets.cnn(), IMAGES, ModelKnobs(backend="openvino"), tmp_path)
    assert str(raised.value) == ("backend=openvino needs OpenVINO, and this environment lacks nncf; install it with "
                                 "pip install 'autotune[openvino]' (or: pip install openvino nncf)")


def test_openvino_runs_a_model_without_openvino_genai(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`pip install openvino nncf`, the usual OpenVINO setup: a model runs; only generating text needs GenAI."""
    real = base.importlib.util.find_spec
    monkeypatch.setattr(base.importlib.util, "find_spec", lambda name: None if name == "openvino_genai" else real(name))
    applied(tinynets.cnn(), IMAGES, ModelKnobs(backend="openvino"), tmp_path)
    assert backends.installed("openvino") and not backends.installed("openvino", generates=True)
    assert backends.not_installed("openvino", generates=True) == (
        "backend=openvino needs OpenVINO GenAI to generate text, and this environment lacks openvino_genai; install "
        "it with pip install 'autotune[openvino-genai]' (or: pip install openvino-genai openvino nncf)")


def test_the_cache_lists_and_removes_an_openvino_artifact_with_its_weights(tmp_path: Path) -> None:
    _, setup = applied(tinynets.cnn(), IMAGES, ModelKnobs(backend="openvino"), tmp_path / "artifacts")
    xml = Path(str(setup["artifact_file"]))
    entries = cache.scan(tmp_path, cache.Here.now())
    [entry] = [e for e in entries if e.kind == "openvino artifact"]
    assert entry.size > xml.with_suffix(".bin").stat().st_size > 0 and entry.unusable == ""
    meta = json.loads(Path(f"{xml}.json").read_text())
    assert meta["knobs"] == {"backend": "openvino", "precision": "fp32"}
    assert meta["runtime"] == backends.get("openvino").version()
    assert cache_prune.remove(entry) == ""
    assert not list((tmp_path / "artifacts").iterdir())


def test_an_artifact_of_another_runtime_version_is_not_loaded(tmp_path: Path) -> None:
    model = tinynets.cnn()
    _, setup = applied(model, IMAGES, ModelKnobs(backend="onnxruntime"), tmp_path)
    described = Path(f"{setup['artifact_file']}.json")
    meta = json.loads(described.read_text())
    stale = {**meta, "runtime": "0.1"}
    Path(str(setup["artifact_file"])).rename(tmp_path / "onnxruntime-0000000000000000.onnx")
    (tmp_path / "onnxruntime-0000000000000000.onnx.json").write_text(json.dumps(stale))
    described.unlink()
    _, again = applied(model, IMAGES, ModelKnobs(backend="onnxruntime"), tmp_path)
    assert again["artifact_hit"] is False
    assert any("runtime 0.1" in s for s in again["artifact_stale"])  # type: ignore[union-attr]
    [entry] = [e for e in cache.artifacts(tmp_path, cache.Here.now()) if e.path.name.startswith("onnxruntime-0000")]
    assert entry.unusable.startswith("built for onnxruntime 0.1, this is ")
