"""A GGUF file as a model (`--model FILE.gguf` with `--task generate`): converted once into a
transformers folder, so that it becomes an ordinary `hf:FOLDER` and every runtime (PyTorch,
OpenVINO GenAI, llama.cpp through autotune's own F32 GGUF) takes it unchanged.

The conversion is transformers' own GGUF loader (which needs the `gguf` and `accelerate` packages),
every weight dequantized to fp32, then `save_pretrained` of the model and, where the file carries a
vocabulary, of its tokenizer. A quantized file's weights (Q4_1, Q8_0, ...) stay on their
quantization grid in fp32: the folder is that quantized model, not the one it was quantized from
(`source.json` names the file's type, `file_type`).

The folder is an artifact of the one cache (`generate.converted.cached`, as `generate.saved` is):
`<artifacts>/gguf-<hash>.hf/<stem>/`, described beside it, listed, sized and pruned by `autotune
cache`. Its key is the hash of the file's bytes (with `FORMAT`), so a copy of the same file elsewhere
reuses it and a changed file gets a folder of its own, and `stem`: the file's name without `.gguf`,
lowercased, which names a study (`smollm2-135m-instruct.q4_1-generate-...`). It is saved whole or
not at all, and reused after (a pruned one is converted again).

torch and transformers are imported inside functions; recognising a GGUF file imports nothing.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from autotune.model import hf
from autotune.model.batches import explain
from autotune.model.errors import ApplyError
from autotune.model.files import unwritable
from autotune.model.generate.converted import cached

SUFFIX = ".gguf"
MAGIC = b"GGUF"  # the first four bytes of every GGUF file
KIND = "gguf"  # the converted folder's name prefix in the artifact cache (`autotune cache` names it by it)
FOLDER_SUFFIX = ".hf"  # and its suffix: a transformers folder inside, as `generate.saved`'s
OLD_FOLDER = "gguf"  # under the artifacts folder: where autotunes before the artifact left their conversions
FORMAT = "autotune-gguf-v1"  # part of the key: bumped when what a converted folder holds changes
SOURCE = "source.json"  # in the folder: the file it came from
NEEDS = ("gguf", "accelerate")  # what transformers' GGUF loader imports
INSTALL = "pip install gguf accelerate (or pip install 'autotune[transformers]')"
NO_VOCAB = ("no_vocab", "none")  # tokenizer.ggml.model of a file without a vocabulary (autotune's own llama.cpp GGUF)
CHUNK = 1 << 22


def is_gguf(text: str) -> bool:
    """Whether `--model` names a GGUF file (by its name: what it holds is checked by `has_magic`)."""
    return text.lower().endswith(SUFFIX) and not hf.is_source(text)


def has_magic(path: Path) -> bool:
    """Whether the file starts with GGUF's magic bytes. Raises OSError when it cannot be read."""
    with path.open("rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def missing_packages() -> list[str]:
    """Of `NEEDS`, those not installed."""
    return [name for name in NEEDS if importlib.util.find_spec(name) is None]


@functools.lru_cache(maxsize=8)
def key(path: str, size: int, mtime_ns: int) -> str:
    """The hash of the file's bytes (and FORMAT): read once per process for one file as it is (a
    search resolves its model for every trial)."""
    digest = hashlib.sha256(FORMAT.encode())
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def converted(path: Path, artifacts: Path) -> Path:
    """The transformers folder of the GGUF file at `path`: an artifact of the cache `artifacts`,
    converted unless it already is. Raises ApplyError when it cannot be (a package missing, a file
    transformers cannot load, a folder that cannot be written); nothing half-written stays."""
    stat = path.stat()
    stem = path.stem.lower()
    described = {"gguf": key(str(path.resolve()), stat.st_size, stat.st_mtime_ns), "model": stem}

    def convert(artifact: Path, meta: dict[str, Any]) -> None:
        missing = missing_packages()
        if missing:
            raise ApplyError(f"loading a GGUF file needs {' and '.join(missing)}, not installed; {INSTALL}")
        artifact.mkdir()
        meta["file_type"] = _convert(path, artifact / stem)

    try:
        artifact, _ = cached(artifacts, KIND, FOLDER_SUFFIX, described, convert)
    except ApplyError:
        why = unwritable(artifacts, make=False)
        if why:
            raise ApplyError(f"cannot write the converted model into {artifacts}: {why}; give a writable "
                             f"--cache-dir") from None
        raise
    return artifact / stem


def _convert(path: Path, folder: Path) -> str:
    """transformers' load of the GGUF file, dequantized to fp32, saved into `folder` with its
    tokenizer (when the file has a vocabulary) and `source.json`; returns the file's type."""
    import torch

    transformers = hf.transformers_module()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    where = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    try:
        fields = _fields(path)
        vocabulary = tokenizer_model(fields)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            **where, dtype=torch.float32, quantization_config=transformers.GgufConfig(dequantize=True))
        tokenizer = transformers.AutoTokenizer.from_pretrained(**where) if vocabulary not in NO_VOCAB else None
    except Exception as exc:  # an architecture or tokenizer transformers' GGUF loader does not know, a damaged file
        raise ApplyError(f"transformers cannot load {path.name} ({explain(exc)}); autotune takes a GGUF file of "
                         f"an architecture transformers loads (llama, qwen2, gpt2, ...), or a folder written by "
                         f"save_pretrained as --model hf:FOLDER") from None
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    described = {"format": FORMAT, "gguf": str(path.resolve()), "bytes": path.stat().st_size,
                 "file_type": file_type(fields), "tokenizer": tokenizer is not None,
                 "transformers": transformers.__version__}
    (folder / SOURCE).write_text(json.dumps(described, indent=1) + "\n")
    return str(described["file_type"])


def _fields(path: Path) -> dict[str, Any]:
    """The file's metadata fields (the `gguf` package's reader maps the file, reading no tensor)."""
    import gguf

    return dict(gguf.GGUFReader(str(path)).fields)


def tokenizer_model(fields: dict[str, Any]) -> str:
    """The file's `tokenizer.ggml.model` (llama, gpt2, ...; "none" where it names none)."""
    field = fields.get("tokenizer.ggml.model")
    return str(field.contents()) if field is not None else "none"


def file_type(fields: dict[str, Any]) -> str:
    """The file's weight type as llama.cpp names it (`MOSTLY_Q4_1`, `ALL_F32`, ...), "" when unstated."""
    import gguf

    field = fields.get("general.file_type")
    if field is None:
        return ""
    try:
        return str(gguf.LlamaFileType(int(field.contents())).name)
    except ValueError:
        return str(field.contents())


def source_of(folder: Path) -> dict[str, Any] | None:
    """What a converted folder's `source.json` says (None for any other folder)."""
    try:
        found = json.loads((folder / SOURCE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
