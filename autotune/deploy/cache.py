"""What the cache folder holds and whether this torch and CPU can still use it (pruning it is
`cache_prune`'s).

A cache folder (`--cache-dir`, default studies/cache) holds compiled artifacts in `artifacts/`
(an AOTInductor package or a TorchScript file, each with a `.json` description, see
`model.convert`; for text generation, the model's saved folder and what each peer converted from
it, a GGUF file or an OpenVINO IR folder, and the transformers folder a `--model FILE.gguf` was
converted into, described alike, see `model.generate.converted`),
inductor's kernel cache in `inductor/<torch version>/`, and the eager outputs
that let a process load an artifact without building the model in `references/<torch version>/`. An export folder
(`autotune export --artifacts DIR`) holds artifacts directly. Exported env files in the current
folder that point at an artifacts folder (AUTOTUNE_ARTIFACTS) keep the artifacts they would load.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from autotune.base.errors import AutotuneError
from autotune.model import apply, backends, cpu, envfile, fallback, gguf_source, references
from autotune.model.artifacts import (
    ARTIFACT_FORMAT,
    CALIBRATION_KIND,
    GENERATED,
    GRAPH_KIND,
    RANKING_KIND,
    DescriptionError,
    description,
    installed_torch_version,
)
from autotune.model.convert import saved_knobs
from autotune.model.errors import ApplyError
from autotune.model.knobdefs import value_text
from autotune.model.knobs import ModelKnobs

# Each backend's artifact by its file suffix (eager's weight cache is a TorchScript file too).
KINDS = {b.suffix: f"{b.artifact_kind()} artifact" for b in backends.REGISTRY if b.suffix}
ARTIFACT_SUFFIXES = tuple(KINDS)
CALIBRATION = "int8 calibration batches"  # what `apply` without batches of its own calibrates on (convert.calibrated)
RANKING = "int8 layer ranking"  # model.fallback: which layers int8_fallback keeps in fp32, ranked once
REFERENCES = "eager outputs"  # model.references: what a process that only loads an artifact checks it with
UNFINISHED_AFTER_S = 3600.0  # a temporary file this old is a compile that was killed, not one running
SAVED_MODEL = "saved model artifact"  # a causal LM's save_pretrained folder, which the peers convert
GGUF_MODEL = "converted GGUF artifact"  # the transformers folder of a --model FILE.gguf (model.gguf_source)
OLD_GGUF = "converted GGUF files"  # where autotunes before that artifact converted them (artifacts/gguf/)
LOOSE_KERNELS = "torch unknown"  # the config of what older autotunes left loose in the kernel folder


@dataclass(frozen=True)
class Here:
    """What decides whether a cached entry can still be used: this torch and this CPU."""

    torch: str
    isa: tuple[str, ...]

    @staticmethod
    def now() -> Here:
        return Here(installed_torch_version(), cpu.isa())


@dataclass(frozen=True)
class Entry:
    kind: str  # "inductor artifact", "torchscript artifact", "inductor kernels", "unfinished"
    path: Path  # the artifact file, or the kernel folder
    model: str
    config: str
    size: int  # bytes
    last_used: float  # epoch seconds
    unusable: str  # "" when this torch and CPU can use it, else why not
    kept_by: tuple[str, ...] = ()  # env files in the current folder that point to it

    @property
    def key(self) -> str:
        """The hash an artifact is named by (`artifacts.artifact_path`), "" for other entries."""
        found = re.match(r"^[\w.]+?-([0-9a-f]{16})(\.|$)", self.path.name)
        return found.group(1) if found and self.kind.endswith("artifact") else ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), "key": self.key, "model": self.model, "config": self.config,
                "size_bytes": self.size, "last_used": self.last_used, "usable": not self.unusable,
                "unusable_reason": self.unusable, "kept_by": list(self.kept_by)}


@dataclass(frozen=True)
class Export:
    """An exported env file that loads artifacts from `folder` for these model knobs."""

    name: str
    folder: Path
    knobs: ModelKnobs
    threads: int | None


def scan(cache_dir: Path, here: Here, exports: Sequence[Export] = ()) -> list[Entry]:
    """Every entry of the cache folder, artifacts first, each marked with the env files keeping it."""
    found = [*artifacts(cache_dir / "artifacts", here), *artifacts(cache_dir, here),
             *kernels(cache_dir / "inductor", here), *per_torch(cache_dir / references.FOLDER, here, REFERENCES),
             *_old_conversions(cache_dir / "artifacts" / gguf_source.OLD_FOLDER)]
    return [_kept(entry, exports) for entry in found]


def artifacts(folder: Path, here: Here) -> list[Entry]:
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.iterdir() if p.is_file())
    entries = [_artifact(p, here) for p in files if p.suffix in ARTIFACT_SUFFIXES and not p.name.startswith(".")]
    orphans = [_orphan(p) for p in files if _is_description(p) and not Path(str(p)[:-5]).exists()]
    left = sorted(p for p in folder.iterdir() if p.name.startswith(".") and ".tmp" in p.name)
    unfinished = [_unfinished(p) for p in left]
    rankings = [_ranking(p, here) for p in files if p.name.startswith(f"{RANKING_KIND}-") and p.suffix == ".json"]
    return entries + _generated(files, here) + rankings + orphans + [u for u in unfinished if u is not None]


def _generated(files: Sequence[Path], here: Here) -> list[Entry]:
    """What text generation keeps (`model.generate.converted.cached`): a file or a folder, found by
    its description (whose task is generation), or that description alone where it is gone."""
    found = []
    for described in files:
        if described.suffix != ".json" or described.name.startswith(".") or _is_description(described):
            continue
        meta = _meta(described.with_suffix(""))
        if meta.get("task") != GENERATED:
            continue
        path = described.with_suffix("")
        found.append(_artifact(path, here) if path.exists() else _orphan(described))
    return found


def _old_conversions(folder: Path) -> list[Entry]:
    """The GGUF files older autotunes converted outside the artifacts, in one entry: never read again
    (a GGUF file is converted into an artifact the next time it is used), so unusable, and pruned."""
    if not folder.is_dir():
        return []
    return [Entry(OLD_GGUF, folder, "any", "", _tree_size(folder), _tree_mtime(folder),
                  "converted before conversions were artifacts; a file used again is converted again")]


def _ranking(path: Path, here: Here) -> Entry:
    """int8_fallback's ranking of a model's layers, which every count of layers kept reads; one that
    cannot be read is ranked again (so unusable, and pruned)."""
    meta = fallback.ranking_file(path)
    if meta is None:
        return Entry(RANKING, path, "?", "?", _size(path), _mtime(path), "it cannot be read; it is ranked again")
    return Entry(RANKING, path, str(meta.get("model") or "?"), _config(meta), _size(path), _mtime(path),
                 unusable(meta, here))


def _is_description(path: Path) -> bool:
    return path.name.endswith(tuple(f"{s}.json" for s in ARTIFACT_SUFFIXES)) and not path.name.startswith(".")


def _artifact(path: Path, here: Here) -> Entry:
    described = Path(f"{path}.json")
    kind = _kind(path)
    try:
        meta = description(path)
    except DescriptionError as exc:  # as if it had none: unusable, and pruned with it
        return Entry(kind, path, "?", "?", _size(path), _mtime(path),
                     f"its description {described.name} cannot be used ({exc})")
    return Entry(kind, path, str(meta.get("model", "?")), _config(meta),
                 sum(_size(f) for f in (*_files(path, meta), described)), _mtime(described), unusable(meta, here))


def _files(path: Path, meta: dict[str, Any]) -> tuple[Path, ...]:
    """The artifact's files but its description, as its backend saves them (OpenVINO's .bin too; every
    file of a folder that text generation keeps)."""
    if path.is_dir():
        return tuple(_tree_files(path))
    backend = str((meta.get("knobs") or {}).get("backend", ""))
    if meta.get("task") == GENERATED:
        return (path,)
    return backends.get(backend).files(path) if backend in backends.NAMES else (path,)


def artifact_files(path: Path) -> tuple[Path, ...]:
    """An artifact's files but its description, as its description says it was saved."""
    return _files(path, _meta(path))


def _kind(path: Path) -> str:
    """What an artifact file is; int8's quantized graph, from which each thread count's artifact is
    compiled, is no artifact an env file loads (so none keeps it); int8's calibration batches are
    what `apply` without batches of its own loads, so that it loads the artifact they made."""
    if path.name.startswith(f"{GRAPH_KIND}-"):
        return "int8 quantized graph"
    if path.name.startswith(f"{CALIBRATION_KIND}-"):
        return CALIBRATION
    meta = _meta(path) if path.suffix not in KINDS else {}
    if meta.get("task") == GENERATED:
        backend = (meta.get("knobs") or {}).get("backend")
        if path.name.startswith(f"{gguf_source.KIND}-"):
            return GGUF_MODEL
        return f"{backend} generation artifact" if backend else SAVED_MODEL
    return KINDS.get(path.suffix, "artifact")


def _meta(artifact: Path) -> dict[str, Any]:
    """The artifact's description, or nothing where it has no usable one (`_artifact` says why)."""
    try:
        return description(artifact)
    except DescriptionError:
        return {}


def unusable(meta: dict[str, Any], here: Here) -> str:
    """Why this torch and CPU can no longer load the artifact ("" when they can): the rule
    `model.convert.artifact_meta` keys artifacts by."""
    if meta.get("format") != ARTIFACT_FORMAT:
        return f"made in format {meta.get('format')}, this autotune reads {ARTIFACT_FORMAT}"
    if meta.get("task") == GENERATED:
        return _generation_unusable(meta, here)
    if meta.get("torch") != here.torch:
        return f"built for torch {meta.get('torch')}, this is {here.torch}"
    if tuple(meta.get("isa") or ()) != here.isa:
        return "built for a CPU with other instruction sets"
    backend = str((meta.get("knobs") or {}).get("backend", ""))
    found = backends.get(backend) if backend in backends.NAMES else None
    if "runtime" in meta and found is not None and found.version() != meta["runtime"]:
        return f"built for {backend} {meta['runtime']}, this is {found.version() or 'not installed'}"
    return ""


def _generation_unusable(meta: dict[str, Any], here: Here) -> str:
    """The same rule for what text generation keeps, which records only what it depends on: the torch
    that converted it where that matters (an OpenVINO IR), and its runtime's version."""
    if "torch" in meta and meta["torch"] != here.torch:
        return f"built for torch {meta['torch']}, this is {here.torch}"
    backend = str((meta.get("knobs") or {}).get("backend", ""))
    runtime = backends.get(backend).generation if backend in backends.NAMES else None
    if "runtime" in meta and runtime is not None and runtime.version() != meta["runtime"]:
        return f"converted for {backend} {meta['runtime']}, this is {runtime.version() or 'not installed'}"
    return ""


def _config(meta: dict[str, Any]) -> str:
    """The knobs that differ from PyTorch's defaults, the thread count and the input layout."""
    knobs = meta.get("knobs") if isinstance(meta.get("knobs"), dict) else {}
    default = asdict(ModelKnobs())
    parts = [f"{k}={value_text(v)}" for k, v in (knobs or {}).items() if default.get(k) != v]
    parts += [f"threads={meta['threads']}"] if "threads" in meta else []
    parts += [f"inputs {' '.join(map(str, meta.get('inputs') or []))}"] if "task" not in meta else []
    return " ".join(parts)


def _orphan(described: Path) -> Entry:
    return Entry("description", described, "?", "?", _size(described), _mtime(described),
                 "its artifact file is missing")


def _unfinished(path: Path) -> Entry | None:
    """A temporary file left by a compile that was killed; young ones may be a compile running now."""
    if time.time() - _mtime(path) < UNFINISHED_AFTER_S:
        return None
    return Entry("unfinished", path, "?", "?", _size(path), _mtime(path), "left by a compile that was stopped")


def kernels(folder: Path, here: Here) -> list[Entry]:
    """Inductor's kernel cache: one entry per torch version folder, plus what older autotunes left
    directly in the folder (not attributable to a torch version)."""
    if not folder.is_dir():
        return []
    entries = per_torch(folder, here, "inductor kernels")
    versioned = [entry.path for entry in entries]
    loose = [p for p in folder.iterdir() if p not in versioned]
    if loose:
        entries.append(Entry("inductor kernels", folder, "any", LOOSE_KERNELS, sum(_tree_size(p) for p in loose),
                             max(_tree_mtime(p) for p in loose), "made before kernels were kept per torch version"))
    return entries


def per_torch(folder: Path, here: Here, kind: str) -> list[Entry]:
    """One entry per torch version folder: what that torch made, usable by that torch only."""
    if not folder.is_dir():
        return []
    versioned = [p for p in sorted(folder.iterdir()) if p.is_dir() and is_version_folder(p.name)]
    return [Entry(kind, p, "any", f"torch {p.name}", _tree_size(p), _tree_mtime(p),
                  "" if p.name == here.torch else f"built by torch {p.name}, this is {here.torch}")
            for p in versioned]


def is_version_folder(name: str) -> bool:
    """A folder named by the torch version that made what it holds (`2.5.1`, `2.6.0+cpu`)."""
    return name[:1].isdigit() and "." in name


def _kept(entry: Entry, exports: Sequence[Export]) -> Entry:
    """An artifact, or the calibration batches an int8 one was made from, that an env file here loads."""
    if not entry.kind.endswith("artifact") and entry.kind != CALIBRATION:
        return entry
    meta = _meta(entry.path)
    names = tuple(e.name for e in exports if _points_to(e, entry.path, meta))
    return replace(entry, kept_by=names) if names else entry


def _points_to(export: Export, path: Path, meta: dict[str, Any]) -> bool:
    """The env file would load this artifact: same folder and model knobs (and thread count for
    inductor); inputs and weights are not in an env file, so every such artifact is kept."""
    if _resolved(export.folder) != _resolved(path.parent):
        return False
    if meta.get("task") == GENERATED:  # kept for the backend that generates with it (a saved model for any)
        return (meta.get("knobs") or {}).get("backend") in (None, export.knobs.backend)
    if meta.get("knobs") != saved_knobs(export.knobs):
        return False
    return "threads" not in meta or export.threads is None or meta["threads"] == export.threads


def _resolved(path: Path) -> Path:
    with contextlib.suppress(OSError):
        return path.resolve()
    return path.absolute()


def exports_in(folder: Path) -> tuple[list[Export], list[str]]:
    """The exported env files in `folder` that load artifacts, and a note per env file that
    cannot be read (it keeps nothing then; say so rather than guess)."""
    from autotune.deploy import export

    found, notes = [], []
    for path in sorted(folder.glob("*.env")):
        try:
            env = export.read(path).env
            knobs = apply.knobs_from_env(env, str(path))
        except (AutotuneError, ApplyError) as exc:
            if "is not an autotune env file" not in str(exc):
                notes.append(f"{path.name} keeps nothing: {exc}")
            continue
        if env.get(envfile.ARTIFACTS_VAR):
            threads = env.get("OMP_NUM_THREADS", "")
            found.append(Export(path.name, Path(env[envfile.ARTIFACTS_VAR]), knobs,
                                int(threads) if threads.isdigit() else None))
    return found, notes



def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _tree_files(folder: Path) -> list[Path]:
    if folder.is_file():
        return [folder]
    found: list[Path] = []
    for root, _, names in os.walk(folder):
        found += [Path(root, n) for n in names]
    return found


def _tree_size(folder: Path) -> int:
    return sum(_size(p) for p in _tree_files(folder))


def _tree_mtime(folder: Path) -> float:
    return max([_mtime(p) for p in _tree_files(folder)] or [_mtime(folder)])
