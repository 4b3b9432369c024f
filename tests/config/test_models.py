from __future__ import annotations

import pytest

from autotune.base.errors import ModelError
from autotune.config.models import resolve

NAMES = ("resnet18", "resnet50", "resnext101_32x8d", "inception_v3", "mobilenet_v2", "vit_b_16")


@pytest.mark.parametrize(
    ("text", "name"),
    [("resnext101", "resnext101_32x8d"), ("ResNet-50", "resnet50"), ("resnet18", "resnet18"),
     ("mobilenet", "mobilenet_v2"), ("vit", "vit_b_16"), ("resnext101_32x8d", "resnext101_32x8d")],
)
def test_short_and_spelled_names(text: str, name: str) -> None:
    assert resolve(text, NAMES).name == name


def test_inception_gets_its_larger_input() -> None:
    assert resolve("inception", NAMES).item_shape == (3, 299, 299)
    assert resolve("resnet18", NAMES).item_shape == (3, 224, 224)


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(ModelError) as info:
        resolve("resnet5", NAMES)
    assert str(info.value).startswith("unknown model 'resnet5'; did you mean resnet50")


def test_real_torchvision_list_knows_resnext101() -> None:
    assert resolve("resnext101").name == "resnext101_32x8d"
