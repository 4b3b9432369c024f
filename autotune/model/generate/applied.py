"""`autotune.apply` for a causal LM measured generating (`--task generate`): the model comes back as
a `Generating`, whose `stream` and `generate` run what the study measured (quantized weights, the
static cache, the compiled decode step, or the peer runtime), through the same `generator` call
the measuring child made.

    generating = autotune.apply(model, prompts)      # under `autotune run best.env`
    for tokens in generating.stream(prompts, 64):    # one tensor [batch] per new token
        ...
"""

from __future__ import annotations

import atexit
import copy
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.model import generate, hf
from autotune.model.errors import ApplyError
from autotune.model.generate import measure
from autotune.model.generate.pytorch import TorchGenerator


class Generating:
    """A causal LM as configured. `stream(prompts, new_tokens)` yields each new token of every
    sequence (greedy), `generate(prompts, new_tokens)` returns them [batch, new_tokens]; calling it
    like the model gives its logits, as the module `hf.wrap` makes. `knobs` and `setup` say what was done."""

    def __init__(self, generator: Any, model: Any, knobs: Any, setup: dict[str, Any]) -> None:
        self.generator, self.model, self.knobs, self.setup = generator, model, knobs, setup

    def stream(self, prompts: Any, new_tokens: int) -> Iterator[Any]:
        if new_tokens < 1:
            raise ApplyError(f"new_tokens={new_tokens} generates nothing; ask for 1 token or more")
        return iter(self.generator.stream(_prompts(prompts), new_tokens))

    def generate(self, prompts: Any, new_tokens: int) -> Any:
        import torch

        return torch.stack(list(self.stream(prompts, new_tokens)), dim=1)

    def __call__(self, prompts: Any) -> Any:
        return self.generator.logits(_prompts(prompts))

    def __repr__(self) -> str:
        return f"autotune.Generating({self.knobs.describe()})"


def _prompts(prompts: Any) -> Any:
    """Token ids [batch, length] (int64), from a tensor or a tokenizer's dict (its input_ids)."""
    import torch

    ids = measure.prompts_of(prompts)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise ApplyError("give the prompts as token ids: an integer tensor [batch, length] (or a dict holding "
                         "input_ids)")
    return ids.long()


def is_causal_lm(model: Any) -> bool:
    """A transformers model with a language-modelling head that generates (…ForCausalLM)."""
    return hf.is_transformers_model(model) and type(model).__name__.endswith("ForCausalLM")


def apply_generation(model: Any, example_prompts: Any, knobs: Any, *, tolerance: float | None, artifacts: Path | None,
                     check: bool) -> Generating:
    """The causal LM `model` (left as it is: a copy is converted) generating as `knobs` say; with
    `check`, its next-token logits on `example_prompts` against fp32 eager's (`measure.judge`)."""
    knobs.check()
    prompts = _prompts(example_prompts)
    setup: dict[str, Any] = {}
    eager = TorchGenerator(model.eval(), False, False)
    if knobs.is_default:
        setup["weight_bytes"] = generate.pytorch.weight_bytes(model)
        return Generating(eager, model, knobs, setup)
    reference = eager.logits(prompts) if check else None
    cache = artifacts if artifacts is not None else _scratch()
    made = generate.generator(copy.deepcopy(model), knobs, setup, spec=_spec_of(model), cache=cache)
    if reference is not None:
        measure.judge(measure.logits_agreement(reference, measure.logits_of(made, prompts)), knobs.describe(),
                      knobs.precision, tolerance, setup)
    return Generating(made, model, knobs, setup)


def _scratch() -> Path:
    """Where a peer converts the model when no artifacts folder was given (`autotune export
    --artifacts` keeps one): a temporary folder removed when the process exits, so that a service
    started again converts again rather than leaving gigabytes of weights behind each time."""
    folder = Path(tempfile.mkdtemp(prefix="autotune-generate-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _spec_of(model: Any) -> str:
    """An `hf:FOLDER` spec where the model came from a save_pretrained folder that still holds it."""
    folder = getattr(model, "name_or_path", "") or ""
    return f"{hf.PREFIX}{folder}" if folder.startswith("/") and Path(folder, "config.json").is_file() else ""
