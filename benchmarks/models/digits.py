"""A small CNN trained on scikit-learn's bundled digits (1797 8x8 images, 10 classes): a real trained
vision classifier that `benchmarks/quality.py` trains in seconds, with held-out images to judge a
precision's accuracy on (`--eval-data`).

The model takes what autotune's image pipeline makes of a one-channel 8x8 image: [N, 1, 8, 8] floats
in [0, 1] (the digits' 0-16 grey levels over 16). It upsamples them to 32x32 itself, then three
3x3 convolutions (16, 32, 64 channels, each with ReLU and 2x2 max pooling) and one Linear to the 10
classes: 33 thousand parameters.

`benchmarks/quality.py` writes the trained weights and a module beside them whose factory autotune
imports (`--model digits_model:digits_cnn`, from that folder): `load` is what the factory calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

LEVELS = 16.0  # the digits' grey levels run 0..16
CLASSES = 10
HELD_OUT = 720  # images kept out of training: autotune's calibration, search and confirmation parts
SEED = 0
MOBILE_STEM = 8  # DigitsMobile's first convolution's channels
MOBILE_BLOCKS = (16, 32)  # its depthwise-separable blocks' channels, each block then max-pooled 2x2
MOBILE_BOTTLENECK = 3  # the linear bottleneck's width: the features squeezed to 3 numbers
MOBILE_EPOCHS = 15
MOBILE_INPUT_SCALE = LEVELS  # it takes the raw grey levels (0..16), unnormalized: the [0, 1] input times 16


class DigitsCNN(torch.nn.Module):
    """Three 3x3 convolutions (16, 32, 64 channels, ReLU, 2x2 max pooling) and a Linear: int8 moves
    none of its answers on the held-out digits."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = [torch.nn.Upsample(scale_factor=4, mode="bilinear")]
        for inputs, outputs in ((1, 16), (16, 32), (32, 64)):
            layers += [torch.nn.Conv2d(inputs, outputs, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
        self.features = torch.nn.Sequential(*layers)
        self.classifier = torch.nn.Linear(64 * 4 * 4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(torch.flatten(self.features(x), 1))
        return logits


class DigitsMobile(torch.nn.Module):
    """MobileNet's depthwise-separable blocks (a 3x3 convolution per channel, then a 1x1 across them),
    narrow and without batch norm, on the raw grey levels (0..16, unnormalized), its features squeezed
    through a linear bottleneck of 3 numbers before the classifier. Of the variants tried (with and
    without the bottleneck, the raw levels or [0, 1], 4-8 stem channels), this one's int8 moved the
    most answers: a few of 288, a drop of under a point (benchmarks/RESULTS.md, "int8_fallback on a trained net")."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = [torch.nn.Conv2d(1, MOBILE_STEM, 3, padding=1), torch.nn.ReLU()]
        channels = MOBILE_STEM
        for width in MOBILE_BLOCKS:
            layers += [torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels), torch.nn.ReLU(),
                       torch.nn.Conv2d(channels, width, 1), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
            channels = width
        self.features = torch.nn.Sequential(*layers)
        side = 8 // 2 ** len(MOBILE_BLOCKS)  # the 8x8 image as it is, each block halving it
        self.bottleneck = torch.nn.Linear(channels * side * side, MOBILE_BOTTLENECK)
        self.classifier = torch.nn.Linear(MOBILE_BOTTLENECK, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.flatten(self.features(x * MOBILE_INPUT_SCALE), 1)
        logits: torch.Tensor = self.classifier(self.bottleneck(features))
        return logits


@dataclass(frozen=True)
class Digits:
    """The digits as the model takes them, split once (seeded) into a training and a held-out part."""

    train_x: torch.Tensor  # [N, 1, 8, 8] float32 in [0, 1]
    train_y: torch.Tensor  # [N] int64
    held_x: torch.Tensor
    held_y: torch.Tensor


def digits(held_out: int = HELD_OUT, seed: int = SEED) -> Digits:
    from sklearn.datasets import load_digits

    bunch: Any = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / LEVELS
    labels = torch.tensor(bunch.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    held, train = order[:held_out], order[held_out:]
    return Digits(images[train], labels[train], images[held], labels[held])


def train(data: Digits, epochs: int = 30, seed: int = SEED, make: type[torch.nn.Module] = DigitsCNN) \
        -> tuple[torch.nn.Module, float]:
    """A `make` trained on the training part (Adam, batches of 64); the seconds it took."""
    torch.manual_seed(seed)
    model = make()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    start = time.perf_counter()
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(data.train_y))
        for at in range(0, len(order), 64):
            batch = order[at:at + 64]
            optimizer.zero_grad()
            loss: Any = torch.nn.functional.cross_entropy(model(data.train_x[batch]), data.train_y[batch])
            loss.backward()
            optimizer.step()
    return model.eval(), time.perf_counter() - start


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy in % of the model on (x, y)."""
    with torch.no_grad():
        return float((model(x).argmax(1) == y).double().mean()) * 100


def load(weights: Path, make: type[torch.nn.Module] = DigitsCNN) -> torch.nn.Module:
    """A trained `make` from its saved state dict, in eval mode."""
    model = make()
    model.load_state_dict(torch.load(weights, weights_only=True))
    return model.eval()


def parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
