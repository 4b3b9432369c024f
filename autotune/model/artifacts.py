"""Compiled artifacts on disk: where the one for a model, its knobs, inputs, torch and CPU lives,
saving it atomically with its description, and what its description records (the int8 guard's
figures). Each backend builds and loads its own (`autotune.model.backends`).

torch is imported inside functions.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.model import schema
from autotune.model.envfile import ARTIFACTS_VAR
from autotune.model.errors import ApplyError
from autotune.model.files import read_text, replacing, write_atomically

ARTIFACT_FORMAT = "autotune-artifact-v1"  # bumped when what a saved file holds changes
# What an artifact's description (`<artifact>.json`, `convert.artifact_meta` and what its backend adds)
# holds: read only through `description`.
DESCRIPTION = schema.record({"format": schema.text}, {
    "knobs": schema.map_of(schema.scalar), "inputs": schema.list_of(schema.text), "torch": schema.text,
    "isa": schema.list_of(schema.text), "weights": schema.text, "model": schema.text, "threads": schema.positive,
    "runtime": schema.optional(schema.text), "calibration": schema.text, "int8_remedy": schema.text,
    "outputs": schema.text, "batches": schema.integer, "guarded": schema.map_of(schema.map_of(schema.anything)),
    "int8_fallback": schema.map_of(schema.anything)})


class DescriptionError(ValueError):
    """An artifact's description that cannot be read, or is not one; the message says why."""


def description(artifact: str | os.PathLike[str]) -> dict[str, Any]:
    """The description kept beside `artifact`, as `DESCRIPTION` says it must be; DescriptionError
    saying why not (missing, not a file, not text, not JSON, a field of the wrong type)."""
    try:
        return schema.loads(read_text(f"{os.fspath(artifact)}.json"), DESCRIPTION)
    except OSError as exc:
        raise DescriptionError(exc.strerror or str(exc)) from None
    except UnicodeDecodeError:
        raise DescriptionError("not text") from None
    except schema.SchemaError as exc:
        raise DescriptionError(str(exc)) from None


def fingerprint(model: Any) -> str:
    """What a saved artifact bakes in: the model's structure (its printed form and the source of
    each module type's forward) and the bytes of every weight and buffer, so that a model with
    other code or other weights never loads another's artifact."""
    import torch

    digest = hashlib.sha256(f"{type(model).__module__}.{type(model).__qualname__}\n{model}\n".encode())
    for source in sorted({_forward_source(m) for m in model.modules()}):
        digest.update(source.encode())
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if isinstance(tensor, torch.Tensor):
                hash_tensor(digest, name, tensor)
    return digest.hexdigest()[:20]


def hash_tensor(digest: Any, name: str, tensor: Any) -> None:
    """Add a tensor's name, shape, dtype and bytes to a hashlib digest."""
    import torch

    values = (tensor.to_dense() if tensor.is_mkldnn else tensor).detach().contiguous()
    digest.update(f"{name}|{tuple(values.shape)}|{values.dtype}\n".encode())
    digest.update(values.reshape(-1).view(torch.uint8).numpy().tobytes())


def _forward_source(module: Any) -> str:
    kind = type(module)
    try:
        return inspect.getsource(kind.forward)
    except (OSError, TypeError, AttributeError):  # built in, compiled, or scripted: its name stands in
        return f"{kind.__module__}.{kind.__qualname__}"


def mark_used(path: Path) -> None:
    """A loaded artifact's description gets the time of use, so `autotune cache` can tell which
    artifacts nobody has used for a while (atime is not kept on most mounts)."""
    with contextlib.suppress(OSError):
        os.utime(f"{path}.json")


def save_batches(path: Path, batches: Sequence[Any], meta: dict[str, Any]) -> None:
    """Input batches (tensors, tuples or dicts of them) saved as dense tensors, with their description."""
    import torch
    from torch.utils import _pytree

    dense = [_pytree.tree_map(lambda x: x.to_dense() if isinstance(x, torch.Tensor) and x.is_mkldnn else x, batch)
             for batch in batches]
    save_artifact(path, lambda tmp: torch.save(dense, str(tmp)), meta)


def load_batches(path: Path) -> list[Any] | None:
    """Batches `save_batches` wrote; None when the file cannot be read as such (damaged, or from
    something else), which the caller treats as not saved."""
    import torch

    try:
        loaded = torch.load(str(path), weights_only=True)
    except Exception:
        return None
    return loaded if isinstance(loaded, list) and loaded else None


def installed_torch_version() -> str:
    """`torch.__version__` without importing torch (seconds): read from torch/version.py, which the
    build writes; what `artifact_meta` records."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        with contextlib.suppress(OSError):
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", Path(folder, "version.py").read_text(), re.M)
            if found:
                return found.group(1)
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


GENERATED = "generate"  # an artifact's "task" where text generation made it (`autotune.model.generate.converted`)
GRAPH_KIND = "int8graph"  # the file name's prefix of int8's quantized graph (`backends.inductor.graph_path`)
CALIBRATION_KIND = "int8calibration"  # the prefix of the batches int8 was calibrated on (`convert.calibration_path`)
RANKING_KIND = "int8ranking"  # the prefix of int8_fallback's ranking of the layers (`fallback.ranking_path`)


def artifact_path(folder: Path, meta: dict[str, Any], suffix: str, kind: str) -> Path:
    """Where the artifact of `kind` (its backend's, or an int8 graph's) for exactly this model, knobs,
    inputs, torch and CPU lives."""
    key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"{kind}-{key}{suffix}"


def stale_artifacts(folder: Path, meta: dict[str, Any]) -> list[str]:
    """Artifacts of this very model, knobs and inputs made for another torch, CPU or format: never
    loaded, named so that their rebuild is not silent (another input shape is another artifact)."""
    same = ("weights", "knobs", "inputs")
    found = []
    for described in sorted(folder.glob("*.json")):
        try:
            other = description(described.with_suffix(""))
        except DescriptionError:
            continue
        if any(other.get(key) != meta[key] for key in same):
            continue
        differs = [f"{key} {other.get(key)} (here {meta.get(key)})" for key in ("torch", "runtime", "isa", "format")
                   if other.get(key) != meta.get(key)]
        if differs:
            found.append(f"{described.name[:-5]}: it was built for {', '.join(differs)}")
    return found


def save_artifact(path: Path, save: Callable[[Path], object], meta: dict[str, Any]) -> None:
    """Atomically: the file (or folder: a converted model) and its description appear complete or not
    at all, whatever fails; the folders made for it go again when it fails. A folder another process
    saved first is kept, and this one dropped."""
    made = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the description first: no process finds an artifact without it
        with replacing(path, suffix=path.suffix) as tmp:  # aoti wants its .pt2 suffix
            save(tmp)
            write_atomically(f"{path}.json", json.dumps(meta, indent=1))
    except BaseException as exc:
        if isinstance(exc, OSError) and path.is_dir() and Path(f"{path}.json").is_file():
            return  # a folder is not renamed over another: the other process's copy stays
        for folder in made:  # deepest first; one another process filled meanwhile stays
            with contextlib.suppress(OSError):
                folder.rmdir()
        if not isinstance(exc, OSError):
            raise
        raise ApplyError(f"cannot save the compiled model into {path.parent}: {exc.strerror or exc}; point "
                         f"{ARTIFACTS_VAR} at a writable folder, or unset it to compile in each process") \
            from None


def guard_record(path: Path, key: str) -> dict[str, Any] | None:
    """What the int8 guard measured on this artifact for the inputs `key` names, as an earlier
    process recorded it in the artifact's description (`remember_guard`); None when none did."""
    try:
        found: dict[str, Any] | None = description(path).get("guarded", {}).get(key)
    except DescriptionError:
        return None
    return found


def remember_guard(path: Path, key: str, record: dict[str, Any]) -> None:
    """Add the guard's figures to the artifact's description, atomically; a description that
    cannot be written costs the next process only the time of guarding again."""
    with contextlib.suppress(OSError, DescriptionError):
        meta = description(path)
        meta["guarded"] = {**meta.get("guarded", {}), key: record}
        write_atomically(f"{path}.json", json.dumps(meta, indent=1))
