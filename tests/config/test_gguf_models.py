"""`--model FILE.gguf` (with --task generate): a file that is not one is one line; a real one is
converted once into a transformers folder under the cache, which the rest of autotune takes as
`hf:FOLDER`, named for the study by the file's stem."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from autotune.base.errors import ModelError
from autotune.config import space
from autotune.config.models import resolve
from autotune.model import gguf_source, hf
from autotune.search import opening


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    torch.save({"weight": torch.zeros(2)}, fake)  # a PyTorch file renamed .gguf
    with pytest.raises(ModelError) as info:
        resolve(str(fake), task="generate", cache_dir=tmp_path / "cache")
    assert str(info.value) == (f"--model {fake} is not a GGUF file (it does not start with the bytes GGUF); give a "
                               f"model file llama.cpp reads, or a folder written by save_pretrained as --model "
                               f"hf:FOLDER")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "--model {p}: no such file; give the path of a GGUF file"),
        (lambda p: p.mkdir(), "--model {p} is a folder, not a GGUF file; give the .gguf file itself"),
        (lambda p: p.write_bytes(b"GGUF"), "--model {p} is a GGUF file: a language model, which autotune "
                                           "measures generating text; add --task generate"),
    ],
    ids=["missing", "folder", "without --task generate"],
)
def test_each_mistake_is_one_line(tmp_path: Path, make: object, message: str) -> None:
    path = tmp_path / "x.gguf"
    make(path)  # type: ignore[operator]
    task = "generate" if "--task generate" not in message else None
    with pytest.raises(ModelError) as info:
        resolve(str(path), task=task, cache_dir=tmp_path / "cache")
    assert str(info.value).startswith(message.format(p=path)) and "\n" not in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGUF")
    path.chmod(0)
    with pytest.raises(ModelError, match=r"^cannot read --model .*x.gguf: Permission denied; give a readable GGUF"):
        resolve(str(path), task="generate", cache_dir=tmp_path / "cache")


def test_a_missing_package_is_named_with_the_pip_command(tmp_path: Path, tiny_gguf: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else found(name, *a))
    with pytest.raises(ModelError) as info:
        resolve(str(tiny_gguf), task="generate", cache_dir=tmp_path / "cache")
    assert str(info.value) == (f"--model {tiny_gguf}: loading a GGUF file needs accelerate, not installed; pip "
                               f"install gguf accelerate (or pip install 'autotune[transformers]')")
    assert not (tmp_path / "cache").exists()  # nothing half-written


def test_a_gguf_file_becomes_a_transformers_folder_once(tmp_path: Path, tiny_gguf: Path) -> None:
    spec = resolve(str(tiny_gguf), task="generate", seq_len=16, new_tokens=8, cache_dir=tmp_path / "cache")
    folder = Path(hf.folder_of(spec.name) or "")
    artifact = folder.parent  # an artifact of the one cache (tests/deploy/test_cache_gguf.py lists and prunes it)
    assert artifact.parent == tmp_path / "cache" / "artifacts" and folder.name == "tiny-llama.f32"
    assert (spec.kind, spec.task, spec.item_shape) == ("huggingface", "generate", (16, 8))
    assert gguf_source.source_of(folder) == {
        "format": gguf_source.FORMAT, "gguf": str(tiny_gguf), "bytes": tiny_gguf.stat().st_size,
        "file_type": "ALL_F32", "tokenizer": True, "transformers": hf.transformers_module().__version__}
    made = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve(str(tiny_gguf), task="generate", cache_dir=tmp_path / "cache").name == spec.name
    assert (folder / "model.safetensors").stat().st_mtime_ns == made  # reused, not converted again
    assert [p.name for p in artifact.iterdir()] == [folder.name]
    assert sorted(p.name for p in artifact.parent.iterdir()) == [artifact.name, f"{artifact.name}.json"]  # no temporary
    request = opening.SearchRequest(model=str(tiny_gguf), trials=2, space=space.find("generate"), task="generate")
    assert opening.study_name(request, spec) == "tiny-llama.f32-generate-bs1-latency"


def test_the_folder_holds_the_files_weights_and_tokenizer(tmp_path: Path, tiny_gguf: Path) -> None:
    transformers = hf.transformers_module()
    spec = resolve(str(tiny_gguf), task="generate", cache_dir=tmp_path / "cache")
    saved = transformers.LlamaForCausalLM.from_pretrained(tiny_gguf.parent / f"{tiny_gguf.stem}-saved")
    ids = torch.randint(0, saved.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(hf.load_causal(spec.name)(ids).logits, saved(ids).logits)  # F32: exactly the weights
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf.folder_of(spec.name))
    assert tokenizer("the theme", add_special_tokens=False).input_ids == [116, 257, 256, 257, 109, 101]


def test_a_file_without_a_vocabulary_converts_without_a_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    from tests.support.gguf_files import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "bare.gguf", tmp_path, vocabulary=False)  # as autotune's llama.cpp writes it
    folder = Path(hf.folder_of(resolve(str(path), task="generate", cache_dir=tmp_path / "cache").name) or "")
    assert json.loads((folder / "source.json").read_text())["tokenizer"] is False
    assert not (folder / "tokenizer.json").exists()
