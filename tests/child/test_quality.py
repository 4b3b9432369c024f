"""The child's quality counts (`autotune.child.quality`): fp32's perplexity is transformers' own loss
on the same windows, a configuration that changes nothing diverges by nothing, and a classifier's
paired counts add up."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from autotune.child import evaldata, quality
from autotune.model.errors import ApplyError


def _tiny_llama() -> object:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, vocab_size=97,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def test_fp32_perplexity_is_transformers_own_loss_on_the_same_windows() -> None:
    model = _tiny_llama()
    windows = [torch.randint(0, 97, (32,), generator=torch.Generator().manual_seed(n)) for n in range(3)]

    def logits(tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=tokens).logits  # type: ignore[operator]

    found = quality.language(logits, None, windows)
    losses = []
    for window in windows:
        labels = window.clone()
        labels[:17] = -100  # positions 16..30 predict tokens 17..31: the second half, as llama-perplexity scores it
        with torch.no_grad():
            losses.append(float(model(input_ids=window[None], labels=labels[None]).loss))  # type: ignore[operator]
    assert math.exp(sum(found["nll_reference"]) / 3) == pytest.approx(math.exp(sum(losses) / 3), rel=1e-6)
    assert found["kl_mean"] == 0.0 and found["same_top"] == found["positions"] == 3 * 15
    assert found["scored_per_window"] == 15


def test_a_perturbed_model_diverges_and_loses_top_tokens() -> None:
    model = _tiny_llama()
    windows = [torch.randint(0, 97, (32,), generator=torch.Generator().manual_seed(n)) for n in range(2)]

    def reference(tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=tokens).logits  # type: ignore[operator]

    def noisy(tokens: torch.Tensor) -> torch.Tensor:
        return reference(tokens) + torch.randn(1, tokens.shape[1], 97, generator=torch.Generator().manual_seed(9))

    found = quality.language(reference, noisy, windows)
    assert found["kl_mean"] > 0.01 and found["same_top"] < found["positions"]
    assert found["kl_quantiles"]["0.99"] <= found["kl_max"]
    assert found["nll"] != found["nll_reference"]


def test_a_classifiers_counts_are_paired_item_by_item() -> None:
    data = evaldata.Labelled(torch.eye(4), torch.tensor([0, 1, 2, 3]))

    def reference(x: torch.Tensor) -> torch.Tensor:
        return x  # right on every item

    def candidate(x: torch.Tensor) -> torch.Tensor:
        return x.roll(1, dims=1) * (x[:, :1] == 0) + x * (x[:, :1] != 0)  # wrong on every item but the first

    found = quality.classifier(reference, candidate, data, 3, "x.pt")
    assert (found["items"], found["both_right"], found["reference_only_right"], found["candidate_only_right"],
            found["both_wrong"], found["top1_agreement_items"]) == (4, 1, 3, 0, 0, 1)


def test_an_output_that_is_not_one_score_per_class_is_refused(tmp_path: Path) -> None:
    data = evaldata.Labelled(torch.zeros(3, 2, 2), torch.tensor([0, 1, 0]))
    with pytest.raises(ApplyError, match=r"the model's output is of shape \(3, 2, 2\), not \[batch, classes\]"):
        quality.classifier(lambda x: x, lambda x: x, data, 3, "x.pt")
