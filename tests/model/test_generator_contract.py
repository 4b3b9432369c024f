"""The contract every text-generation runtime keeps (`autotune.model.generate.base`), one suite run
over every backend of the registry that generates (`backends.generating()`, read when the tests are
collected), so a runtime registered later is covered without a line here
(tests/model/test_toy_generator.py shows it). Each is built as the measuring child and `apply`
build it (`generate.generator`, at the backend's first generating precision) from the same tiny
random qwen2; one whose packages are not installed is skipped, saying which.

The contract: greedy tokens streamed as int64 [batch] tensors, exactly as many as asked; no state
kept between requests, nor by a request stopped early; the first token the argmax of the logits it
hands the guard; the bytes a decode step reads recorded; and everything it keeps in the artifact
cache, which `autotune cache` lists with its size and key, reuses when built again, and removes
with `--prune --older-than 0d`.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from autotune.deploy import cache, cache_prune  # noqa: E402
from autotune.model import backends, generate, hf  # noqa: E402
from autotune.model.knobs import ModelKnobs  # noqa: E402

NEW = 6
RUNTIMES = [backend.name for backend in backends.generating()]


def prompts() -> Any:
    """One fixed 8-token prompt."""
    return torch.tensor([[5, 77, 300, 12, 499, 31, 200, 8]], dtype=torch.int64)


@pytest.fixture(scope="module")
def causal_lm() -> Any:
    torch.manual_seed(0)
    return hf.load_causal("hf:qwen2@tiny")


def build(name: str, model: Any, folder: Path) -> tuple[Any, dict[str, Any]]:
    """The generator of backend `name` as `generate.generator` makes it, its cache in `folder`."""
    if not backends.installed(name, generates=True):
        pytest.skip(backends.not_installed(name, generates=True))
    setup: dict[str, Any] = {}
    knobs = ModelKnobs(backend=name, precision=backends.get(name).generates[0])  # type: ignore[arg-type]
    return generate.generator(copy.deepcopy(model), knobs, setup, cache=folder, threads=2), setup


@pytest.fixture(scope="module", params=RUNTIMES)
def built(request: pytest.FixtureRequest, causal_lm: Any, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[str, Any, dict[str, Any], Path]:
    """(the backend, its generator, what it recorded, its cache folder), per generating backend."""
    folder = tmp_path_factory.mktemp(f"cache-{request.param}")
    generator, setup = build(request.param, causal_lm, folder)
    return request.param, generator, setup, folder


def tokens(generator: Any) -> list[int]:
    out = []
    for token in generator.stream(prompts(), NEW):
        assert isinstance(token, torch.Tensor) and token.dtype == torch.int64 and tuple(token.shape) == (1,)
        out.append(int(token[0]))
    assert len(out) == NEW
    return out


def test_it_streams_the_tokens_asked_for_and_keeps_no_state(built: tuple[str, Any, dict[str, Any], Path],
                                                            causal_lm: Any) -> None:
    _, generator, _, _ = built
    first = tokens(generator)
    assert all(0 <= token < causal_lm.config.vocab_size for token in first)
    assert tokens(generator) == first


def test_a_request_stopped_early_leaves_nothing_behind(built: tuple[str, Any, dict[str, Any], Path]) -> None:
    _, generator, _, _ = built
    expected = tokens(generator)
    stream = iter(generator.stream(prompts(), NEW))
    assert [int(next(stream)[0]) for _ in range(2)] == expected[:2]
    getattr(stream, "close", lambda: None)()
    assert tokens(generator) == expected


def test_its_first_token_is_the_argmax_of_the_logits_it_gives_the_guard(
        built: tuple[str, Any, dict[str, Any], Path], causal_lm: Any) -> None:
    _, generator, _, _ = built
    logits = generator.logits(prompts())
    assert logits.dtype == torch.float32 and tuple(logits.shape) == (1, 8, causal_lm.config.vocab_size)
    assert int(logits[0, -1].argmax()) == tokens(generator)[0]


def test_it_records_the_bytes_a_decode_step_reads(built: tuple[str, Any, dict[str, Any], Path]) -> None:
    _, _, setup, _ = built
    assert setup["weight_bytes"] > 0


def kept(folder: Path) -> set[Path]:
    """Every file under the cache folder."""
    return {path for path in folder.rglob("*") if path.is_file()}


def test_what_it_keeps_is_the_caches_to_list_reuse_and_prune(built: tuple[str, Any, dict[str, Any], Path],
                                                            causal_lm: Any) -> None:
    name, _, _, folder = built
    here = cache.Here.now()
    entries = cache.scan(folder, here)
    listed = {path for e in entries for path in ({e.path, Path(f"{e.path}.json")} | kept(e.path)
                                                     if e.path.is_dir() else {e.path, Path(f"{e.path}.json")})}
    assert kept(folder) <= listed  # nothing kept beside the one cache
    assert all(e.kind.endswith("artifact") and e.key and e.size > 0 and e.unusable == "" for e in entries), entries
    build(name, causal_lm, folder)
    assert {e.path for e in cache.scan(folder, here)} == {e.path for e in entries}  # reused, not made again
    chosen = cache_prune.to_prune(cache.scan(folder, here), 0.0, time.time() + 1, include_exported=False)
    assert not cache_prune.prune(chosen).kept
    assert kept(folder) == set()
