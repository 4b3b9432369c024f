"""The user's data (`--eval-data`) inside the child: read, cut into items, and split into the parts
that never share an item.

Formats (docs/quality.md):
- a plain UTF-8 text file, for `--task generate`: tokenized by the model's own tokenizer and cut into
  consecutive windows of `window` tokens, each scored on its second half as llama.cpp's
  `llama-perplexity` does (the first half is context);
- a folder of class folders (torchvision's ImageFolder layout, `FOLDER/CLASS/IMAGE`): the classes
  sorted by name are labels 0, 1, ...; each image decoded and preprocessed as the synthetic ones are
  (resize, center crop, ImageNet's normalisation) to the model's input shape;
- a `torch.save` file of labelled inputs: `{"inputs": X, "labels": Y}` or the pair `(X, Y)`, X a
  tensor, tuple or dict of tensors with the items along dim 0 (as `--example-inputs`), Y integer
  class labels, one per item.

Splits: labelled items are shuffled once (seed 0); the first `calibration_items` of them calibrate
(precision=int8 observes them), the rest alternate between the search's evaluation (even) and the
confirmation's (odd). Text windows alternate the same way; nothing calibrates on text (generation's
precisions are weight-only). torch is imported inside functions.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.model.batches import explain
from autotune.model.errors import ApplyError

SPLITS = ("search", "confirm")  # the held-out parts: a search's trials, and the confirmation's re-check
CALIBRATION_SHARE, CALIBRATION_MAX = 0.2, 256  # labelled items kept for calibration: a fifth, at most 256
WINDOW_TOKENS = 512  # a text window, as llama-perplexity's default context (less where the model's positions end)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
BAD_DATA = "--eval-data"  # every message about the user's data starts so: the harness refuses it (exit 2)


def calibration_items(count: int) -> int:
    """How many of `count` labelled items are kept for calibration (never evaluated)."""
    return min(CALIBRATION_MAX, math.floor(count * CALIBRATION_SHARE))


@dataclass(frozen=True)
class Labelled:
    """Labelled items: `inputs` a tensor, tuple or dict of tensors (items along dim 0), `labels` int64 [items]."""

    inputs: Any
    labels: Any

    @property
    def count(self) -> int:
        return int(self.labels.shape[0])

    def take(self, indices: list[int]) -> Labelled:
        import torch
        from torch.utils import _pytree

        index = torch.as_tensor(indices, dtype=torch.int64)
        return Labelled(_pytree.tree_map(lambda t: t[index], self.inputs), self.labels[index])

    def part(self, name: str) -> Labelled:
        """`calibration`, `search` or `confirm` (the module's doc)."""
        import torch

        order = torch.randperm(self.count, generator=torch.Generator().manual_seed(0)).tolist()
        kept = calibration_items(self.count)
        rest = order[kept:]
        chosen = {"calibration": order[:kept], "search": rest[0::2], "confirm": rest[1::2]}[name]
        return self.take(chosen)

    def batches(self, size: int) -> list[tuple[Any, Any, int]]:
        """Batches of `size` items: (inputs, labels, how many are real); the last one filled up by
        repeating its first item (a compiled model may take one batch size only)."""
        import torch
        from torch.utils import _pytree

        found = []
        for start in range(0, self.count, size):
            stop = min(start + size, self.count)
            index = torch.arange(start, stop)
            if stop - start < size:
                index = torch.cat([index, index[:1].repeat(size - (stop - start))])
            found.append((_pytree.tree_map(lambda t, at=index: t[at], self.inputs), self.labels[index], stop - start))
        return found


@functools.lru_cache(maxsize=1)
def load_labelled(path: str, item_shape: tuple[int, ...]) -> Labelled:
    """A folder of class folders or a `torch.save` file of labelled inputs (the module's doc); read
    once per process (int8's calibration and the judging both take their parts from it; parts are
    copies, so nobody changes what is kept)."""
    source = Path(path)
    found = _image_folder(source, item_shape) if source.is_dir() else _saved(source)
    if found.count < 3:
        raise ApplyError(f"{BAD_DATA} {path} holds {found.count} item(s); give at least 3 (one to calibrate, one "
                         f"for the search and one for the confirmation), better hundreds")
    return found


def _saved(path: Path) -> Labelled:
    import torch

    from autotune.child.inputs import example_count

    try:
        loaded = torch.load(path, weights_only=True)
    except Exception as exc:
        raise ApplyError(f"{BAD_DATA} {path} cannot be read by torch.load ({explain(exc)}); save "
                         f'{{"inputs": X, "labels": Y}} with torch.save') from None
    if isinstance(loaded, dict) and set(loaded) == {"inputs", "labels"}:
        inputs, labels = loaded["inputs"], loaded["labels"]
    elif isinstance(loaded, (tuple, list)) and len(loaded) == 2:
        inputs, labels = loaded
    else:
        raise ApplyError(f"{BAD_DATA} {path} holds no labels: save {{\"inputs\": X, \"labels\": Y}} (or the pair "
                         f"(X, Y)) with torch.save, Y a class label per item")
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    count = example_count(inputs, f"{BAD_DATA} {path}: its inputs")
    if not (isinstance(labels, torch.Tensor) and labels.dim() == 1 and not labels.is_floating_point()
            and not labels.is_complex()):
        raise ApplyError(f"{BAD_DATA} {path}: the labels must be a 1-D integer tensor (a class per item)")
    if int(labels.shape[0]) != count:
        raise ApplyError(f"{BAD_DATA} {path}: {labels.shape[0]} labels for {count} inputs; give one label per item")
    return Labelled(inputs, labels.to(torch.int64))


def _image_folder(folder: Path, item_shape: tuple[int, ...]) -> Labelled:
    import torch

    from autotune.child.inputs import preprocess

    classes = sorted(entry for entry in folder.iterdir() if entry.is_dir())
    images = [(image, label) for label, entry in enumerate(classes)
              for image in sorted(entry.iterdir()) if image.suffix.lower() in IMAGE_SUFFIXES and image.is_file()]
    if not images:
        raise ApplyError(f"{BAD_DATA} {folder} holds no labelled images: put each class's images in a folder of "
                         f"its own (FOLDER/CLASS/IMAGE.png), or save a tensor pair with torch.save")
    if len(item_shape) != 3 or item_shape[0] not in (1, 3):
        raise ApplyError(f"{BAD_DATA} {folder} is a folder of images, and the model takes items of shape "
                         f"{'x'.join(map(str, item_shape))}, not an image (1 or 3 channels x height x width)")
    from torchvision.io import ImageReadMode, decode_image

    mode = ImageReadMode.RGB if item_shape[0] == 3 else ImageReadMode.GRAY
    resize, crop = item_shape[1] * 256 // 224, (item_shape[1], item_shape[2])
    made = []
    for image, _ in images:
        try:
            decoded = decode_image(str(image), mode=mode)
        except Exception as exc:
            raise ApplyError(f"{BAD_DATA}: cannot decode {image} ({explain(exc)}); remove it or convert it to PNG") \
                from None
        made.append(preprocess(decoded, resize, crop) if item_shape[0] == 3 else
                    _gray(decoded, resize, crop))
    return Labelled(torch.stack(made), torch.tensor([label for _, label in images], dtype=torch.int64))


def _gray(image: Any, short_side: int, crop: tuple[int, int]) -> Any:
    """A one-channel image resized and cropped as `preprocess` does, scaled to [0, 1] (no ImageNet means)."""
    import torch

    from autotune.child.inputs import preprocess

    three = preprocess(image.expand(3, -1, -1), short_side, crop)[:1]
    return three * torch.tensor(0.229) + torch.tensor(0.485)  # undo the red channel's normalisation


def check_shape(data: Labelled, item_shape: tuple[int, ...], path: str) -> None:
    """The data's items are of the shape the model is timed on (what a compiled model takes)."""
    from autotune.model.batches import leaves

    found = tuple(int(n) for n in leaves(data.inputs)[0].shape[1:])
    if found != item_shape:
        shown, timed = "x".join(map(str, found)) or "scalar", "x".join(map(str, item_shape))
        raise ApplyError(f"{BAD_DATA} {path} holds items of shape {shown}, and the model is timed on items of shape "
                         f"{timed}; give --input-shape {shown} (or --seq-len), or save the data at {timed}")


def check_labels(labels: Any, classes: int, path: str) -> None:
    """Every label is one of the model's `classes` output scores."""
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= classes:
        bad = low if low < 0 else high
        raise ApplyError(f"{BAD_DATA} {path}: label {bad} is outside the model's {classes} classes (its output has "
                         f"{classes} scores per item); give labels 0 to {classes - 1}")


def text_windows(path: str, tokenizer: Any, window: int) -> list[Any]:
    """The text's token ids cut into consecutive windows of `window` tokens (the tail that fills no
    window left out), each an int64 tensor [window]."""
    import torch

    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ApplyError(f"{BAD_DATA} {path} is not UTF-8 text; --task generate judges a plain text file") from None
    except OSError as exc:
        raise ApplyError(f"{BAD_DATA} {path} cannot be read ({exc.strerror or exc})") from None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < 2 * window:
        raise ApplyError(f"{BAD_DATA} {path} is {len(ids)} tokens long, shorter than two windows of {window} (one "
                         f"for the search, one for the confirmation); give a longer text")
    tokens = torch.tensor(ids, dtype=torch.int64)
    return [tokens[start:start + window] for start in range(0, len(ids) - window + 1, window)]


def window_part(windows: list[Any], name: str) -> list[Any]:
    """The search's windows (even) or the confirmation's (odd)."""
    return windows[0::2] if name == "search" else windows[1::2]


def window_length(config: Any) -> int:
    """WINDOW_TOKENS, or the model's positions where they end sooner (an even number)."""
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    length = min(WINDOW_TOKENS, int(positions)) if isinstance(positions, int) and positions > 0 else WINDOW_TOKENS
    return length - length % 2


def tokenizer_of(spec: str) -> Any:
    """The tokenizer saved beside an `hf:` folder's model; one line saying what to do without one."""
    from autotune.model import hf

    folder = hf.folder_of(spec)
    if folder is None:
        raise ApplyError(f"{BAD_DATA}: {spec} is built from a configuration and has no tokenizer to read a text with; "
                         f"give a folder (hf:./model) saved with its tokenizer (tokenizer.save_pretrained)")
    transformers = hf.transformers_module()
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as exc:
        raise ApplyError(f"{BAD_DATA}: {folder} has no tokenizer transformers can load ({explain(exc)}); save it "
                         f"beside the model with tokenizer.save_pretrained") from None
