"""Hugging Face transformers models, for the benchmark child and `autotune.apply` alike.

`--model hf:TYPE` (a key of transformers' CONFIG_MAPPING: bert, roberta, ...) builds that type's
default configuration with random weights (seeded by the loader), nothing downloaded; `hf:/FOLDER`
(the absolute path `autotune.config.models` resolves) loads what `save_pretrained` wrote there. The
task picks the head. Whatever the source, the module that runs is `wrap(model)`: its output is the
head's tensor (logits, or the last hidden state of a bare encoder), never a ModelOutput, so the
child times and `apply` returns the same module, with the same compiled artifact.

transformers is optional (`pip install 'autotune[transformers]'`) and, like torch, imported inside
functions; recognising a transformers model (`is_transformers_model`) imports nothing.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

from autotune.model import sizes
from autotune.model.batches import explain
from autotune.model.errors import LOAD_FAILED, ApplyError

PREFIX = "hf:"
INSTALL = "pip install 'autotune[transformers]'"
# --task -> transformers' mapping of model types to that task's head class
TASKS = {
    "sequence-classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "token-classification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "feature-extraction": "MODEL_MAPPING_NAMES",
    "generate": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",  # a causal LM: prefill, then one decode step per token
}
GENERATE = "generate"
DEFAULT_NEW_TOKENS = 64  # tokens generated per request when --new-tokens is not given
SIZE_MARK = "@"  # `hf:TYPE@SIZE`: the type's configuration scaled to about SIZE parameters (`sized`)
DEFAULT_TASK = "sequence-classification"
DEFAULT_SEQ_LEN = 128  # tokens per item when --seq-len is not given
OUTPUTS = ("logits", "last_hidden_state")  # the head's tensor: the first of these a model's output holds
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # made when the model's forward takes them


@dataclass(frozen=True)
class Tokens:
    """What random token inputs for a model need: its vocabulary size and the inputs it takes."""

    vocab_size: int
    names: tuple[str, ...]  # of TOKEN_INPUTS, in that order


def is_source(spec: str) -> bool:
    return spec.startswith(PREFIX)


def folder_of(spec: str) -> str | None:
    """The folder of a resolved `hf:/FOLDER` spec; None for a model type."""
    rest = spec.removeprefix(PREFIX)
    return rest if rest.startswith("/") else None


def transformers_module() -> Any:
    try:
        import transformers
    except ImportError:
        raise ApplyError(f"hf: models need transformers, which is not installed; {INSTALL}") from None
    return transformers


def model_types() -> tuple[str, ...]:
    """The model types `hf:TYPE` takes: transformers' CONFIG_MAPPING keys."""
    return tuple(transformers_module().CONFIG_MAPPING.keys())


def config_of(spec: str) -> Any:
    """The model's configuration: the folder's config.json, or the type's defaults (at the size
    `hf:TYPE@SIZE` names)."""
    transformers = transformers_module()
    folder = folder_of(spec)
    if folder is None:
        kind, _, size = spec.removeprefix(PREFIX).partition(SIZE_MARK)
        config = transformers.CONFIG_MAPPING[kind]()
        if size:
            config = sizes.sized(config, sizes.parse_size(size))
        if getattr(config, "pad_token_id", 0) is None:  # a decoder classifies a batch only with one
            config.pad_token_id = getattr(config, "eos_token_id", None)
        return config
    try:
        return transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # a damaged or foreign config.json
        raise ApplyError(f"cannot read {folder}/config.json ({explain(exc)}); save the model with "
                         f"save_pretrained") from None


def head_name(config: Any, task: str) -> str | None:
    """The name of `task`'s head class for this configuration; None when it has none. Known from
    transformers' mappings without importing the class (which imports its quantizers, torchao ...)."""
    transformers_module()
    from transformers.models.auto import modeling_auto

    name = getattr(modeling_auto, TASKS[task]).get(config.model_type)
    return str(name[0] if isinstance(name, tuple) else name) if name else None


def head_class(config: Any, task: str) -> Any:
    """The transformers class of `task`'s head for this configuration; None when it has none."""
    name = head_name(config, task)
    return getattr(transformers_module(), name, None) if name else None


def tasks_of(config: Any) -> list[str]:
    return [task for task in TASKS if head_name(config, task) is not None]


def vocab_size(spec: str, config: Any) -> int:
    """The vocabulary random token ids are drawn from; a model without one is not a text model."""
    size = getattr(config, "vocab_size", None)
    if not isinstance(size, int) or size < 1:
        raise ApplyError(f"{spec} takes no token ids (not a text model); give its inputs with --example-inputs")
    return size


def token_inputs(spec: str, task: str) -> Tokens:
    """The token inputs the model's forward takes, within its vocabulary."""
    config = config_of(spec)
    head = head_class(config, task or DEFAULT_TASK)
    taken = inspect.signature(head.forward).parameters if head is not None else {}
    if "input_ids" not in taken:
        raise ApplyError(f"{spec} takes no token ids (not a text model); give its inputs with --example-inputs")
    return Tokens(vocab_size(spec, config), tuple(name for name in TOKEN_INPUTS if name in taken))


def max_positions(config: Any) -> int | None:
    """The longest sequence the model's position embeddings cover, where it has a limit."""
    limit = getattr(config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and limit > 0 else None


def load_causal(spec: str) -> Any:
    """The causal LM of a resolved `hf:` spec, as it is (not wrapped: generation calls it step by
    step), fp32, in eval mode; random weights (seeded by the caller) for a type, a folder's own."""
    import torch

    transformers = transformers_module()
    config = config_of(spec)
    head = head_class(config, GENERATE)
    if head is None:
        raise ApplyError(f"{spec} ({config.model_type}) is not a causal language model; --task generate takes "
                         f"gpt2, llama, qwen2, ... (transformers' causal LM types)")
    folder = folder_of(spec)
    if folder is None:
        return head(config).eval()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        return head.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    except Exception as exc:
        raise ApplyError(f"{LOAD_FAILED}s in {folder} ({explain(exc)}); save the model with "
                         f"save_pretrained") from None


def load(spec: str, task: str) -> Any:
    """The model of a resolved `hf:` spec with the task's head, wrapped (`wrap`), in eval mode.
    A folder's weights are its own (a head it lacks is initialised at random, seeded by the caller)."""
    import torch

    if task == GENERATE:
        return load_causal(spec)
    transformers = transformers_module()
    config = config_of(spec)
    head = head_class(config, task or DEFAULT_TASK)
    if head is None:
        raise ApplyError(f"{spec} has no {task or DEFAULT_TASK} head; use --task {' or '.join(tasks_of(config))}")
    folder = folder_of(spec)
    if folder is None:
        return wrap(head(config).eval())
    transformers.utils.logging.set_verbosity_error()  # the load report of a newly made head, progress bars
    transformers.utils.logging.disable_progress_bar()
    try:
        model = head.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    except Exception as exc:
        raise ApplyError(f"{LOAD_FAILED}s in {folder} ({explain(exc)}); save the model with "
                         f"save_pretrained") from None
    return wrap(model.eval())


def is_transformers_model(model: Any) -> bool:
    """A transformers PreTrainedModel (a subclass of one included), told by its classes' modules:
    without importing transformers, which a model from elsewhere never needs."""
    return any(kind.__name__ == "PreTrainedModel" and kind.__module__.startswith("transformers.")
               for kind in type(model).__mro__)


def wrapped(model: Any) -> Any:
    """A transformers model wrapped (`wrap`), as the benchmark child built it; any other model as it is."""
    return wrap(model) if is_transformers_model(model) else model


def is_wrapped(model: Any) -> bool:
    """A transformers model as `wrap` returns it."""
    return isinstance(model, _head_output())


def wrap(model: Any) -> Any:
    """`model` as a module whose output is its head's tensor; the one wrapper the child and
    `autotune.apply` use, so both run (and fingerprint) the same module."""
    return _head_output()(model).train(model.training)  # in the mode the model is in


def head_tensor(output: Any) -> Any:
    """The head's tensor of a transformers output: a ModelOutput's logits or last hidden state,
    the first item of a tuple (`return_dict=False`)."""
    if isinstance(output, tuple):
        return output[0]
    for key in OUTPUTS:
        if output.get(key) is not None:
            return output[key]
    raise ApplyError(f"the model returned {type(output).__name__} holding none of {', '.join(OUTPUTS)}; "
                     f"wrap it in a module that returns the tensor you need")


@functools.cache
def _head_output() -> Any:
    import torch

    class HeadOutput(torch.nn.Module):
        """A transformers model whose output is its head's tensor (`head_tensor`)."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        # Token inputs by name, as TorchScript's trace maps a dict of example inputs to arguments.
        def forward(self, input_ids: Any = None, attention_mask: Any = None, token_type_ids: Any = None,
                    **other: Any) -> Any:
            given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            return head_tensor(self.model(**{k: v for k, v in given.items() if v is not None}, **other))

    return HeadOutput
