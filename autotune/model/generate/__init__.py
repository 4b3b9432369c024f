"""Text generation (`--task generate`): which runtime generates for each backend, one module each
behind `base.Generator`, and how a model becomes a generator as the knobs say. The measuring child
and `autotune.apply` both call `generator`, so what is measured is what is served.

backend=eager and backend=inductor generate in PyTorch (`pytorch`); the peers convert the model's
`save_pretrained` folder with their own tools: backend=openvino runs OpenVINO GenAI
(`openvino_genai`), backend=llamacpp llama.cpp (`llamacpp`).
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path
from typing import Any

from autotune.model import hf
from autotune.model.errors import ApplyError
from autotune.model.generate.base import Generator, PeerBuild

# backend -> the module of autotune.model.generate that generates with it
RUNTIMES = {"eager": "pytorch", "inductor": "pytorch", "openvino": "openvino_genai", "llamacpp": "llamacpp"}
BACKENDS = tuple(RUNTIMES)


def generator(model: Any, knobs: Any, setup: dict[str, Any], *, spec: str = "", work: Path | None = None,
              threads: int | None = None) -> Generator:
    """`model` (a transformers causal LM, fp32) as the knobs say: converted in place for PyTorch, or
    handed to a peer as its `save_pretrained` folder (`spec`'s own folder, else saved under `work`)."""
    from autotune.model.generate import pytorch

    if knobs.backend not in RUNTIMES:
        raise ApplyError(f"backend={knobs.backend} does not generate text; use backend={'/'.join(BACKENDS)}")
    if RUNTIMES[knobs.backend] == "pytorch":
        pytorch.convert(model, knobs, setup)
        setup["weight_bytes"] = pytorch.weight_bytes(model)
        return pytorch.TorchGenerator(model, knobs.kv_cache == "static", knobs.backend == "inductor")
    if work is None:
        raise ApplyError(f"backend={knobs.backend} converts the model into a folder; give apply an artifacts folder")
    module = importlib.import_module(f"autotune.model.generate.{RUNTIMES[knobs.backend]}")
    folder = Path(hf.folder_of(spec) or saved(model, work / "models"))
    used = threads or int(os.environ.get("OMP_NUM_THREADS") or 0) or (os.cpu_count() or 1)
    made: Generator = module.build(PeerBuild(folder, knobs.precision, used, work / knobs.backend), setup)
    return made


def saved(model: Any, folder: Path) -> Path:
    """The model as `save_pretrained` writes it (fp32 safetensors), under `folder`, named by its
    weights' fingerprint; written once (into a temporary folder, then renamed), reused after."""
    from autotune.model.artifacts import fingerprint

    target = folder / fingerprint(model)
    if (target / "config.json").is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{target.name}.{os.getpid()}"
    hf.transformers_module().utils.logging.disable_progress_bar()
    try:
        model.save_pretrained(partial)
        partial.rename(target)
    except OSError:
        if not (target / "config.json").is_file():  # not another process that saved it first
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target
