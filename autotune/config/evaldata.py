"""`--eval-data` and `--max-quality-drop` at the edge: the user's data checked for what can be told
without the model (a readable file or folder of the kind the task reads), the drop parsed. What needs
the model (a text shorter than two windows, labels beyond its classes) the probe child says
(`autotune.child.evaldata`), as one line too."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

from autotune.base.errors import ConfigError, ModelError
from autotune.model.envfile import has_control

FLAG = "--eval-data"
METRIC_FLAG = "--eval "  # every message about the user's metric starts so


def check(text: str, generates: bool) -> str:
    """The absolute path of the user's data, checked: a non-empty regular file (a text for `--task
    generate`, a `torch.save` file otherwise) or, for a classifier, a folder of class folders."""
    path = Path(text).expanduser().resolve()
    if has_control(str(path)):
        raise ModelError(f"{FLAG} {text!r} holds a control character; rename it")
    try:
        found = os.stat(path)
    except OSError as exc:
        raise ModelError(f"{FLAG} {text!r} cannot be read ({exc.strerror}); give a file of labelled inputs "
                         f"(torch.save), a folder of class folders of images, or for --task generate a text file") \
            from None
    if stat.S_ISDIR(found.st_mode):
        if generates:
            raise ModelError(f"{FLAG} {text!r} is a folder; --task generate reads a plain text file")
        _check_folder(path, text)
    elif not stat.S_ISREG(found.st_mode):
        raise ModelError(f"{FLAG} {text!r} is not a regular file (a pipe or a device); copy the data to a file")
    elif found.st_size == 0:
        raise ModelError(f"{FLAG} {text!r} is empty; give the data to judge the model on")
    return str(path)


def _check_folder(path: Path, text: str) -> None:
    """A folder of labelled images holds one folder per class (ImageFolder's layout)."""
    try:
        classes = [entry for entry in path.iterdir() if entry.is_dir()]
    except OSError as exc:
        raise ModelError(f"{FLAG} {text!r} cannot be listed ({exc.strerror})") from None
    if not classes:
        raise ModelError(f"{FLAG} {text!r} has no class folders, so no labels: put each class's images in a folder "
                         f"named after it ({text}/CLASS/IMAGE.png)")


def parse_drop(text: str | None) -> float | None:
    """`--max-quality-drop X` or `X%`: accuracy points, or percent of perplexity (the task says
    which); a number of 0 or more."""
    if text is None:
        return None
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"--max-quality-drop {text!r} is not a drop; give 0 or more, like 1 (accuracy points) or "
                          f"2% (of perplexity)")
    return value


def check_drop(drop: float | None, eval_data: str | None, metric: str | None = None) -> None:
    """A quality drop is measured on the user's data, or by the user's metric, only."""
    if drop is not None and not eval_data and not metric:
        raise ConfigError("--max-quality-drop needs --eval-data or --eval: quality is judged on your data "
                          "(labelled inputs, or a text for --task generate) or by your metric")


def digest(path: str) -> str:
    """What a study records of its data, so that a resume judges on the same: a file's content
    (sha256), a folder's every file by relative path, size and modification time."""
    import hashlib

    hashed = hashlib.sha256()
    root = Path(path)
    if root.is_dir():
        for entry in sorted(root.rglob("*")):
            if entry.is_file():
                found = entry.stat()
                hashed.update(f"{entry.relative_to(root)}\0{found.st_size}\0{found.st_mtime_ns}\n".encode())
    else:
        with root.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                hashed.update(block)
    return f"{root.name}:{hashed.hexdigest()[:16]}"


DIRECTIONS = ("higher", "lower")  # --eval-direction: which way the metric is better


def check_metric(text: str | None, direction: str | None) -> tuple[str, str, str]:
    """`--eval MODULE:FUNCTION` and its `--eval-direction`: the spec, the folder it is imported from
    (where autotune runs, as a model factory is) and the direction; ("", "", "") without one. Whether
    it imports and what it returns, the probe child says."""
    if text is None:
        if direction is not None:
            raise ConfigError("--eval-direction says which way --eval's metric is better; add --eval MODULE:FUNCTION")
        return "", "", ""
    module, _, function = text.partition(":")
    if not module or not function.isidentifier() or has_control(text) or not all(
            part.isidentifier() for part in module.split(".")):
        raise ConfigError(f"--eval {text!r} is not MODULE:FUNCTION (a function called with the model and the "
                          f"evaluation batches, returning a float)")
    if direction not in DIRECTIONS:
        raise ConfigError(f"--eval {text} needs --eval-direction higher or lower: which way its metric is better")
    return text, os.getcwd(), direction
