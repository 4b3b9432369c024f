"""The user's data inside the child (`autotune.child.evaldata`): every format read, the parts never
share an item, and data the model cannot take is one line saying what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.child import evaldata
from autotune.model.errors import ApplyError


def _saved(tmp_path: Path, payload: object, name: str = "data.pt") -> str:
    path = tmp_path / name
    torch.save(payload, path)
    return str(path)


def test_the_parts_never_share_an_item_and_cover_them_all(tmp_path: Path) -> None:
    items = torch.arange(1000, dtype=torch.float32)[:, None]
    data = evaldata.load_labelled(_saved(tmp_path, {"inputs": items, "labels": torch.zeros(1000, dtype=torch.int64)}),
                                  (1,))
    parts = {name: set(data.part(name).inputs[:, 0].int().tolist()) for name in ("calibration", *evaldata.SPLITS)}
    assert len(parts["calibration"]) == 200 and len(parts["search"]) == 400 and len(parts["confirm"]) == 400
    assert not (parts["calibration"] & parts["search"] or parts["calibration"] & parts["confirm"]
                or parts["search"] & parts["confirm"])
    assert set().union(*parts.values()) == set(range(1000))
    assert data.part("search").inputs.tolist() == data.part("search").inputs.tolist()  # the same every time
    assert evaldata.calibration_items(1797) == evaldata.CALIBRATION_MAX


def test_a_pair_and_a_dict_of_inputs_are_read_alike(tmp_path: Path) -> None:
    ids = torch.randint(0, 50, (6, 8))
    labels = torch.tensor([0, 1, 0, 1, 1, 0])
    pair = evaldata.load_labelled(_saved(tmp_path, (ids, labels)), (8,))
    named = evaldata.load_labelled(_saved(tmp_path, {"inputs": {"input_ids": ids}, "labels": labels}, "d.pt"), (8,))
    assert torch.equal(pair.inputs, named.inputs["input_ids"]) and torch.equal(pair.labels, named.labels)


def test_the_last_batch_is_filled_and_its_padding_not_counted(tmp_path: Path) -> None:
    data = evaldata.Labelled(torch.arange(5.0)[:, None], torch.arange(5))
    found = data.batches(2)
    assert [real for _, _, real in found] == [2, 2, 1]
    assert found[-1][0].shape == (2, 1) and found[-1][1].tolist() == [4, 4]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (torch.zeros(4, 3), "holds no labels: save {\"inputs\": X, \"labels\": Y}"),
        ({"inputs": torch.zeros(4, 3), "labels": torch.zeros(4)}, "the labels must be a 1-D integer tensor"),
        ({"inputs": torch.zeros(4, 3), "labels": torch.zeros(3, dtype=torch.int64)},
         "3 labels for 4 inputs; give one label per item"),
        ({"inputs": torch.zeros(2, 3), "labels": torch.zeros(2, dtype=torch.int64)},
         "holds 2 item(s); give at least 3"),
    ],
)
def test_labelled_data_the_child_cannot_read_says_why(tmp_path: Path, payload: object, message: str) -> None:
    with pytest.raises(ApplyError, match="^--eval-data ") as info:
        evaldata.load_labelled(_saved(tmp_path, payload), (3,))
    assert message in str(info.value)


def test_a_folder_of_class_folders_is_labelled_by_sorted_name(tmp_path: Path) -> None:
    from torchvision.io import write_png

    for label, name in enumerate(("cat", "dog")):
        (tmp_path / name).mkdir()
        for n in range(3):
            write_png(torch.full((3, 40, 50), 60 * label + n, dtype=torch.uint8), str(tmp_path / name / f"{n}.png"))
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    data = evaldata.load_labelled(str(tmp_path), (3, 32, 32))
    assert data.inputs.shape == (6, 3, 32, 32) and data.labels.tolist() == [0, 0, 0, 1, 1, 1]
    gray = evaldata.load_labelled(str(tmp_path), (1, 32, 32))
    assert gray.inputs.shape == (6, 1, 32, 32)
    assert gray.inputs[3].mean().item() == pytest.approx(60 / 255, abs=1e-3)  # scaled to [0, 1], no ImageNet means
    with pytest.raises(ApplyError, match="is a folder of images, and the model takes items of shape 16"):
        evaldata.load_labelled(str(tmp_path), (16,))


def test_labels_beyond_the_models_classes_are_refused() -> None:
    with pytest.raises(ApplyError, match="label 10 is outside the model's 10 classes .* give labels 0 to 9"):
        evaldata.check_labels(torch.tensor([3, 10]), 10, "x.pt")
    with pytest.raises(ApplyError, match="label -1 is outside"):
        evaldata.check_labels(torch.tensor([-1, 2]), 10, "x.pt")


class _Words:
    """A tokenizer of whitespace-separated words (each word one token)."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [len(word) for word in text.split()]}


def test_a_text_becomes_whole_windows_and_the_parts_alternate(tmp_path: Path) -> None:
    book = tmp_path / "book.txt"
    book.write_text(" ".join(["word"] * 50))
    windows = evaldata.text_windows(str(book), _Words(), 8)
    assert len(windows) == 6 and all(w.shape == (8,) for w in windows)  # 50 tokens: 6 windows, 2 left out
    assert len(evaldata.window_part(windows, "search")) == 3 and len(evaldata.window_part(windows, "confirm")) == 3
    book.write_text("too short")
    with pytest.raises(ApplyError, match="is 2 tokens long, shorter than two windows of 8 .* give a longer text"):
        evaldata.text_windows(str(book), _Words(), 8)
    book.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ApplyError, match="is not UTF-8 text"):
        evaldata.text_windows(str(book), _Words(), 8)


def test_a_model_built_from_a_configuration_has_no_tokenizer() -> None:
    with pytest.raises(ApplyError, match="hf:llama is built from a configuration and has no tokenizer"):
        evaldata.tokenizer_of("hf:llama")


def test_items_of_another_shape_than_the_timed_ones_are_refused() -> None:
    data = evaldata.Labelled(torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.int64))
    evaldata.check_shape(data, (3, 8, 8), "x.pt")
    with pytest.raises(ApplyError, match="x.pt holds items of shape 3x8x8, and the model is timed on items of shape "
                                         "3x224x224; give --input-shape 3x8x8"):
        evaldata.check_shape(data, (3, 224, 224), "x.pt")
