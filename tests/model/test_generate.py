"""Text generation in PyTorch (`autotune.model.generate`): sizes of random configurations, the int4
layer, the generator's greedy tokens against transformers' own, the guard, and `apply` for a causal LM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import autotune
from autotune.model import generate, hf, sizes
from autotune.model.envfile import MODEL_VAR, NEW_TOKENS_VAR, SEQ_LEN_VAR, TASK_VAR, knob_var
from autotune.model.errors import ApplyError, WrongAnswers
from autotune.model.generate import int4, int8, measure
from autotune.model.generate.applied import Generating
from autotune.model.generate.pytorch import TorchGenerator, convert, weight_bytes
from autotune.model.knobs import ModelKnobs
from tests.support.envs import hand_written


def tiny(kind: str = "qwen2") -> torch.nn.Module:
    torch.manual_seed(0)
    return hf.load_causal(f"hf:{kind}@tiny")


def prompts(count: int = 2, length: int = 12, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, 1024, (count, length), generator=torch.Generator().manual_seed(seed))


def transformers_greedy(model: torch.nn.Module, ids: torch.Tensor, new: int) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, pad_token_id=0)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize(("text", "params"), [("0.5b", 5e8), ("125M", 1.25e8), ("1.5b", 1.5e9), ("tiny", 0.0)])
def test_sizes_are_read_as_parameters(text: str, params: float) -> None:
    assert sizes.parse_size(text) == params


@pytest.mark.parametrize("text", ["big", "0.5", "-1b", "0m", "100b", "1e9"])
def test_a_size_that_is_not_one_says_what_to_give(text: str) -> None:
    with pytest.raises(ApplyError, match="give (parameters like 0.5b|1m to 20b)"):
        sizes.parse_size(text)


@pytest.mark.parametrize("kind", ["qwen2", "llama", "gpt2"])
def test_a_sized_configuration_holds_about_that_many_parameters(kind: str) -> None:
    counted = sizes.count(hf.config_of(f"hf:{kind}@0.5b"))
    assert 0.45e9 < counted < 0.55e9


@pytest.mark.parametrize("kind", ["qwen2", "llama", "gpt2"])
def test_the_static_cache_and_the_dynamic_one_generate_what_transformers_does(kind: str) -> None:
    model, ids = tiny(kind), prompts()
    expected = transformers_greedy(model, ids, 10)
    for static in (False, True):
        generator = TorchGenerator(model, static, False)
        got = torch.stack(list(generator.stream(ids, 10)), dim=1)
        assert torch.equal(got, expected)
        again = torch.stack(list(generator.stream(ids, 10)), dim=1)  # no state kept between requests
        assert torch.equal(again, expected)


def test_the_compiled_decode_step_generates_the_same_tokens() -> None:
    model, ids = tiny(), prompts(1)
    expected = transformers_greedy(model, ids, 6)
    generator = TorchGenerator(model, True, True)
    assert torch.equal(torch.stack(list(generator.stream(ids, 6)), dim=1), expected)


def test_the_int4_layer_computes_its_dequantized_weights() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 64).to(torch.bfloat16)
    layer = int4._layer_class()(linear, 128)
    x = torch.randn(5, 256).to(torch.bfloat16)
    exact = linear(x).float()
    error = (layer(x).float() - exact).norm() / exact.norm()
    assert 0.01 < error < 0.12  # 4 bits of uniform weights: ~6.5%, not exact and not broken


def test_int4_replaces_the_linears_it_can_and_weighs_less() -> None:
    model = tiny()
    before = weight_bytes(model)
    setup: dict[str, object] = {}
    convert(model, ModelKnobs(precision="int4_weight_only"), setup)
    assert setup["int4_linears"] == 2 * 7 + 1  # q k v o gate up down per layer, and the output layer
    assert weight_bytes(model) < before / 4


def test_int4_on_a_model_too_narrow_for_its_groups_says_what_to_use() -> None:
    config = hf.config_of("hf:qwen2@tiny")
    config.hidden_size, config.head_dim, config.intermediate_size = 64, 16, 96
    torch.manual_seed(0)
    import transformers

    model = transformers.Qwen2ForCausalLM(config).eval()
    with pytest.raises(ApplyError, match="use int8_weight_only"):
        convert(model, ModelKnobs(precision="int4_weight_only"), {})


def test_the_guard_judges_the_mean_cosine_and_records_top1() -> None:
    model, ids = tiny(), prompts()
    reference = TorchGenerator(model, False, False).logits(ids)
    setup: dict[str, object] = {}
    measure.judge(measure.logits_agreement(reference, reference.clone()), "fp32", "fp32", None, setup)
    assert setup["mean_cosine"] == pytest.approx(1.0) and setup["top1_agreement"] == 1.0
    noisy = reference + 3 * reference.std() * torch.randn(reference.shape, generator=torch.Generator().manual_seed(0))
    with pytest.raises(WrongAnswers, match="raise --tolerance to accept it"):
        measure.judge(measure.logits_agreement(reference, noisy), "bf16", "bf16", None, {})
    measure.judge(measure.logits_agreement(reference, noisy), "bf16", "bf16", 0.99, setup)  # accepted when asked


def test_agreeing_prefix_counts_up_to_the_first_difference() -> None:
    assert measure.agreeing_prefix(torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([[1, 2, 9], [7, 5, 6]])) == [2, 0]


def test_a_request_is_timed_as_its_first_token_and_its_decode_steps() -> None:
    made = measure.Generation(TorchGenerator(tiny(), False, False), 5)
    latency, items = made.timed({"input_ids": prompts(3)})
    found = made.summary()
    assert items == 15 and found["requests"] == 1 and found["new_tokens"] == 5
    assert 0 < found["ttft_p50_ms"] < latency and found["tpot_p50_ms"] * 4 < latency
    made.reset()
    assert made.summary()["requests"] == 0


def test_a_peer_is_given_the_models_saved_folder_once(tmp_path: Path) -> None:
    model = tiny()
    first = generate.saved(model, tmp_path)
    assert (first / "config.json").is_file() and generate.saved(model, tmp_path) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name, f"{first.name}.json"]  # no partial folder


def test_a_backend_that_does_not_generate_says_which_do() -> None:
    with pytest.raises(ApplyError, match="eager/inductor/openvino/llamacpp"):
        generate.generator(tiny(), ModelKnobs(backend="torchscript"), {})


def env_file(tmp_path: Path, **knobs: str) -> Path:
    path = tmp_path / "best.env"
    path.write_text(hand_written(**{MODEL_VAR: "hf:qwen2@tiny", TASK_VAR: "generate", SEQ_LEN_VAR: "12",
                                    NEW_TOKENS_VAR: "6", **{knob_var(name): value for name, value in knobs.items()}}))
    return path


def test_apply_returns_a_causal_lm_generating_as_measured(tmp_path: Path) -> None:
    model, ids = tiny(), prompts(1)
    expected = transformers_greedy(model, ids, 6)
    applied = autotune.apply(model, ids, env_file(tmp_path, kv_cache="static"), check=True)
    assert isinstance(applied, Generating) and applied.knobs.kv_cache == "static"
    assert torch.equal(applied.generate(ids, 6), expected)
    assert applied(ids).shape == (1, 12, 1024)  # called like the model: its logits
    bf16 = autotune.apply(model, ids, env_file(tmp_path, precision="bf16"), check=True)
    assert bf16.setup["mean_cosine"] > 0.99 and next(model.parameters()).dtype == torch.float32  # yours untouched


def test_apply_refuses_a_model_that_does_not_generate_and_prompts_that_are_not_ids(tmp_path: Path) -> None:
    with pytest.raises(ApplyError, match="not a transformers causal LM"):
        autotune.apply(torch.nn.Linear(2, 2), torch.zeros(1, 2), env_file(tmp_path))
    applied = autotune.apply(tiny(), prompts(1), env_file(tmp_path))
    with pytest.raises(ApplyError, match="token ids"):
        applied.generate(torch.zeros(1, 4), 2)
    with pytest.raises(ApplyError, match="1 token or more"):
        applied.generate(prompts(1), 0)


def test_the_int8_layer_computes_its_dequantized_weights() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 64)
    layer = int8._layer_class()(linear)
    x = torch.randn(5, 256)
    exact = linear(x)
    error = (layer(x).float() - exact).norm() / exact.norm()
    assert 1e-4 < error < 0.02  # 8 bits per channel and bf16 activations: close, not exact
    model = tiny()
    before = weight_bytes(model)
    setup: dict[str, object] = {}
    convert(model, ModelKnobs(precision="int8_weight_only"), setup)
    assert setup["int8_linears"] == 2 * 7 + 1 and weight_bytes(model) < before / 3


def test_a_peer_without_an_artifacts_folder_converts_into_one_removed_at_exit(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = ("import tempfile, torch, autotune; from autotune.model import hf\n"
              "from autotune.model.generate.applied import _scratch\n"
              "print(_scratch())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    made = Path(done.stdout.strip().splitlines()[-1])
    assert made.parent == tmp_path and not made.exists()


@pytest.mark.parametrize("values", [[5.0], [3.0, 1.0], [10.0, 12.0, 11.0, 30.0, 13.0],
                                    [float(i % 7) for i in range(23)]])
def test_the_childs_p90_per_output_token_is_the_harness_percentile(values: list[float]) -> None:
    from autotune.measure.stats import percentile

    assert measure.p90(values) == pytest.approx(percentile(values, 90))
    assert measure.p90([]) is None
