"""`--model hf:TYPE` and `hf:FOLDER`: what they resolve to, and each mistake said in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from autotune.base.errors import ModelError
from autotune.config.models import resolve
from autotune.model import hf

NAMES = ("resnet18", "resnet50")


def test_a_model_type_is_its_default_configuration_with_the_default_task_and_length() -> None:
    spec = resolve("hf:bert")
    assert (spec.name, spec.kind, spec.item_shape, spec.task) == ("hf:bert", "huggingface", (128,),
                                                                   "sequence-classification")
    assert spec.needs_probe  # built and run once before anything is measured


def test_a_folder_is_named_by_its_absolute_path(tiny_bert: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tiny_bert.parent)
    spec = resolve(f"hf:./{tiny_bert.name}", seq_len=16, task="feature-extraction")
    assert (spec.name, spec.item_shape, spec.task) == (f"hf:{tiny_bert}", (16,), "feature-extraction")


def test_a_folder_takes_the_users_tokenized_inputs(tiny_bert: Path, tmp_path: Path) -> None:
    inputs = tmp_path / "tokens.pt"
    torch.save({"input_ids": torch.zeros(4, 24, dtype=torch.long),
                "attention_mask": torch.ones(4, 24, dtype=torch.long)}, inputs)
    spec = resolve(f"hf:{tiny_bert}", example_inputs=str(inputs))
    assert (spec.item_shape, spec.example_inputs, spec.task) == ((24,), str(inputs), "sequence-classification")


@pytest.mark.parametrize(
    ("model", "options", "message"),
    [
        ("hf:bret", {}, "unknown transformers model type 'bret'; did you mean bert"),
        ("hf:/nonexistent/model", {}, "--model hf:/nonexistent/model: no such folder; give a folder written by "
                                      "save_pretrained (a Hub name is not downloaded"),
        ("hf:bert-generation", {}, "hf:bert-generation (bert-generation) has no sequence-classification head; "
                                   "use --task feature-extraction"),
        ("hf:bert", {"seq_len": 513}, "--seq-len 513 is above the 512 positions hf:bert takes "
                                      "(max_position_embeddings); give --seq-len 512 or less"),
        ("hf:bert", {"input_shape": "16"}, "a transformers model takes --seq-len N (tokens per item), not "
                                           "--input-shape"),
        ("hf:bert", {"task": "translation"}, "--task 'translation' is not a task autotune knows"),
        ("hf:vit", {"task": "feature-extraction"}, "hf:vit takes no token ids (not a text model); give its "
                                                   "inputs with --example-inputs"),
        ("resnet18", {"seq_len": 16}, "--seq-len is for text models (--model hf:NAME); give resnet18 its input "
                                      "with --input-shape"),
        ("resnet18", {"task": "feature-extraction"}, "--task picks the head of a transformers model"),
    ],
)
def test_each_mistake_is_one_line(model: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(ModelError) as info:
        resolve(model, NAMES, **options)  # type: ignore[arg-type]
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_a_folder_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"the folder has no config.json; save the model with save_pretrained"):
        resolve(f"hf:{tmp_path}")


def test_seq_len_and_example_inputs_together(tiny_bert: Path, tmp_path: Path) -> None:
    torch.save(torch.zeros(2, 8, dtype=torch.long), tmp_path / "ids.pt")
    with pytest.raises(ModelError, match=r"^give --seq-len or --example-inputs, not both"):
        resolve(f"hf:{tiny_bert}", seq_len=8, example_inputs=str(tmp_path / "ids.pt"))


def test_without_transformers_the_fix_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(ModelError) as info:
        resolve("hf:bert")
    assert str(info.value) == f"--model hf:bert needs transformers, which is not installed; {hf.INSTALL}"
    assert hf.INSTALL == "pip install 'autotune[transformers]'"


def test_linear_int8_is_offered_to_models_whose_work_is_in_linear_layers() -> None:
    from autotune.config import space, space_fit

    loaded = space.load(space.find("default"))
    assert not resolve("resnet18").linear_heavy and resolve("vit_b_16").linear_heavy
    cnn = space_fit.for_model(loaded, linear_heavy=False)
    (precision,) = [rng for rng in cnn.knobs if rng.name == "precision"]
    assert "int8_dynamic" not in precision.choices and "int8" in precision.choices
    assert any("precision=int8_dynamic/int8_weight_only dropped" in note for note in cnn.notes)
    assert space_fit.for_model(loaded, linear_heavy=True) is loaded


def test_shapes_is_searched_only_with_sequence_length_buckets() -> None:
    from autotune.config import space, space_fit

    loaded = space.load(space.find("default"))
    assert loaded.get("shapes") is not None and loaded.get("shapes").choices == ("buckets", "dynamic")
    assert space_fit.for_buckets(loaded, bucketed=True) is loaded
    assert space_fit.for_buckets(loaded, bucketed=False).get("shapes") is None
    with pytest.raises(ModelError, match="shapes=dynamic serves sequence-length buckets with one compiled model"):
        resolve("resnet18").check_shapes("dynamic")
    resolve("resnet18").check_shapes("buckets")  # the default: a model per shape is what compiling does anyway
