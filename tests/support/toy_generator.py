"""A toy text-generation runtime, whole in this one module: what adding a runtime takes. `TOY` declares
it (a backend that generates, its precisions, this module as its generation concern); `build`
makes its generator, which keeps one artifact in the cache (the model's config, as a peer keeps what
it converts) and decodes greedily without a KV cache (every step a forward over the whole sequence).

Registered by one line, `pytest_configure` below, when pytest is started with
`-p tests.support.toy_generator`: tests/model/test_generator_contract.py then runs its suite on it
too (tests/model/test_toy_generator.py does that).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.model import backends
from autotune.model.backends.base import Backend, Generation
from autotune.model.generate.base import Build
from autotune.model.generate.converted import cached, model_type, source_key
from autotune.model.knobdefs import Precision


class Toy(Backend):
    name = "toy"
    runtime = "toy"
    label = "toy"
    summary = "--task generate only: a toy runtime, greedy without a KV cache"
    precisions: tuple[Precision, ...] = ()
    generates: tuple[Precision, ...] = ("fp32",)
    generation = Generation(__name__)


TOY: Backend = Toy()


def pytest_configure(config: Any) -> None:
    """The one registry line."""
    backends.REGISTRY = (*backends.REGISTRY, TOY)


def build(spec: Build, setup: dict[str, Any]) -> ToyGenerator:
    """The toy generator of the model in `spec.folder`; its config kept in the cache as its artifact."""
    import transformers

    assert spec.folder is not None
    folder = spec.folder
    key = {"knobs": {"backend": TOY.name, "precision": spec.precision}, "model": model_type(folder),
           "weights": source_key(folder)}
    kept, reused = cached(spec.cache, TOY.name, ".toy", key,
                          lambda path, _: path.write_bytes((folder / "config.json").read_bytes()))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    setup.update(runtime="toy", kept=str(kept), reused=reused, weight_bytes=sum(
        p.numel() * p.element_size() for p in model.parameters()))
    return ToyGenerator(model, Path(kept))


class ToyGenerator:
    """Greedy tokens from whole-sequence forwards (`base.Generator`)."""

    def __init__(self, model: Any, kept: Path) -> None:
        self.model, self.kept = model, kept

    def logits(self, prompts: Any) -> Any:
        import torch

        with torch.no_grad():
            return self.model(input_ids=prompts).logits.float()

    def stream(self, prompts: Any, new_tokens: int) -> Iterator[Any]:
        import torch

        ids = prompts
        for _ in range(new_tokens):
            token = self.logits(ids)[:, -1].argmax(-1)
            yield token
            ids = torch.cat([ids, token[:, None]], dim=1)
