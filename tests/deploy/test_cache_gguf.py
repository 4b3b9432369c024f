"""A `--model FILE.gguf` is converted into an artifact of the one cache: `autotune cache` lists it
with its size, `--prune --older-than 0d` removes it, and the next use converts it again."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from autotune.config.models import resolve
from autotune.deploy import cache, cache_prune
from autotune.model import gguf_source, hf
from tests.support.cli import run_cli


def files(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


def test_a_gguf_files_conversion_is_listed_sized_and_pruned(tmp_path: Path, tiny_gguf: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no env file here keeps it
    folder = Path(hf.folder_of(resolve(str(tiny_gguf), task="generate", cache_dir=tmp_path / "cache").name) or "")
    artifact = folder.parent
    assert artifact.parent == tmp_path / "cache" / "artifacts" and artifact.name.startswith(f"{gguf_source.KIND}-")
    [entry] = cache.scan(tmp_path / "cache", cache.Here.now())
    assert (entry.kind, entry.path, entry.model, entry.unusable) == (cache.GGUF_MODEL, artifact, "tiny-llama.f32", "")
    assert entry.size == sum(p.stat().st_size for p in files(tmp_path / "cache")) and entry.key  # folder + description
    code, out, _ = run_cli(capsys, "cache", "--cache-dir", str(tmp_path / "cache"), "--json")
    assert code == 0 and json.loads(out)["entries"] == [entry.to_json()]
    code, out, _ = run_cli(capsys, "cache", "--cache-dir", str(tmp_path / "cache"), "--prune", "--older-than", "0d",
                         "--json")
    assert code == 0 and json.loads(out)["removed"] == [str(artifact)]
    assert files(tmp_path / "cache") == set()
    assert hf.folder_of(resolve(str(tiny_gguf), task="generate", cache_dir=tmp_path / "cache").name) == str(folder)
    assert (folder / "config.json").is_file()  # converted again, at the same key


def test_what_older_autotunes_converted_outside_the_artifacts_is_pruned(tmp_path: Path) -> None:
    old = tmp_path / "artifacts" / gguf_source.OLD_FOLDER / "0123456789abcdef" / "tiny-llama.f32"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"x" * 1000)
    [entry] = cache.scan(tmp_path, cache.Here.now())
    assert (entry.kind, entry.size) == (cache.OLD_GGUF, 1000) and entry.unusable
    assert cache_prune.to_prune([entry], None, time.time(), include_exported=False) == [entry]
    assert not cache_prune.prune([entry]).kept and not old.parent.parent.exists()
