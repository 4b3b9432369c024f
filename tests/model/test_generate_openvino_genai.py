"""The OpenVINO GenAI peer: a tiny random qwen2 and llama converted to a stateful IR, greedy tokens
against transformers' own greedy generate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openvino_genai")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from autotune.model.errors import ApplyError  # noqa: E402
from autotune.model.generate import openvino_genai, openvino_run  # noqa: E402
from autotune.model.generate.base import Build  # noqa: E402

NEW = 16
INT8_AGREE = 12  # of 16: measured 16/16 on both tiny models; a later step may flip on a near tie

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)


def tiny(kind: str, folder: Path) -> Path:
    """A random tiny causal LM of `kind` saved with save_pretrained into `folder`."""
    torch.manual_seed(0)
    config = transformers.Qwen2Config(**TINY) if kind == "qwen2" else transformers.LlamaConfig(**TINY)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def prompt() -> Any:
    """A fixed 8-token prompt."""
    return torch.tensor([[5, 77, 300, 12, 499, 31, 200, 8]], dtype=torch.int64)


def reference(folder: Path) -> list[int]:
    """transformers' greedy 16 tokens, fp32, eos not special (the argmax whatever it is, as a
    generator yields; min_new_tokens would mask eos instead)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(prompt(), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    return [int(token) for token in out[0, prompt().shape[1]:]]


def tokens(generator: Any) -> list[int]:
    """The 16 tokens a generator streams, each checked to be an int64 [1] tensor."""
    out = []
    for token in generator.stream(prompt(), NEW):
        assert token.dtype == torch.int64 and tuple(token.shape) == (1,)
        out.append(int(token[0]))
    assert len(out) == NEW
    return out


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request: Any, tmp_path_factory: Any) -> tuple[Path, Path, list[int]]:
    """(the saved model, a work folder, transformers' greedy tokens) per model type."""
    root = tmp_path_factory.mktemp(request.param)
    folder = tiny(request.param, root / "model")
    return folder, root / "work", reference(folder)


def test_fp32_matches_transformers_and_keeps_no_state(model: tuple[Path, Path, list[int]]) -> None:
    folder, work, expected = model
    setup: dict[str, Any] = {}
    generator = openvino_genai.build(Build(folder, "fp32", 2, work), setup)
    assert tokens(generator) == expected
    assert tokens(generator) == expected  # a fresh request: no state kept
    assert setup["route"] == openvino_genai.ROUTE and setup["kv_cache_precision"] == "u8"
    assert setup["inference_precision"] == "f32" and setup["ir_reused"] is False
    assert setup["versions"]["openvino-genai"] != "absent"

    again: dict[str, Any] = {}
    generator = openvino_genai.build(Build(folder, "fp32", 2, work), again)
    assert again["ir_reused"] is True and again["ir"] == setup["ir"] and again["convert_s"] == 0.0
    assert tokens(generator) == expected
    name = Path(setup["ir"]).name
    assert sorted(path.name for path in work.iterdir()) == [name, f"{name}.json"]  # no temporary left


def test_int8_agrees_on_most(model: tuple[Path, Path, list[int]]) -> None:
    folder, work, expected = model
    setup: dict[str, Any] = {}
    got = tokens(openvino_genai.build(Build(folder, "int8_weight_only", 2, work), setup))
    assert sum(a == b for a, b in zip(got, expected, strict=True)) >= INT8_AGREE, (got, expected)
    assert "INT8_ASYM" in setup["compression"]


def test_stopping_early_cancels_the_request(model: tuple[Path, Path, list[int]]) -> None:
    folder, work, expected = model
    generator = openvino_genai.build(Build(folder, "fp32", 2, work), {})
    stream: Any = generator.stream(prompt(), NEW)  # a generator: close() ends the request
    assert [int(next(stream)[0]) for _ in range(3)] == expected[:3]
    stream.close()
    assert tokens(generator) == expected


def test_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(ApplyError, match="precision=int8_dynamic"):
        openvino_genai.build(Build(tmp_path, "int8_dynamic", 2, tmp_path / "work"), {})
    generator = openvino_run.OpenVINOGenerator(pipe=None, eos=0)
    with pytest.raises(ApplyError, match="batch=1"):
        next(generator.stream(torch.zeros(2, 4, dtype=torch.int64), 4))
