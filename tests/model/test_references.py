"""A process that only loads a compiled artifact uses the eager model's kept fingerprint and outputs
(`model.references`) instead of building the model, and still checks its answers with them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torchvision.transforms.v2 import functional as F

import autotune
from autotune.child import build, inputs, worker
from autotune.model import references
from tests.conftest import ROOT
from tests.fixtures.models import tinynets

IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))


def child_args(tmp_path: Path, *extra: str) -> Any:
    return worker.parse_args(["--model", "tinycnn", "--item-shape", "3x32x32", "--backend", "torchscript",
                              "--cache-dir", str(tmp_path), "--result", "unused", *extra])


@pytest.fixture
def tinycnn(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`--model tinycnn` builds tinynets.cnn as if torchvision had it; the list counts the builds."""
    built: list[str] = []

    def load_model(spec: str, import_path: str, task: str = "") -> Any:
        built.append(spec)
        return tinynets.cnn()

    monkeypatch.setattr(build, "load_model", load_model)
    return built


def test_the_second_process_loads_the_artifact_without_building_the_model(tmp_path: Path,
                                                                          tinycnn: list[str]) -> None:
    first: dict[str, Any] = {}
    build.build(child_args(tmp_path), IMAGES, first)
    again: dict[str, Any] = {}
    forward = build.build(child_args(tmp_path), IMAGES, again)
    assert tinycnn == ["tinycnn"]  # built once, by the first process
    assert first["eager_model"] == "built" and again["eager_model"] == "kept outputs"
    assert again["artifact_hit"] is True and again["artifact_file"] == first["artifact_file"]
    assert again["max_rel_err"] == first["max_rel_err"] and again["output_digest"] == first["output_digest"]
    with torch.no_grad():
        assert torch.allclose(forward(IMAGES), tinynets.cnn()(IMAGES), atol=1e-5)  # frozen: batch norm folded
    (entry,) = (tmp_path / references.FOLDER).glob("*/*.pt")
    assert entry.parent.name == torch.__version__


def test_the_kept_outputs_still_judge_the_answers(tmp_path: Path, tinycnn: list[str]) -> None:
    """The guard compares with what was kept: outputs that eager fp32 never gave fail the check."""
    build.build(child_args(tmp_path), IMAGES, {})
    (entry,) = (tmp_path / references.FOLDER).glob("*/*.pt")
    kept = references.lookup(entry)
    assert kept is not None
    references.remember(entry, references.Known(kept.weights, [[t * 2 for t in kept.outputs[0]]]))
    with pytest.raises(autotune.WrongAnswers, match="wrong answers: output differs from eager fp32"):
        build.build(child_args(tmp_path), IMAGES, {})


@pytest.mark.parametrize("change", ["damaged entry", "other inputs", "other torchvision", "artifact removed",
                                    "factory spec"])
def test_without_a_usable_entry_and_artifact_the_model_is_built(tmp_path: Path, tinycnn: list[str],
                                                                monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    build.build(child_args(tmp_path), IMAGES, {})
    (entry,) = (tmp_path / references.FOLDER).glob("*/*.pt")
    example, args = IMAGES, child_args(tmp_path)
    if change == "damaged entry":
        entry.write_bytes(b"not a torch.save file")
    elif change == "other inputs":
        example = IMAGES + 1
    elif change == "other torchvision":
        monkeypatch.setattr(references, "_torchvision_version", lambda: "0.0.1")
    elif change == "artifact removed":
        for artifact in (tmp_path / "artifacts").glob("torchscript-*.pt"):
            artifact.unlink()
    else:
        monkeypatch.syspath_prepend(str(Path(tinynets.__file__).parent))
        args = child_args(tmp_path, "--model", "tinynets:cnn")
    setup: dict[str, Any] = {}
    build.build(args, example, setup)
    assert setup["eager_model"] == "built"
    assert len(tinycnn) == 2


def test_a_new_compile_of_a_known_model_reuses_its_kept_outputs(tmp_path: Path, tinycnn: list[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Another configuration (here: the artifact gone) builds the model to compile it, but eager
    fp32's outputs on the same inputs are kept already: not computed again (for int8, 33 batches),
    and still what the guard judges with."""
    first: dict[str, Any] = {}
    build.build(child_args(tmp_path), IMAGES, first)
    for artifact in (tmp_path / "artifacts").glob("torchscript-*.pt"):
        artifact.unlink()
    computed: list[int] = []
    real = build.apply.eager_outputs
    monkeypatch.setattr(build.apply, "eager_outputs",
                        lambda model, batches: computed.append(1) or real(model, batches))
    again: dict[str, Any] = {}
    build.build(child_args(tmp_path), IMAGES, again)
    assert again["eager_model"] == "built" and len(tinycnn) == 2 and computed == []
    assert again["max_rel_err"] == first["max_rel_err"]
    (entry,) = (tmp_path / references.FOLDER).glob("*/*.pt")
    kept = references.lookup(entry)
    assert kept is not None
    references.remember(entry, references.Known(kept.weights, [[t * 2 for t in kept.outputs[0]]]))
    for artifact in (tmp_path / "artifacts").glob("torchscript-*.pt"):
        artifact.unlink()
    with pytest.raises(autotune.WrongAnswers, match="wrong answers: output differs from eager fp32"):
        build.build(child_args(tmp_path), IMAGES, {})


def test_only_torchvision_names_qualify() -> None:
    assert references.applies("resnext101_32x8d")
    assert not any(map(references.applies, ["pkg.mod:make", "model.pt", "model.pt2"]))


def test_the_preprocessing_is_torchvisions_bit_for_bit() -> None:
    generator = torch.Generator().manual_seed(0)
    for height, width in [(375, 500), (500, 375), (224, 224), (300, 301), (64, 97)]:
        image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)
        for short_side, crop in [(256, (224, 224)), (73, (64, 64))]:
            expected = F.resize(image, [short_side], antialias=True)
            expected = F.to_dtype(F.center_crop(expected, list(crop)), torch.float32, scale=True)
            expected = F.normalize(expected, mean=list(inputs.MEAN), std=list(inputs.STD))
            assert torch.equal(inputs.preprocess(image, short_side, crop), expected), (height, width, short_side)


@pytest.mark.e2e
def test_a_loading_process_imports_neither_torchvision_nor_dynamo(tmp_path: Path) -> None:
    """The point of it: a real torchvision model, two child processes; the second never imports
    torchvision or torch._dynamo, and its answers were checked."""
    code = ("import json, sys; from autotune.child import worker; "
            "worker.main(sys.argv[1:]); "
            "print(json.dumps(sorted(m for m in ('torchvision', 'torch._dynamo') if m in sys.modules)))")
    argv = ["--model", "resnet18", "--item-shape", "3x64x64", "--backend", "torchscript", "--probe",
            "--cache-dir", str(tmp_path), "--result", str(tmp_path / "result.json")]
    imported, setups = [], []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr
        imported.append(json.loads(proc.stdout.splitlines()[-1]))
        setups.append(json.loads((tmp_path / "result.json").read_text())["setup"])
    assert imported == [["torch._dynamo", "torchvision"], []]
    assert [s["eager_model"] for s in setups] == ["built", "kept outputs"]
    assert setups[1]["max_rel_err"] <= 1e-3 and setups[1]["artifact_hit"] is True
