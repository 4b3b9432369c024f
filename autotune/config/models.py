"""Resolving what users type for `--model`: a torchvision classification model (short names
included), `pkg.module:factory`, a TorchScript file (`.pt`), an exported program (`.pt2`), a
Hugging Face transformers model (`hf:TYPE` or `hf:FOLDER`, `autotune.model.hf`) or, with `--task
generate`, a GGUF file (converted once into an `hf:FOLDER` under the cache, `autotune.model.gguf_source`)."""

from __future__ import annotations

import difflib
import functools
import importlib.util
import os
import re
import sys
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from autotune.base.errors import ModelError
from autotune.child.settings import CACHE_DIR
from autotune.model import gguf_source, hf, sizes
from autotune.model.buckets import BucketError, Buckets
from autotune.model.envfile import has_control
from autotune.model.errors import ApplyError

ModelKind = Literal["torchvision", "factory", "torchscript", "exported", "huggingface"]

# Short names users try first; values are torchvision builder names.
ALIASES = {
    "resnext101": "resnext101_32x8d",
    "resnext50": "resnext50_32x4d",
    "resnet": "resnet50",
    "wide_resnet50": "wide_resnet50_2",
    "wide_resnet101": "wide_resnet101_2",
    "mobilenet": "mobilenet_v2",
    "mobilenetv2": "mobilenet_v2",
    "mobilenetv3": "mobilenet_v3_large",
    "inception": "inception_v3",
    "inceptionv3": "inception_v3",
    "vit": "vit_b_16",
    "efficientnet": "efficientnet_b0",
    "convnext": "convnext_tiny",
    "shufflenet": "shufflenet_v2_x1_0",
    "squeezenet": "squeezenet1_1",
    "mnasnet": "mnasnet1_0",
    "regnet": "regnet_y_400mf",
    "densenet": "densenet121",
    "vgg": "vgg16",
    "swin": "swin_t",
    "maxvit": "maxvit_t",
}
# torchvision's transformer families: attention and MLP blocks, Linear layers all through.
LINEAR_FAMILIES = ("vit_", "swin_", "swin3d", "maxvit")
# Models whose default construction expects a larger image than 224x224.
IMAGE_SIZE = {"inception_v3": 299}


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: what the child loads, the shape of one input item, and where from."""

    name: str
    item_shape: tuple[int, ...]
    kind: ModelKind = "torchvision"
    import_path: str = ""
    example_inputs: str = ""  # a torch.save file of inputs, items along dim 0 (absolute path)
    task: str = ""  # the head of a transformers model (hf.TASKS); "" for the other kinds
    buckets: Buckets | None = None  # `--seq-lens`: measured at each length (item_shape: the largest)

    @property
    def generates(self) -> bool:
        """A causal LM measured generating (`--task generate`): its item is (prompt tokens, new tokens)."""
        return self.task == hf.GENERATE

    @property
    def new_tokens(self) -> int:
        return self.item_shape[1] if self.generates else 0

    @property
    def linear_heavy(self) -> bool:
        """Whether Linear layers carry the model's work (what int8_dynamic and int8_weight_only
        quantize): transformers and models autotune cannot look into, but not torchvision's
        convolutional networks, whose one Linear is the classifier."""
        return self.kind != "torchvision" or self.name.startswith(LINEAR_FAMILIES)

    @property
    def probe_op(self) -> str:
        """The operation of the kernel probe this model's work is like (`autotune.model.kernels`)."""
        return "matmul" if self.linear_heavy else "conv"

    def check_shapes(self, shapes: object) -> None:
        """shapes=dynamic is one compiled model for every sequence length of the buckets: without
        buckets it has nothing to serve."""
        if shapes == "dynamic" and self.buckets is None:
            raise ModelError("shapes=dynamic serves sequence-length buckets with one compiled model; it needs "
                             "--seq-lens (an hf: text model, e.g. --seq-lens 32,128,384); add it or drop shapes")

    @property
    def needs_probe(self) -> bool:
        """User models and user inputs are tried once (build + one forward) before any run, to fail
        early and clearly."""
        return self.kind != "torchvision" or bool(self.example_inputs)


def parse_shape(text: str) -> tuple[int, ...]:
    """`3x224x224` (or `3,224,224`) -> (3, 224, 224): one item's shape, the batch dimension excluded."""
    try:
        shape = tuple(int(part) for part in re.split(r"[x,]", text.strip().lower()))
    except ValueError:
        shape = ()
    if not shape or any(n < 1 for n in shape):
        raise ModelError(f"--input-shape {text!r} is not a shape; give one item's dimensions like 3x224x224 "
                         f"(the batch dimension comes from --batch-size)")
    return shape


@functools.lru_cache(maxsize=1)
def classification_models() -> tuple[str, ...]:
    """torchvision's image classification builders (imports torchvision once per process)."""
    import torchvision

    return tuple(torchvision.models.list_models(module=torchvision.models))


def resolve(text: str, available: tuple[str, ...] | None = None, input_shape: str | None = None,
            example_inputs: str | None = None, seq_len: int | None = None, task: str | None = None,
            buckets: Buckets | None = None, new_tokens: int | None = None,
            cache_dir: Path = Path(CACHE_DIR)) -> ModelSpec:
    """Any model source; torchvision names map `resnext101`, `ResNet-50` ... to a builder name.
    `example_inputs` (a torch.save file) replaces the synthetic inputs and gives the item shape.
    `seq_len` or `buckets` (sequence lengths) and `task` are for transformers models (`hf:`) alone.
    A GGUF file is converted under `cache_dir`'s artifacts the first time (`gguf_source`)."""
    if new_tokens is not None and task != hf.GENERATE:
        raise ModelError("--new-tokens is how many tokens --task generate generates; add --task generate (with a "
                         "causal LM such as --model hf:qwen2) or drop --new-tokens")
    if task == hf.GENERATE:
        return _generating(text, input_shape, example_inputs, seq_len, buckets, new_tokens, cache_dir)
    if gguf_source.is_gguf(text):
        raise ModelError(f"--model {text} is a GGUF file: a language model, which autotune measures generating "
                         f"text; add --task generate")
    if input_shape is not None and example_inputs is not None:
        raise ModelError("give --input-shape or --example-inputs, not both (the file's tensors have a shape)")
    if hf.is_source(text) and buckets is not None:
        return _bucketed(text, example_inputs, seq_len, task, buckets)
    if buckets is not None:
        raise ModelError(f"--seq-lens is for text models (--model hf:NAME); give {text} its input with --input-shape")
    if hf.is_source(text):
        return _huggingface(text, input_shape, example_inputs, seq_len, task)
    if seq_len is not None:
        raise ModelError(f"--seq-len is for text models (--model hf:NAME); give {text} its input with --input-shape")
    if task is not None:
        raise ModelError(f"--task picks the head of a transformers model (--model hf:NAME); {text} is not one")
    shape = parse_shape(input_shape) if input_shape is not None else None
    saved = _example_inputs(example_inputs) if example_inputs is not None else None
    if saved is not None:
        shape = saved[0]
    if text.endswith((".pt", ".pt2")) or "/" in text:
        spec = _file(text, shape)
    elif ":" in text:
        spec = _factory(text, shape)
    else:
        spec = _torchvision(text, available)
        spec = spec if shape is None else replace(spec, item_shape=shape)
    return spec if saved is None else replace(spec, example_inputs=saved[1])


def _example_inputs(text: str) -> tuple[tuple[int, ...], str]:
    """One item's shape (of the first tensor) and the absolute path of a checked inputs file."""
    from autotune.child.inputs import load_examples
    from autotune.model.batches import leaves
    from autotune.model.errors import ApplyError

    path = str(Path(text).expanduser().resolve())
    if has_control(path):
        raise ModelError(f"--example-inputs {text!r} holds a control character; rename the file")
    if not Path(path).is_file():
        raise ModelError(f"--example-inputs {text!r} is not a file; save your inputs with torch.save")
    try:
        first = leaves(load_examples(path))[0]
    except ApplyError as exc:
        raise ModelError(f"--example-inputs: {exc}") from None
    return tuple(int(n) for n in first.shape[1:]) or (1,), path


def _file(text: str, shape: tuple[int, ...] | None) -> ModelSpec:
    path = Path(text).expanduser()
    if has_control(text):
        raise ModelError(f"model file {text!r} holds a control character (a newline, ...); rename it")
    kind: ModelKind = "exported" if path.suffix == ".pt2" else "torchscript"
    if path.suffix not in (".pt", ".pt2"):
        raise ModelError(f"model file {text!r} is neither TorchScript (.pt) nor an exported program (.pt2)")
    try:
        with path.open("rb") as f:
            saved_by_torch = zipfile.is_zipfile(f)
    except OSError as exc:
        raise ModelError(f"cannot read model file {text!r}: {exc.strerror}; give a readable .pt or .pt2") from None
    if not saved_by_torch:  # torch.jit.save and torch.export.save both write a zip archive
        raise ModelError(f"model file {text!r} is not one PyTorch saved (not a zip archive); save the model with "
                         f"torch.jit.save (.pt) or torch.export.save (.pt2)")
    return ModelSpec(str(path.resolve()), shape or (3, 224, 224), kind)


def _factory(text: str, shape: tuple[int, ...] | None) -> ModelSpec:
    module, _, factory = text.partition(":")
    if not module or not factory.isidentifier():
        raise ModelError(f"--model {text!r} is not pkg.module:factory (a callable returning an nn.Module)")
    here = os.getcwd()
    sys.path.insert(0, here)
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # its parent package does not exist
        found = None
    except Exception as exc:  # a package whose __init__ fails to import
        raise ModelError(f"cannot import the package of {module!r}: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(here)
    if found is None:
        raise ModelError(f"no module named {module!r} (looked in {here} and the Python path); run autotune "
                         f"from the folder that holds it")
    return ModelSpec(text, shape or (3, 224, 224), "factory", here)


def _torchvision(text: str, available: tuple[str, ...] | None) -> ModelSpec:
    names = classification_models() if available is None else available
    name = _match(text, names)
    if name is None:
        wanted = text.strip().lower().replace("-", "_")
        close = difflib.get_close_matches(wanted, list(names) + list(ALIASES), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ModelError(
            f"unknown model {text!r}; {hint}use a torchvision classification model name "
            f"(`autotune models` lists them), pkg.module:factory, or a .pt/.pt2 file"
        )
    size = IMAGE_SIZE.get(name, 224)
    return ModelSpec(name=name, item_shape=(3, size, size))


def _match(text: str, names: tuple[str, ...]) -> str | None:
    wanted = text.strip().lower().replace("-", "_")
    wanted = ALIASES.get(wanted, ALIASES.get(wanted.replace("_", ""), wanted))
    if wanted in names:
        return wanted
    squashed = {n.replace("_", ""): n for n in names}
    return squashed.get(wanted.replace("_", ""))


def _huggingface(text: str, input_shape: str | None, example_inputs: str | None, seq_len: int | None,
                 task: str | None) -> ModelSpec:
    """`hf:TYPE` or `hf:FOLDER` with the head of `task`, fed `seq_len` tokens per item (or the
    user's own inputs); checked here, where a mistake is one line, rather than in the child."""
    if input_shape is not None:
        raise ModelError("a transformers model takes --seq-len N (tokens per item), not --input-shape")
    if seq_len is not None and example_inputs is not None:
        raise ModelError("give --seq-len or --example-inputs, not both (the file's token ids have a length)")
    task = task or hf.DEFAULT_TASK
    if task not in hf.TASKS:
        raise ModelError(f"--task {task!r} is not a task autotune knows; use {', '.join(hf.TASKS)}")
    name = _hf_name(text)
    try:
        config = hf.config_of(name)
        if hf.head_name(config, task) is None:
            raise ModelError(f"{text} ({config.model_type}) has no {task} head; use --task "
                             f"{' or '.join(hf.tasks_of(config)) or 'with another model'}")
        if example_inputs is not None:
            saved = _example_inputs(example_inputs)
            return ModelSpec(name, saved[0], "huggingface", example_inputs=saved[1], task=task)
        hf.vocab_size(name, config)  # a text model
    except ApplyError as exc:
        raise ModelError(str(exc)) from None
    return ModelSpec(name, (_seq_len(text, config, seq_len),), "huggingface", task=task)


def _generating(text: str, input_shape: str | None, example_inputs: str | None, prompt_len: int | None,
                buckets: Buckets | None, new_tokens: int | None, cache_dir: Path) -> ModelSpec:
    """`--task generate`: a causal LM (`hf:TYPE`, `hf:TYPE@SIZE`, `hf:FOLDER` or a GGUF file), fed random
    prompts of `prompt_len` tokens, generating `new_tokens` per request, all within the model's positions."""
    gguf = gguf_source.is_gguf(text)
    if not hf.is_source(text) and not gguf:
        raise ModelError(f"--task generate needs a causal language model (--model hf:qwen2, hf:llama, hf:gpt2, or a "
                         f"folder written by save_pretrained); {text} is not a transformers model")
    if input_shape is not None or example_inputs is not None or buckets is not None:
        given = "--input-shape" if input_shape is not None else "--example-inputs" if example_inputs else "--seq-lens"
        raise ModelError(f"--task generate takes --prompt-len N and --new-tokens N, not {given}")
    tokens = hf.DEFAULT_NEW_TOKENS if new_tokens is None else new_tokens
    if tokens < 1:
        raise ModelError(f"--new-tokens {tokens} generates nothing; give 1 token or more")
    name = _gguf(text, cache_dir) if gguf else _hf_name(text)
    try:
        config = hf.config_of(name)
        if hf.head_name(config, hf.GENERATE) is None:
            raise ModelError(f"{text} ({config.model_type}) is not a causal language model; --task generate takes "
                             f"gpt2, llama, qwen2, ... (transformers' causal LM types)")
        hf.vocab_size(name, config)
    except ApplyError as exc:
        raise ModelError(str(exc)) from None
    length = hf.DEFAULT_SEQ_LEN if prompt_len is None else prompt_len
    limit = hf.max_positions(config)
    if length < 1:
        raise ModelError(f"--prompt-len {length} is not a length; give 1 token or more")
    if limit is not None and length + tokens > limit:
        raise ModelError(f"a prompt of {length} tokens and {tokens} new ones need {length + tokens} positions and "
                         f"{text} takes {limit} (max_position_embeddings); give a shorter --prompt-len or fewer "
                         f"--new-tokens")
    return ModelSpec(name, (length, tokens), "huggingface", task=hf.GENERATE)


def _gguf(text: str, cache_dir: Path) -> str:
    """A GGUF file as the `hf:FOLDER` it converts into (once, under the cache's artifacts); a file
    that is not one, or that transformers cannot load, is one line."""
    if has_control(text):
        raise ModelError(f"--model {text!r} holds a control character (a newline, ...); rename the file")
    path = Path(text).expanduser()
    if path.is_dir():
        raise ModelError(f"--model {text} is a folder, not a GGUF file; give the .gguf file itself (or the folder "
                         f"as --model hf:FOLDER when save_pretrained wrote it)")
    if not path.is_file():
        raise ModelError(f"--model {text}: no such file; give the path of a GGUF file")
    try:
        gguf = gguf_source.has_magic(path)
    except OSError as exc:
        raise ModelError(f"cannot read --model {text}: {exc.strerror}; give a readable GGUF file") from None
    if not gguf:
        raise ModelError(f"--model {text} is not a GGUF file (it does not start with the bytes GGUF); give a model "
                         f"file llama.cpp reads, or a folder written by save_pretrained as --model hf:FOLDER")
    try:
        folder = gguf_source.converted(path, cache_dir / "artifacts")
    except ApplyError as exc:
        raise ModelError(f"--model {text}: {exc}") from None
    return f"{hf.PREFIX}{folder.resolve()}"


def _bucketed(text: str, example_inputs: str | None, seq_len: int | None, task: str | None,
              buckets: Buckets) -> ModelSpec:
    """A transformers model measured at each of `buckets`' lengths, every one within its positions."""
    if seq_len is not None:
        raise ModelError("give --seq-len (one length) or --seq-lens (buckets), not both")
    if example_inputs is not None:
        raise ModelError("give --seq-lens or --example-inputs, not both (the file's token ids have a length)")
    try:  # the lengths increase: the largest within the model's positions, all are
        spec = _huggingface(text, None, None, buckets.lengths[-1], task)
    except ModelError as exc:
        raise ModelError(str(exc).replace("--seq-len ", "the largest of --seq-lens ")) from None
    return replace(spec, buckets=buckets)


def parse_buckets(lengths: str | None, weights: str | None) -> Buckets | None:
    """`--seq-lens` and `--seq-len-weights` as a typed value (None without `--seq-lens`)."""
    if lengths is None:
        if weights is not None:
            raise ModelError("--seq-len-weights weighs the lengths of --seq-lens; give --seq-lens too")
        return None
    try:
        return Buckets.parse(lengths, weights or "")
    except BucketError as exc:
        raise ModelError(str(exc)) from None


def _hf_name(text: str) -> str:
    """`hf:TYPE` as it is, `hf:FOLDER` with the folder's absolute path (what the child takes)."""
    rest = text.removeprefix(hf.PREFIX)
    try:
        types = hf.model_types()
    except ApplyError:
        raise ModelError(f"--model {text} needs transformers, which is not installed; {hf.INSTALL}") from None
    path = Path(rest).expanduser()
    if rest in types:
        return text
    kind, mark, size = rest.partition(hf.SIZE_MARK)
    if mark and kind in types and "/" not in rest:  # hf:TYPE@SIZE
        try:
            sizes.parse_size(size)
        except ApplyError as exc:
            raise ModelError(f"--model {text}: {exc}") from None
        return f"{hf.PREFIX}{kind}{hf.SIZE_MARK}{size.strip().lower()}"
    if "/" not in rest and not rest.startswith((".", "~")) and not path.is_dir():
        close = difflib.get_close_matches(rest.lower(), types, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ModelError(f"unknown transformers model type {rest!r}; {hint}give a model type (bert, roberta, "
                         f"...) or a folder written by save_pretrained (nothing is downloaded)") from None
    if has_control(rest):
        raise ModelError(f"--model {text!r} holds a control character (a newline, ...); rename the folder")
    if not path.is_dir():
        raise ModelError(f"--model {text}: no such folder; give a folder written by save_pretrained (a Hub name "
                         f"is not downloaded: save the model with save_pretrained first)")
    if not (path / "config.json").is_file():
        raise ModelError(f"--model {text}: the folder has no config.json; save the model with save_pretrained")
    return f"{hf.PREFIX}{path.resolve()}"


def _seq_len(text: str, config: object, seq_len: int | None) -> int:
    length = hf.DEFAULT_SEQ_LEN if seq_len is None else seq_len
    limit = hf.max_positions(config)
    if length < 1:
        raise ModelError(f"--seq-len {length} is not a length; give 1 token or more")
    if limit is not None and length > limit:
        said = f"--seq-len {length}" if seq_len is not None else f"the default --seq-len {length}"
        raise ModelError(f"{said} is above the {limit} positions {text} takes (max_position_embeddings); "
                         f"give --seq-len {limit} or less")
    return length
