"""Inside the benchmark child: the inputs that feed the model: synthetic images, tensors or token
ids of the shape asked for, a user's `--example-inputs`, and batches of them (torch is imported
inside functions)."""

from __future__ import annotations

import argparse
from typing import Any

from autotune.model import hf
from autotune.model.batches import explain
from autotune.model.errors import ApplyError


class SyntheticImages:
    """Fixed-size uint8 images through the usual preprocessing: resize, center crop, normalize."""

    def __init__(self, item_shape: tuple[int, ...], pool: int = 8, seed: int = 0) -> None:
        import torch

        channels, height, width = item_shape
        generator = torch.Generator().manual_seed(seed)
        raw_h, raw_w = height * 375 // 224, width * 500 // 224
        self.images = [torch.randint(0, 256, (channels, raw_h, raw_w), dtype=torch.uint8,
                                     generator=generator) for _ in range(pool)]
        self.resize = height * 256 // 224
        self.crop = (height, width)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        return preprocess(self.images[index % len(self.images)], self.resize, self.crop)


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, as torchvision's models expect


def preprocess(image: Any, short_side: int, crop: tuple[int, int]) -> Any:
    """torchvision's `Resize(short_side, antialias=True)`, `CenterCrop`, `ToDtype(float32, scale=True)`
    and `Normalize` on a uint8 CHW image, the same torch calls in the same order (a test holds them
    equal), without importing torchvision: a process that loads a compiled model needs nothing else
    from it, and importing it costs ~2 s (it imports torch._dynamo)."""
    import torch

    height, width = image.shape[-2:]
    size = [short_side, int(short_side * width / height)] if height <= width else \
        [int(short_side * height / width), short_side]
    native = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")  # torchvision resizes uint8 natively then
    resized = image[None] if native else image[None].float()
    resized = torch.nn.functional.interpolate(resized, size=size, mode="bilinear", align_corners=False,
                                              antialias=True)
    resized = resized[0] if native else resized[0].round_().to(torch.uint8)
    top, left = round((size[0] - crop[0]) / 2.0), round((size[1] - crop[1]) / 2.0)
    cropped = resized[..., top:top + crop[0], left:left + crop[1]]
    scaled = cropped.to(torch.float32).mul_(1.0 / 255)
    mean, std = torch.as_tensor(MEAN).view(-1, 1, 1), torch.as_tensor(STD).view(-1, 1, 1)
    return scaled.sub(mean).div_(std)


class SyntheticTensors:
    """Non-image inputs: a pool of standard-normal float tensors of the item shape."""

    def __init__(self, item_shape: tuple[int, ...], pool: int = 8, seed: int = 0) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        self.items = [torch.randn(item_shape, generator=generator) for _ in range(pool)]

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        return self.items[index % len(self.items)]


class SyntheticTokens:
    """Text inputs: a pool of token id sequences drawn uniformly from the model's vocabulary, with a
    full attention mask and token type ids (zeros) where the model takes them; each item a dict of
    1-D int64 tensors, which DataLoader's collate stacks into [batch, length]."""

    def __init__(self, length: int, tokens: hf.Tokens, pool: int = 8, seed: int = 0) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        made = {"attention_mask": torch.ones, "token_type_ids": torch.zeros}
        self.items = [{name: ids if name == "input_ids" else made[name](length, dtype=torch.int64)
                       for name in tokens.names}
                      for ids in (torch.randint(0, tokens.vocab_size, (length,), generator=generator)
                                  for _ in range(pool))]

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        return self.items[index % len(self.items)]


class SpreadTokens:
    """Text inputs for a model that takes any length, standing for a bucket's requests: the first
    batch `longest` tokens long (the example a dynamic model is exported and guarded at), then batches
    cycling through `lengths` (`buckets.spread`), so that a round's sweep holds one of each."""

    def __init__(self, longest: int, lengths: tuple[int, ...], tokens: hf.Tokens, batch_size: int, pool: int = 8,
                 seed: int = 0) -> None:
        self.batch_size, self.lengths = batch_size, lengths
        self.first = SyntheticTokens(longest, tokens, pool, seed)
        self.pools = {length: SyntheticTokens(length, tokens, pool, seed) for length in lengths}

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        if index < self.batch_size:
            return self.first[index]
        return self.pools[self.lengths[(index // self.batch_size - 1) % len(self.lengths)]][index]


class SavedInputs:
    """A user's own inputs (`--example-inputs FILE`): items are slices along dim 0 of a saved
    tensor, tuple/list of tensors, or dict of tensors, cycled; integer token ids stay integers."""

    def __init__(self, path: str) -> None:
        self.items = load_examples(path)
        self.count = example_count(self.items)

    @classmethod
    def of(cls, items: Any) -> SavedInputs:
        """Inputs already in memory (a tensor, tuple or dict of tensors, items along dim 0)."""
        made = cls.__new__(cls)
        made.items, made.count = items, example_count(items)
        return made

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        from torch.utils import _pytree

        return _pytree.tree_map(lambda t: t[index % self.count], self.items)


def load_examples(path: str) -> Any:
    """What `torch.save` put in the file, tensors only (no code is unpickled), or why not."""
    import torch

    try:
        loaded = torch.load(path, weights_only=True)
    except Exception as exc:  # any file that is not a torch.save of tensors; nothing else is unpickled
        raise ApplyError(f"cannot load example inputs {path}: {explain(exc)}; save a tensor, a tuple of "
                         f"tensors or a dict of tensors with torch.save") from None
    example_count(loaded, path)
    return tuple(loaded) if isinstance(loaded, list) else loaded


def example_count(loaded: Any, path: str = "the example inputs") -> int:
    """How many items the saved inputs hold along dim 0 (the same for every tensor)."""
    import torch

    tensors = (list(loaded.values()) if isinstance(loaded, dict) else
               list(loaded) if isinstance(loaded, (list, tuple)) else [loaded])
    if not tensors or not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in tensors):
        raise ApplyError(f"{path} must hold a tensor, a tuple of tensors or a dict of tensors, each with the "
                         f"items along dim 0")
    counts = {int(t.shape[0]) for t in tensors}
    if len(counts) != 1 or 0 in counts:
        raise ApplyError(f"{path}: every tensor needs the same number of items (dim 0), at least 1; found "
                         f"{sorted(counts)}")
    return counts.pop()


def dataset_of(args: argparse.Namespace, pool: int = 8, seed: int = 0) -> Any:
    """The inputs that feed the child's model (`dataset_for`): token ids for an `hf:` model, after the
    first batch cycling over the lengths spread across its bucket where `rounds.per_length` says so
    (`lengths`)."""
    shape = tuple(int(n) for n in args.item_shape.split("x"))
    text = hf.is_source(args.model) and not args.example_inputs
    tokens = hf.token_inputs(args.model, args.task) if text else None
    lengths = tuple(getattr(args, "lengths", shape[:1]))
    if tokens is not None and lengths != shape[:1]:
        return SpreadTokens(shape[0], lengths, tokens, args.batch_size, pool, seed)
    return dataset_for(shape, args.example_inputs, pool, seed, tokens)


def dataset_for(item_shape: tuple[int, ...], example_inputs: str = "", pool: int = 8, seed: int = 0,
                tokens: hf.Tokens | None = None) -> Any:
    """The inputs that feed the model; `pool` distinct random items from `seed` (a user's own
    inputs are what they are); with `tokens`, token ids of the length `item_shape` says."""
    if example_inputs:
        return SavedInputs(example_inputs)
    if tokens is not None:
        return SyntheticTokens(item_shape[0], tokens, pool, seed)
    image = len(item_shape) == 3 and item_shape[0] == 3 and item_shape[1] >= 32
    return SyntheticImages(item_shape, pool, seed) if image else SyntheticTensors(item_shape, pool, seed)


def batches(dataset: Any, count: int, size: int, start: int) -> list[Any]:
    from torch.utils.data import default_collate

    return [default_collate([dataset[start + b * size + i] for i in range(size)]) for b in range(count)]
