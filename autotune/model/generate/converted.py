"""What the runtimes that convert a model to generate text share (llama.cpp, OpenVINO GenAI; the
`save_pretrained` folder they convert from too): importing a runtime or saying how to install it,
the versions that key what it converts, an error on one line, the bytes a decode step reads, the
key of the folder converted, and keeping what is converted in the one artifact cache.

Everything a runtime converts goes through `cached`: named by the hash of what it depends on
(`artifacts.artifact_path`), saved whole or not at all with its description beside it
(`artifacts.save_artifact`), reused when present, its time of use marked; `autotune cache` lists,
sizes and prunes it like a compiled model.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from autotune.model.artifacts import (
    ARTIFACT_FORMAT,
    GENERATED,
    DescriptionError,
    artifact_path,
    description,
    mark_used,
    save_artifact,
)
from autotune.model.errors import ApplyError

SMALL_FILE = 1 << 20  # a folder's files below this size are hashed whole into its key
ONE_LINE = 300  # characters of an error message kept


def import_runtime(module: str, runtime: str, install: str) -> Any:
    """The module `module` of a runtime, or ApplyError naming the runtime and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ApplyError(f"the {runtime} peer needs {module} ({one_line(exc)}); {install}") from None


def versions(distributions: Iterable[str]) -> dict[str, str]:
    """Each distribution's installed version, "absent" where it is not installed."""
    found: dict[str, str] = {}
    for name in distributions:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def one_line(error: BaseException | str) -> str:
    """An error's message on one line (a runtime's first line is often only a source location), cut at
    ONE_LINE characters; an exception's with its type."""
    text = " ".join(str(error).split())
    text = text if len(text) <= ONE_LINE else text[:ONE_LINE - 3] + "..."
    if isinstance(error, str):
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def decode_bytes(weights: int, embedding: int, tied: bool) -> int:
    """The bytes of weights a decode step reads, of `weights` in all: every weight but the token
    embedding table (`embedding` bytes), of which a step reads one row, unless the output layer is
    that table (`tied`) and reads it whole."""
    return weights if tied else weights - embedding


def source_key(folder: Path) -> str:
    """What names a `save_pretrained` folder's weights in a converted artifact's key: the weights'
    fingerprint where the folder is itself a cached artifact (`generate.saved`), else every file's
    name, size and modification time, and the contents of the small ones (config.json...)."""
    try:
        weights = description(folder).get("weights")
    except DescriptionError:
        weights = None
    if isinstance(weights, str) and weights:
        return weights
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    if not any(path.name == "config.json" for path in files):
        raise ApplyError(f"{folder} has no config.json; save the model with save_pretrained")
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        if stat.st_size < SMALL_FILE:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def model_type(folder: Path) -> str:
    """The folder's config.json `model_type`: what `autotune cache` shows as the artifact's model."""
    try:
        return str(json.loads((folder / "config.json").read_text()).get("model_type") or "?")
    except (OSError, ValueError, AttributeError):
        return "?"


def cached(cache: Path, kind: str, suffix: str, key: dict[str, Any],
           make: Callable[[Path, dict[str, Any]], None]) -> tuple[Path, bool]:
    """The artifact of `kind` for `key` (what it depends on) in the artifact cache: reused when there,
    else made by `make(path, described)` (a file or a folder at `path`; what it adds to `described`
    is kept in its description). Returns the path and whether it was reused."""
    meta = {"format": ARTIFACT_FORMAT, "task": GENERATED, **key}
    path = artifact_path(cache, meta, suffix, kind)
    try:
        description(path)
    except DescriptionError:
        pass
    else:
        if path.exists():
            mark_used(path)
            return path, True
    described = dict(meta)
    save_artifact(path, lambda tmp: make(tmp, described), described)
    return path, False
