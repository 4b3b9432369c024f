"""The llama.cpp peer: a tiny random qwen2 (tied embeddings), llama (untied, q/k rows reordered for
llama.cpp's RoPE) and gpt2 (Conv1D weights) converted to GGUF by our own writer, greedy tokens
against transformers' own fp32 greedy generate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from autotune.model.errors import ApplyError  # noqa: E402
from autotune.model.generate import llamacpp, llamacpp_context  # noqa: E402
from autotune.model.generate.base import Build  # noqa: E402

NEW = 16
Q8_AGREE = 12  # of 16: measured 16/16 on all three tiny models (and 3 seeds); a step may flip on a near tie

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)


def tiny(kind: str, folder: Path) -> Path:
    """A random tiny causal LM of `kind` saved with save_pretrained into `folder`: qwen2 and gpt2 tie
    their embeddings (no lm_head in the file), llama does not."""
    torch.manual_seed(0)
    if kind == "qwen2":
        config = transformers.Qwen2Config(**TINY, tie_word_embeddings=True)
    elif kind == "llama":
        config = transformers.LlamaConfig(**TINY, tie_word_embeddings=False)
    else:
        config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=256,
                                         bos_token_id=None, eos_token_id=None)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def prompt() -> Any:
    """A fixed random 8-token prompt."""
    return torch.randint(0, TINY["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(1))


def reference(folder: Path) -> list[int]:
    """transformers' greedy 16 tokens, fp32, eager attention, no end-of-sequence token to stop at."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(prompt(), max_new_tokens=NEW, do_sample=False)
    return [int(token) for token in out[0, prompt().shape[1]:]]


def tokens(generator: Any) -> list[int]:
    """The 16 tokens a generator streams, each checked to be an int64 [1] tensor."""
    out = []
    for token in generator.stream(prompt(), NEW):
        assert token.dtype == torch.int64 and tuple(token.shape) == (1,)
        out.append(int(token[0]))
    assert len(out) == NEW
    return out


@pytest.fixture(scope="module", params=["qwen2", "llama", "gpt2"])
def model(request: Any, tmp_path_factory: Any) -> tuple[Path, Path, list[int]]:
    """(the saved model, a work folder, transformers' greedy tokens) per model type."""
    root = tmp_path_factory.mktemp(request.param)
    folder = tiny(request.param, root / "model")
    return folder, root / "work", reference(folder)


def test_fp32_matches_transformers_and_keeps_no_state(model: tuple[Path, Path, list[int]]) -> None:
    folder, work, expected = model
    setup: dict[str, Any] = {}
    generator = llamacpp.build(Build(folder, "fp32", 2, work), setup)
    assert tokens(generator) == expected
    assert tokens(generator) == expected  # a fresh request: no state kept
    assert setup["gguf_type"] == "F32" and setup["kv_cache_type"] == "F32" and setup["gguf_reused"] is False
    assert setup["convert_s"] > 0 and setup["n_ctx"] >= 256 and setup["n_batch"] >= 8
    assert set(setup["gguf_tensor_types"]) == {"F32"} and setup["llama_cpp_version"]

    again: dict[str, Any] = {}
    generator = llamacpp.build(Build(folder, "fp32", 2, work), again)
    assert again["gguf_reused"] is True and again["gguf_path"] == setup["gguf_path"] and again["convert_s"] == 0.0
    assert tokens(generator) == expected
    name = Path(setup["gguf_path"]).name
    assert sorted(path.name for path in work.iterdir()) == [name, f"{name}.json"]  # no temporary left


def test_logits_of_every_position_match_transformers(model: tuple[Path, Path, list[int]]) -> None:
    folder, work, _ = model
    work = work.with_name("logits-work")  # its own conversions: the tests below count theirs
    eager = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        reference = eager(prompt()).logits
    for precision, least_cosine in (("fp32", 0.99999), ("int8_weight_only", 0.9995)):  # measured 1.0, 0.99991
        generator = llamacpp.build(Build(folder, precision, 2, work), {})
        logits = generator.logits(prompt())
        assert logits.dtype == torch.float32 and logits.shape == reference.shape
        assert float(torch.nn.functional.cosine_similarity(reference, logits, dim=-1).min()) >= least_cosine
    assert float((reference - logits).abs().max()) < 0.05  # Q8_0; fp32 measured 4e-4 on logits of ~1
    assert tokens(generator) == tokens(generator)  # logits left no state behind
    with pytest.raises(ApplyError, match="not a batch of 2"):
        generator.logits(prompt().repeat(2, 1))


def test_q8_0_mostly_matches_and_reuses_the_f32_gguf(model: tuple[Path, Path, list[int]]) -> None:
    folder, work, expected = model
    llamacpp.build(Build(folder, "fp32", 2, work), {})
    setup: dict[str, Any] = {}
    generator = llamacpp.build(Build(folder, "int8_weight_only", 2, work), setup)
    got = tokens(generator)
    assert sum(a == b for a, b in zip(got, expected, strict=True)) >= Q8_AGREE, (got, expected)
    assert setup["gguf_type"] == "Q8_0" and setup["convert_s"] == 0.0 and setup["quantize_s"] > 0
    assert setup["gguf_tensor_types"]["Q8_0"] >= 2 * 4  # at least every layer's 2-D weights
    assert tokens(generator) == got


def test_a_gguf_whose_repacked_decode_kills_its_child_loads_without_repacking(
        model: tuple[Path, Path, list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Where llama.cpp's repacked weights crash (its AMX matmul on some Xeons: SIGSEGV), the check's
    child dies and the generator loads the GGUF without them, and says so; here the child is made to
    die that way on any CPU."""
    folder, work, expected = model
    monkeypatch.setattr(llamacpp_context, "_REPACKED_CHECK", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    llamacpp_context.repacked_crash.cache_clear()
    try:
        setup: dict[str, Any] = {}
        generator = llamacpp.build(Build(folder, "int8_weight_only", 2, work), setup)
        assert setup["repacked_weights"] == "off: a child decoding with them was killed by SIGSEGV"
        got = tokens(generator)
        assert sum(a == b for a, b in zip(got, expected, strict=True)) >= Q8_AGREE, (got, expected)
    finally:
        llamacpp_context.repacked_crash.cache_clear()


def test_bf16_and_q4_0_run(model: tuple[Path, Path, list[int]]) -> None:
    folder, work, _ = model
    for precision, kind in (("bf16", "BF16"), ("int4_weight_only", "Q4_0")):
        setup: dict[str, Any] = {}
        generator = llamacpp.build(Build(folder, precision, 2, work), setup)
        assert setup["gguf_type"] == kind and kind in setup["gguf_tensor_types"]
        assert all(0 <= token < TINY["vocab_size"] for token in tokens(generator))


def test_what_it_refuses(tmp_path: Path) -> None:
    with pytest.raises(ApplyError, match="no precision 'int8_dynamic'.*fp32 as F32"):
        llamacpp.build(Build(tmp_path, "int8_dynamic", 2, tmp_path / "work"), {})
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ApplyError, match="converts model types qwen2, llama, gpt2, not 'bert'"):
        llamacpp.build(Build(tmp_path / "bert", "fp32", 2, tmp_path / "work"), {})
    folder = tiny("qwen2", tmp_path / "model")
    setup: dict[str, Any] = {}
    generator = llamacpp.build(Build(folder, "fp32", 2, tmp_path / "work"), setup, context=32)
    assert setup["n_ctx"] >= 32  # llama.cpp rounds the context up (to 256)
    with pytest.raises(ApplyError, match="one sequence at a time, not a batch of 2"):
        generator.stream(prompt().repeat(2, 1), NEW)
    with pytest.raises(ApplyError, match=f"exceed the context of {setup['n_ctx']}"):
        generator.stream(prompt(), setup["n_ctx"])
    with pytest.raises(ApplyError, match=r"must lie in \[0, 512\)"):
        generator.stream(torch.tensor([[1, 512]]), 1)
