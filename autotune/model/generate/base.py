"""The one interface every text-generation runtime implements, and what it builds from: PyTorch's
own loop (eager or compiled, `pytorch`) and the peers a user would run instead (llama.cpp,
`llamacpp`; OpenVINO GenAI, `openvino_genai`).

A runtime is the generation concern of a backend (`Backend.generation`, in the one registry of
`autotune.model.backends`): a module with `build(spec: Build, setup: dict) -> Generator` that
records what it did in `setup` and keeps whatever it converts in the artifact cache (`spec.cache`,
through `autotune.model.artifacts.save_artifact`, so that `autotune cache` lists and prunes it).
tests/model/test_generator_contract.py runs one suite over every registered runtime.

A generator takes prompts as token ids and yields the greedy next token of every sequence, one step
at a time: the first yield ends the prefill (time to first token), each later one is a decode step
(time per output token). The measuring child and `autotune.apply` time and serve every runtime
through `stream`, so what is measured is what is served.

torch is imported inside functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class Generator(Protocol):
    """A model ready to generate."""

    def stream(self, prompts: Any, new_tokens: int) -> Iterator[Any]:
        """`prompts`: an int64 tensor [batch, prompt_len] of token ids. Yields `new_tokens` times an
        int64 tensor [batch]: each sequence's greedy (argmax) next token; the first yield comes after
        the prefill. A generator keeps no state between calls: every call starts a new request."""
        ...

    def logits(self, prompts: Any) -> Any:
        """The next-token logits at every position of `prompts` (one prefill, a fresh request): a
        float tensor [batch, prompt_len, vocab]. The guard compares them with fp32 eager's."""
        ...


@dataclass(frozen=True)
class Build:
    """What a runtime builds its generator from: the model as `save_pretrained` wrote it (fp32
    safetensors and config.json: what a peer converts), the weights' precision, its threads, and the
    artifact cache where it keeps what it converts (reused when the same model and precision come
    again). PyTorch's own runtime takes the model itself (`model`, converted in place) and every
    model knob (`knobs`: kv_cache, attention, the backend that compiles) instead of the folder."""

    folder: Path | None
    precision: str
    threads: int
    cache: Path
    model: Any = None
    knobs: Any = None
