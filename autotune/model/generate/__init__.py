"""Text generation (`--task generate`): how a model becomes a generator as the knobs say. Which
runtime generates for each backend is the backend's generation concern (`Backend.generation` in the
registry of `autotune.model.backends`), one module each behind `base.Generator`. The measuring
child and `autotune.apply` both call `generator`, so what is measured is what is served.

backend=eager and backend=inductor generate in PyTorch (`pytorch`); the peers convert the model's
`save_pretrained` folder with their own tools: backend=openvino runs OpenVINO GenAI
(`openvino_genai`), backend=llamacpp llama.cpp (`llamacpp`). That folder, and what each peer
converts, are artifacts of the one cache (`converted.cached`).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from autotune.model import backends, hf
from autotune.model.errors import ApplyError
from autotune.model.generate.base import Build, Generator
from autotune.model.generate.converted import cached

SAVED_KIND = "transformers"  # the saved folder's name prefix in the cache
SAVED_SUFFIX = ".hf"  # and its suffix


def generator(model: Any, knobs: Any, setup: dict[str, Any], *, spec: str = "", cache: Path | None = None,
              threads: int | None = None) -> Generator:
    """`model` (a transformers causal LM, fp32) as the knobs say: converted in place for PyTorch, or
    handed to a peer as its `save_pretrained` folder (`spec`'s own folder, else saved into `cache`,
    the artifact cache where a peer also keeps what it converts)."""
    runtime = backends.get(knobs.backend).generation if knobs.backend in names() else None
    if runtime is None:
        raise ApplyError(f"backend={knobs.backend} does not generate text; use backend={'/'.join(names())}")
    if not backends.installed(knobs.backend, generates=True):
        raise ApplyError(backends.not_installed(knobs.backend, generates=True))
    if runtime.reads_folder and cache is None:
        raise ApplyError(f"backend={knobs.backend} converts the model into a folder; give apply an artifacts folder")
    folder = Path(hf.folder_of(spec) or saved(model, cache)) if runtime.reads_folder and cache else None
    used = threads or int(os.environ.get("OMP_NUM_THREADS") or 0) or (os.cpu_count() or 1)
    build = Build(folder, knobs.precision, used, cache or Path(), None if folder else model, knobs)
    made: Generator = importlib.import_module(runtime.module).build(build, setup)
    return made


def names() -> tuple[str, ...]:
    """The backends that generate text (those of the registry with a generation concern)."""
    return tuple(b.name for b in backends.generating())


def saved(model: Any, cache: Path) -> Path:
    """The model as `save_pretrained` writes it (fp32 safetensors), an artifact of the cache named
    by its weights' fingerprint: saved once, reused after."""
    from autotune.model.artifacts import fingerprint

    def save(folder: Path, described: dict[str, Any]) -> None:
        hf.transformers_module().utils.logging.disable_progress_bar()
        model.save_pretrained(folder)

    key = {"weights": fingerprint(model), "model": str(getattr(model.config, "model_type", "?"))}
    return cached(cache, SAVED_KIND, SAVED_SUFFIX, key, save)[0]
