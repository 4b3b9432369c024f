"""transformers models in the child and in `autotune.apply`: the head's tensor out, random token
inputs in, one wrapper for both, and artifacts keyed by the weights a folder holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from torch.utils.data import default_collate

import autotune
from autotune.child import build, inputs, sources, worker
from autotune.model import apply, envfile, hf, references
from autotune.model.artifacts import fingerprint
from autotune.model.knobs import ModelKnobs
from tests.conftest import ROOT
from tests.fixtures.models import tinynets
from tests.model.test_runtimes import setup_extras, tomllib
from tests.support.hf import TINY_BERT, save_tiny_bert, token_batch

TRACED = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning",  # transformers' own, under TorchScript
                                    "ignore:.*is_gradient_checkpointing:FutureWarning")


def child_args(model: str, length: int = 16, *extra: str) -> Any:
    return worker.parse_args(["--model", model, "--item-shape", str(length), "--result", "unused", *extra])


def run(model: Any, batch: dict[str, Any]) -> Any:
    with torch.no_grad():
        return model(**batch)


@pytest.mark.parametrize(("task", "shape"), [("sequence-classification", (2, 2)), ("token-classification", (2, 16, 2)),
                                             ("feature-extraction", (2, 16, 64))])
def test_the_child_loads_each_head_with_the_heads_tensor_as_output(tiny_bert: Path, task: str,
                                                                   shape: tuple[int, ...]) -> None:
    model = sources.load_model(f"hf:{tiny_bert}", "", task)
    output = run(model, token_batch())
    assert isinstance(output, torch.Tensor) and tuple(output.shape) == shape
    assert not model.training


def test_a_folder_loads_its_own_weights(tiny_bert: Path) -> None:
    saved = transformers.BertForSequenceClassification.from_pretrained(tiny_bert).eval()
    expected = run(saved, token_batch()).logits
    assert torch.equal(run(sources.load_model(f"hf:{tiny_bert}", "", ""), token_batch()), expected)


def test_random_token_inputs_stay_within_the_vocabulary_with_the_models_names(tiny_bert: Path) -> None:
    dataset = inputs.dataset_of(child_args(f"hf:{tiny_bert}", 16, "--task", "feature-extraction"))
    batch = default_collate([dataset[i] for i in range(4)])
    assert sorted(batch) == ["attention_mask", "input_ids", "token_type_ids"]
    assert all(t.shape == (4, 16) and t.dtype == torch.int64 for t in batch.values())
    assert int(batch["input_ids"].min()) >= 0 and int(batch["input_ids"].max()) < TINY_BERT["vocab_size"]
    assert bool((batch["attention_mask"] == 1).all()) and bool((batch["token_type_ids"] == 0).all())
    assert not torch.equal(batch["input_ids"][0], batch["input_ids"][1])  # a pool of distinct items


def test_a_model_without_token_types_gets_none() -> None:
    assert hf.token_inputs("hf:distilbert", "") == hf.Tokens(30522, ("input_ids", "attention_mask"))


def test_int8_calibration_and_guard_batches_are_their_own_random_tokens(tiny_bert: Path) -> None:
    args = child_args(f"hf:{tiny_bert}", 8, "--batch-size", "2", "--calibration-batches", "2")
    calibration, guard = build.int8_batches(args, ModelKnobs(backend="inductor", precision="int8"))
    timed = inputs.dataset_of(args)[0]["input_ids"]
    seen = [b["input_ids"][i] for b in calibration + guard for i in range(2)]
    assert len(calibration) == 2 and len(guard) >= 1
    assert all(not torch.equal(timed, ids) for ids in seen)
    assert not torch.equal(calibration[0]["input_ids"], guard[0]["input_ids"])


def test_apply_wraps_the_users_transformers_model_as_the_child_built_it(tiny_bert: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for var in apply.KNOB_VARS.values():
        monkeypatch.delenv(var, raising=False)
    users = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_bert)
    applied = autotune.apply(users, token_batch())
    measured = sources.load_model(f"hf:{tiny_bert}", "", "")
    assert isinstance(run(applied, token_batch()), torch.Tensor)
    assert torch.equal(run(applied, token_batch()), run(measured, token_batch()))
    assert fingerprint(applied) == fingerprint(measured)  # the same compiled artifact


@TRACED
def test_apply_runs_the_users_model_through_the_measured_artifact(tiny_bert: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = apply.Deployment(ModelKnobs(backend="torchscript"), artifacts=tmp_path)
    measured = apply.apply_deployment(sources.load_model(f"hf:{tiny_bert}", "", ""), token_batch(), chosen,
                                       check=True)
    for var, value in {**apply.to_env(chosen.knobs), envfile.ARTIFACTS_VAR: str(tmp_path)}.items():
        monkeypatch.setenv(var, value)
    users = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_bert)
    applied = autotune.apply(users, token_batch(), check=True)
    assert applied.setup["artifact_hit"] is True
    assert applied.setup["artifact_file"] == measured.setup["artifact_file"]
    assert torch.allclose(applied(**token_batch()), run(users, token_batch()).logits, atol=1e-5)


@TRACED
def test_a_folder_never_loads_the_artifact_of_other_weights(tmp_path: Path) -> None:
    """Two folders of one configuration, and one path saved again with other weights: each its own artifact."""
    chosen = apply.Deployment(ModelKnobs(backend="torchscript"), artifacts=tmp_path / "artifacts")
    first, second = save_tiny_bert(tmp_path / "a", seed=0), save_tiny_bert(tmp_path / "b", seed=1)

    def applied(folder: Path) -> dict[str, Any]:
        return apply.apply_deployment(sources.load_model(f"hf:{folder}", "", ""), token_batch(), chosen,
                                       check=True).setup

    made = applied(first)
    assert applied(second)["artifact_hit"] is False
    assert applied(first)["artifact_hit"] is True
    save_tiny_bert(first, seed=2)  # the same path, trained again
    again = applied(first)
    assert again["artifact_hit"] is False and again["artifact_file"] != made["artifact_file"]


@TRACED
def test_the_seed_recipe_caches_a_transformers_model_converted_to_mkldnn(tiny_bert: Path, tmp_path: Path) -> None:
    """mkldnn with weight_cache: TorchScript cannot script a transformers model, so it is traced; the
    saved file loads in the next process's place and answers as eager does."""
    chosen = apply.Deployment(ModelKnobs(mkldnn=True, weight_cache=True), artifacts=tmp_path)
    eager = run(sources.load_model(f"hf:{tiny_bert}", "", ""), token_batch())

    def applied() -> apply.Applied:
        return apply.apply_deployment(sources.load_model(f"hf:{tiny_bert}", "", ""), token_batch(), chosen,
                                       check=True)

    made, loaded = applied(), applied()
    assert made.setup["artifact_hit"] is False and loaded.setup["artifact_hit"] is True
    assert isinstance(torch.jit.load(made.setup["artifact_file"]), torch.jit.ScriptModule)
    assert torch.allclose(loaded(**token_batch()), eager, atol=1e-5)
    assert loaded.setup["max_rel_err"] <= 1e-4


def test_hf_models_never_use_the_kept_eager_outputs(tiny_bert: Path) -> None:
    """Kept outputs (references) are named by the model's name; a folder's weights change under its path."""
    assert not references.applies(f"hf:{tiny_bert}") and not references.applies("hf:bert")


def test_only_transformers_models_are_wrapped() -> None:
    model = tinynets.mlp()
    assert hf.wrapped(model) is model
    bert = transformers.BertModel(transformers.BertConfig(**TINY_BERT))

    class Mine(transformers.BertModel):
        pass

    assert hf.is_transformers_model(bert) and hf.is_transformers_model(Mine(bert.config))
    assert isinstance(hf.wrapped(bert), hf.wrap(bert).__class__)


def test_telling_a_model_apart_imports_no_transformers() -> None:
    code = ("import sys, torch; from autotune.model import hf; "
            "assert not hf.is_transformers_model(torch.nn.Linear(2, 2)); print('transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_transformers_is_an_extra_that_setup_installs() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["transformers"][0] == "transformers>=5.2,<6"
    assert {"gguf>=0.19", "accelerate>=1.1"} <= set(extras["transformers"])  # --model FILE.gguf loads through them
    assert "transformers" in setup_extras()
    assert hf.INSTALL == "pip install 'autotune[transformers]'"


def test_a_model_that_takes_any_length_is_timed_at_lengths_spread_over_each_bucket(tiny_bert: Path) -> None:
    """Eager and shapes=dynamic run a request at its own length, where a model per bucket pads it to
    the bucket: after one batch of the bucket's length (the example), their streams cycle over the
    lengths that stand for the bucket's requests, from the token after the bucket below, and a round
    holds one batch of each (a sweep)."""
    from torch.utils.data import DataLoader

    from autotune.child import rounds
    from autotune.model import buckets

    args = child_args(f"hf:{tiny_bert}", 32, "--seq-lens", "8,32", "--batch-size", "2")
    found = rounds.buckets_of(args)
    padded = rounds.per_length(args, found)
    assert [(p.item_shape, p.lengths) for p in padded] == [("8", (8,)), ("32", (32,))]
    spread = rounds.per_length(args, found, any_length=True)
    assert [(p.item_shape, p.lengths) for p in spread] == [("8", (2, 4, 6, 8)), ("32", (12, 18, 24, 30))]
    stream = iter(DataLoader(inputs.dataset_of(spread[1]), batch_size=2))
    assert [tuple(next(stream)["input_ids"].shape) for _ in range(6)] == \
        [(2, 32), (2, 12), (2, 18), (2, 24), (2, 30), (2, 12)]
    fixed = iter(DataLoader(inputs.dataset_of(padded[1]), batch_size=2))
    assert {tuple(next(fixed)["input_ids"].shape) for _ in range(4)} == {(2, 32)}
    streams = [iter(DataLoader(inputs.dataset_of(part), batch_size=2)) for part in spread]
    for stream in streams:
        next(stream)  # the examples
    first = next(rounds.rounds(streams, [len(part.lengths) for part in spread]))
    assert isinstance(first, buckets.Round)
    assert [[buckets.sequence_length(b) for b in sweep] for sweep in first.sweeps] == [[2, 4, 6, 8], [12, 18, 24, 30]]


def test_one_bucket_is_timed_in_rounds_too(tiny_bert: Path) -> None:
    from torch.utils.data import DataLoader

    from autotune.child import rounds
    from autotune.model import buckets

    args = child_args(f"hf:{tiny_bert}", 16, "--seq-lens", "16")
    parts = rounds.per_length(args, rounds.buckets_of(args))
    stream = iter(DataLoader(inputs.dataset_of(parts[0]), batch_size=1))
    assert isinstance(next(rounds.rounds([stream], [1])), buckets.Round)
    assert not isinstance(next(rounds.rounds([stream])), buckets.Round)
