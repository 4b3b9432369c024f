"""Resolving what users type for `--model` into a torchvision classification model."""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass

from autotune.errors import ModelError

# Short names users try first; values are torchvision builder names.
ALIASES = {
    "resnext101": "resnext101_32x8d",
    "resnext50": "resnext50_32x4d",
    "resnet": "resnet50",
    "wide_resnet50": "wide_resnet50_2",
    "wide_resnet101": "wide_resnet101_2",
    "mobilenet": "mobilenet_v2",
    "mobilenetv2": "mobilenet_v2",
    "mobilenetv3": "mobilenet_v3_large",
    "inception": "inception_v3",
    "inceptionv3": "inception_v3",
    "vit": "vit_b_16",
    "efficientnet": "efficientnet_b0",
    "convnext": "convnext_tiny",
    "shufflenet": "shufflenet_v2_x1_0",
    "squeezenet": "squeezenet1_1",
    "mnasnet": "mnasnet1_0",
    "regnet": "regnet_y_400mf",
    "densenet": "densenet121",
    "vgg": "vgg16",
    "swin": "swin_t",
    "maxvit": "maxvit_t",
}
# Models whose default construction expects a larger image than 224x224.
IMAGE_SIZE = {"inception_v3": 299}


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: the torchvision builder and the input shape of one item (C, H, W)."""

    name: str
    item_shape: tuple[int, ...]


@functools.lru_cache(maxsize=1)
def classification_models() -> tuple[str, ...]:
    """torchvision's image classification builders (imports torchvision once per process)."""
    import torchvision

    return tuple(torchvision.models.list_models(module=torchvision.models))


def resolve(text: str, available: tuple[str, ...] | None = None) -> ModelSpec:
    """Map `resnext101`, `ResNet-50`, `resnet50` ... to a builder name, or suggest close names."""
    names = classification_models() if available is None else available
    name = _match(text, names)
    if name is None:
        wanted = text.strip().lower().replace("-", "_")
        close = difflib.get_close_matches(wanted, list(names) + list(ALIASES), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ModelError(
            f"unknown model {text!r}; {hint}use a torchvision classification model name "
            f"(`autotune models` lists them) or a short name like resnext101"
        )
    size = IMAGE_SIZE.get(name, 224)
    return ModelSpec(name=name, item_shape=(3, size, size))


def _match(text: str, names: tuple[str, ...]) -> str | None:
    wanted = text.strip().lower().replace("-", "_")
    wanted = ALIASES.get(wanted, ALIASES.get(wanted.replace("_", ""), wanted))
    if wanted in names:
        return wanted
    squashed = {n.replace("_", ""): n for n in names}
    return squashed.get(wanted.replace("_", ""))
