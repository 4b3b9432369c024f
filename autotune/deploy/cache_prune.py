"""Pruning the cache folder: which of `cache.scan`'s entries go (unusable here, or unused for
longer than asked, never one an env file keeps unless asked), removing them, and saying what stayed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autotune.deploy.cache import LOOSE_KERNELS, Entry, artifact_files, is_version_folder


def to_prune(entries: Iterable[Entry], older_than_s: float | None, now: float,
             include_exported: bool) -> list[Entry]:
    """Entries this torch or CPU cannot use, and entries unused for longer than `older_than_s`;
    never one that an env file keeps unless `include_exported`."""
    chosen = [e for e in entries if e.unusable or (older_than_s is not None and now - e.last_used > older_than_s)]
    return [e for e in chosen if include_exported or not e.kept_by]


@dataclass(frozen=True)
class Pruned:
    """What a prune did: the entries it removed, and those it kept, each with why (`remove`'s reason)."""

    removed: tuple[Entry, ...] = ()
    kept: tuple[tuple[Entry, str], ...] = ()


def prune(chosen: Iterable[Entry]) -> Pruned:
    """Remove each chosen entry; what was removed and what stayed are told apart, never assumed."""
    outcomes = [(entry, remove(entry)) for entry in chosen]
    return Pruned(tuple(e for e, why in outcomes if not why), tuple((e, why) for e, why in outcomes if why))


def unremoved(pruned: Pruned) -> str:
    """What a prune could not remove, in one line with what to do ("" when it removed all it chose)."""
    if not pruned.kept:
        return ""
    (first, why), count = pruned.kept[0], len(pruned.kept) + len(pruned.removed)
    more = f", and {len(pruned.kept) - 1} more" if len(pruned.kept) > 1 else ""
    return (f"{len(pruned.kept)} of the {count} entries to prune could not be removed (cannot remove {first.path}: "
            f"{why}{more}); they are kept: make the cache folder writable for this user, then prune again")


def remove(entry: Entry) -> str:
    """Delete one entry: the artifact before its description, so that a stop halfway leaves an
    orphan description that the next prune removes, never an artifact that looks described.
    Returns "" or why it could not be removed (the system's words: "Permission denied")."""
    try:
        if entry.path.is_dir():
            shutil.rmtree(entry.path) if entry.config != LOOSE_KERNELS else _remove_loose(entry.path)
            if not entry.kind.endswith("artifact"):
                return ""
        for path in () if entry.path.is_dir() else artifact_files(entry.path):
            path.unlink(missing_ok=True)
        if entry.kind.endswith("artifact"):
            Path(f"{entry.path}.json").unlink(missing_ok=True)
    except OSError as exc:
        return str(exc.strerror or exc)
    return ""


def _remove_loose(folder: Path) -> None:
    for path in list(folder.iterdir()):
        if path.is_dir() and is_version_folder(path.name):
            continue
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
