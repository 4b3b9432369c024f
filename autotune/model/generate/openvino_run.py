"""The OpenVINO GenAI peer's generator: an `LLMPipeline` that streams greedy tokens, one request
per call. Greedy with `ignore_eos` (not min_new_tokens, which would mask the eos logit), so a request
yields exactly the tokens asked for. `generate` runs in a thread; its streamer hands each token to
`stream` and waits until the consumer asks for the next one, so a yield's time is the step's time,
as in PyTorch's loop.

openvino, openvino_genai, numpy and torch are imported inside functions.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.model.errors import ApplyError
from autotune.model.generate.converted import one_line


class OpenVINOGenerator:
    """An LLMPipeline that streams greedy tokens (`base.Generator`), one request per call."""

    def __init__(self, pipe: Any, eos: int, ir: Path | None = None, properties: dict[str, Any] | None = None) -> None:
        self.pipe, self.eos, self.ir, self.properties = pipe, eos, ir, properties or {}

    def logits(self, prompts: Any) -> Any:
        """The IR's next-token logits at every position of `prompts` (one prefill each, a fresh
        state), by the CPU plugin with the pipeline's precision and threads: the same graph
        LLMPipeline runs, compiled for this call alone (kept, it would count as serving memory)."""
        import numpy as np
        import openvino as ov
        import torch

        if self.ir is None:
            raise ApplyError("this OpenVINO GenAI generator was made without its IR; build it with build()")
        plugin = {key: value for key, value in self.properties.items() if key != "ATTENTION_BACKEND"}
        compiled = ov.Core().compile_model(str(self.ir), "CPU", plugin)
        rows = []
        for row in prompts.to(torch.int64).numpy():
            request = compiled.create_infer_request()
            length = row.shape[0]
            feeds = {"input_ids": row[None], "attention_mask": np.ones((1, length), dtype=np.int64),
                     "position_ids": np.arange(length, dtype=np.int64)[None], "beam_idx": np.zeros(1, dtype=np.int32)}
            request.infer({name: feeds[name] for name in (p.get_any_name() for p in compiled.inputs)})
            rows.append(torch.from_numpy(np.array(request.get_tensor("logits").data, dtype=np.float32)))
        del compiled
        return torch.cat(rows)

    def stream(self, prompts: Any, new_tokens: int) -> Iterator[Any]:
        import openvino as ov
        import torch

        if prompts.dim() != 2 or prompts.shape[0] != 1:
            raise ApplyError(f"openvino_genai generates one sequence at a time, not prompts of shape "
                             f"{tuple(prompts.shape)}; use batch=1")
        if new_tokens < 1:
            return
        ids = ov.Tensor(prompts.to(torch.int64).contiguous().numpy())
        streamer = _streamer()
        worker = threading.Thread(target=self._generate, args=(ids, new_tokens, streamer), daemon=True)
        worker.start()
        done = 0
        try:
            while done < new_tokens:
                token = streamer.next_token()
                done += 1
                yield torch.tensor([token], dtype=torch.int64)
        finally:
            streamer.finish(cancel=done < new_tokens)
            worker.join()

    def _generate(self, ids: Any, new_tokens: int, streamer: Any) -> None:
        """One greedy request of exactly `new_tokens` tokens, its tokens to `streamer`; a failure too."""
        try:
            self.pipe.generate(ids, generation_config(new_tokens, self.eos), streamer)
        except Exception as exc:
            streamer.ended(exc)
        else:
            streamer.ended(None)


def generation_config(new_tokens: int, eos: int) -> Any:
    """Greedy, exactly `new_tokens` tokens: eos ignored rather than masked (masking it with
    min_new_tokens would change the greedy choice where eos is the argmax)."""
    import openvino_genai as genai

    config = genai.GenerationConfig()
    config.max_new_tokens = new_tokens
    config.do_sample = False
    config.num_beams = 1
    config.ignore_eos = True
    config.eos_token_id = eos  # GenAI wants one; ignored
    return config


def _streamer() -> Any:
    """A GenAI streamer that hands each token to the consumer and waits for it to ask for the next."""
    return _streamer_class()()


@functools.cache
def _streamer_class() -> Any:
    """The streamer's class, a subclass of GenAI's StreamerBase (made once, on first use)."""
    import openvino_genai as genai

    class LockstepStreamer(genai.StreamerBase):  # type: ignore[misc]
        """Tokens from GenAI's thread to `stream`, one at a time: `write` blocks until the consumer
        asks for the next token (or stops), so GenAI computes a step only when it is wanted."""

        def __init__(self) -> None:
            super().__init__()
            self.tokens: queue.Queue[tuple[str, Any]] = queue.Queue()
            self.resume = threading.Semaphore(0)
            self.started = False
            self.cancelled = False

        def write(self, token: Any) -> Any:
            for one in (token if isinstance(token, list) else [token]):
                self.tokens.put(("token", int(one)))
                self.resume.acquire()
                if self.cancelled:
                    return genai.StreamingStatus.CANCEL
            return genai.StreamingStatus.RUNNING

        def end(self) -> None:
            """Nothing to flush: tokens go out as they come."""

        def next_token(self) -> int:
            """The next token; the generation's failure raised as an ApplyError, as is an early end."""
            if self.started:
                self.resume.release()  # the writer of the previous token may go on
            self.started = True
            kind, value = self.tokens.get()
            if kind == "token":
                return int(value)
            if value is not None:
                raise ApplyError(f"openvino_genai failed to generate: {one_line(value)}")
            raise ApplyError("openvino_genai stopped before the tokens asked for; check the model's "
                             "max_position_embeddings against the prompt and new tokens")

        def ended(self, exc: BaseException | None) -> None:
            """The generation ended (with `exc` if it failed)."""
            self.tokens.put(("end", exc))

        def finish(self, cancel: bool) -> None:
            """The consumer is done: let a waiting `write` return, cancelling the rest if `cancel`."""
            self.cancelled = cancel
            self.resume.release()

    return LockstepStreamer
