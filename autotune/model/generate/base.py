"""The one interface every text-generation runtime implements: PyTorch's own loop (eager or
compiled, `pytorch`) and the peers a user would run instead (llama.cpp, `llamacpp`; OpenVINO GenAI,
`openvino_genai`), each one module.

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

# The precisions of generation: the weights' format. int8_weight_only / int4_weight_only are
# torchao's for PyTorch, GGUF Q8_0 / Q4_0 for llama.cpp, NNCF's INT8_ASYM / INT4 for OpenVINO.
GEN_PRECISIONS = ("fp32", "bf16", "int8_weight_only", "int4_weight_only", "int8_dynamic")


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
class PeerBuild:
    """What a peer runtime builds its generator from: the model as `save_pretrained` wrote it
    (fp32 safetensors and config.json), the weights' precision, its threads, and a folder of its
    own where it keeps what it converts (reused when the same model and precision come again)."""

    folder: Path
    precision: str
    threads: int
    work: Path
