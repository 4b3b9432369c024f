"""llama.cpp's side of the llama.cpp peer, through llama-cpp-python's ctypes bindings: importing it
with its logging kept for error messages (`import_llama_cpp`, `llama_log`), and the generator, a
loaded GGUF and a context that decode token ids, greedy.

The generator feeds token ids straight to `llama_decode` and takes the argmax of the last position's
logits itself (`logits` hands back every position's, for the guard), so the GGUF needs no real
vocabulary (`llamacpp_convert` writes llama.cpp's "no_vocab" tokenizer).

llama.cpp repacks weights into its extra buffer types where the CPU has them (AMX tiles, interleaved
layouts). On some AMX Xeons its AMX matmul kills the process (SIGSEGV in ggml_backend_amx_mul_mat,
ggml-org/llama.cpp#20824, open upstream; seen here with Q8_0). So whether a GGUF runs repacked is
measured, not assumed: a child process loads it with them and decodes, once per process and GGUF
(`repacked_crash`), and where that child dies the generator loads without them and says so.

llama_cpp, numpy and torch are imported inside functions: this module imports without them.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.model.errors import ApplyError
from autotune.model.generate.converted import import_runtime, one_line

MAX_CONTEXT = 4096  # the context a build sizes when none is asked for, at most
CONTEXT_STEP = 256  # llama.cpp rounds a context up to a multiple of this
INSTALL = "install it with `pip install 'autotune[llamacpp]'` (or: pip install llama-cpp-python gguf)"

_LOG_TAIL: deque[str] = deque(maxlen=20)  # llama.cpp's latest warnings and errors, for messages
_LOG_CALLBACK: Any = None  # the ctypes callback; kept referenced so llama.cpp never calls a freed one
_BACKEND_READY = False


def import_llama_cpp() -> Any:
    """llama_cpp, with its logging routed to `_LOG_TAIL` and its backend initialised once."""
    global _LOG_CALLBACK, _BACKEND_READY
    llama_cpp = import_runtime("llama_cpp", "llama.cpp", INSTALL)
    if _LOG_CALLBACK is None:

        def keep_warnings(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
            """Keep llama.cpp's warnings and errors (levels 2 and 3) for error messages; print nothing."""
            if level in (2, 3) and text:
                _LOG_TAIL.append(text.decode("utf-8", "replace").rstrip())

        _LOG_CALLBACK = llama_cpp.llama_log_callback(keep_warnings)
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    if not _BACKEND_READY:
        llama_cpp.llama_backend_init()
        _BACKEND_READY = True
    return llama_cpp


def llama_log() -> str:
    """llama.cpp's latest warnings and errors on one line, for an error message."""
    return one_line(" | ".join(line for line in _LOG_TAIL if line)) or "no message from llama.cpp"


def context_length(config: dict[str, Any], context: int | None) -> int:
    """The context to allocate: `context` when given, else the model's trained positions capped at
    MAX_CONTEXT."""
    if context is not None:
        if context < 1:
            raise ApplyError(f"context must be a positive number of tokens, not {context}")
        return int(context)
    trained = config.get("max_position_embeddings") or config.get("n_positions") or MAX_CONTEXT
    return min(int(trained), MAX_CONTEXT)


# The child `repacked_crash` runs: the GGUF (argv[1]) loaded as llama.cpp loads it by default, with
# repacked weights, then a prompt of 8 token ids and one step decoded on argv[2] threads.
_REPACKED_CHECK = """
import sys
import llama_cpp
model = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=int(sys.argv[2]), verbose=False)
model.eval(list(range(1, 9)))
model.eval([9])
"""
REPACKED_CHECK_S = 120.0


@functools.cache
def repacked_crash(path: Path, threads: int) -> str:
    """Why the GGUF at `path` cannot run with llama.cpp's repacked weights on this CPU (a child that
    loaded it so and decoded was killed by a signal, or hung), or "" where it ran, or failed otherwise
    (the load in this process then says why)."""
    try:
        done = subprocess.run([sys.executable, "-c", _REPACKED_CHECK, str(path), str(threads)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=REPACKED_CHECK_S, check=False)
    except subprocess.TimeoutExpired:
        return f"a child decoding with them did not finish within {REPACKED_CHECK_S:.0f} s"
    if done.returncode < 0:
        number = -done.returncode
        name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
        return f"a child decoding with them was killed by {name}"
    return ""


class LlamaCppGenerator:
    """A loaded llama.cpp model and context, generating greedily from token ids (batch 1)."""

    def __init__(self, path: Path, n_ctx: int, threads: int, f32_cache: bool) -> None:
        """Load the GGUF at `path` and make a context of `n_ctx` tokens whose batch holds a whole
        prompt (one decode call per prefill); `f32_cache` keeps the KV cache in F32 instead of F16."""
        self._llama_cpp = llama_cpp = import_llama_cpp()
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        crash = repacked_crash(Path(path), threads)
        if crash:
            model_params.use_extra_bufts = False
        self.repacked = f"off: {crash}" if crash else "llama.cpp's default (on where this CPU has them)"
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        if not self._model:
            raise ApplyError(f"llama.cpp could not load {path}: {llama_log()}; delete it and its .json to convert "
                             f"it again")
        params = llama_cpp.llama_context_default_params()
        n_ctx = -(-n_ctx // CONTEXT_STEP) * CONTEXT_STEP  # llama.cpp pads it so; the batch then matches
        params.n_ctx = n_ctx
        params.n_batch = n_ctx
        params.n_ubatch = min(n_ctx, 512)
        params.n_seq_max = 1
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        if f32_cache:
            params.type_k = params.type_v = llama_cpp.GGML_TYPE_F32
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not self._ctx:
            self.close()
            raise ApplyError(f"llama.cpp could not make a context of {n_ctx} tokens for {path}: {llama_log()}")
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(self._ctx))
        self.n_ubatch = int(llama_cpp.llama_n_ubatch(self._ctx))
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model)))
        self.kv_cache_type = "F32" if f32_cache else "F16"
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)

    def close(self) -> None:
        """Free the batch, context and model (idempotent)."""
        llama_cpp = self._llama_cpp
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
        self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
        self._model = None

    def __del__(self) -> None:
        """Free llama.cpp's memory when the generator goes away."""
        with contextlib.suppress(Exception):  # at interpreter shutdown llama_cpp may be half torn down
            self.close()

    def _prompt_ids(self, prompts: Any, new_tokens: int) -> list[int]:
        """The prompt's token ids, checked: one sequence, ids in the vocabulary, room in the context."""
        if self._ctx is None:
            raise ApplyError("this llama.cpp generator is closed: build a new one")
        if getattr(prompts, "ndim", None) != 2:
            shape = tuple(getattr(prompts, "shape", ()))
            raise ApplyError(f"prompts must be an int64 tensor [batch, prompt_len], not shape {shape}")
        batch, length = prompts.shape
        if batch != 1:
            raise ApplyError(
                f"the llama.cpp peer generates one sequence at a time, not a batch of {batch}: measure it with batch 1"
            )
        if length < 1:
            raise ApplyError("the prompt is empty: give at least one token")
        if length + new_tokens > self.n_ctx or length > self.n_batch:
            raise ApplyError(
                f"{length} prompt + {new_tokens} new tokens exceed the context of {self.n_ctx}: "
                "build with a larger context"
            )
        ids = [int(token) for token in prompts[0].tolist()]
        if min(ids) < 0 or max(ids) >= self.n_vocab:
            raise ApplyError(f"prompt token ids must lie in [0, {self.n_vocab}), got {min(ids)}..{max(ids)}")
        return ids

    def _run(self, ids: list[int], start: int, every_position: bool) -> None:
        """Decode `ids` at positions start.. in one llama_decode call, asking for the logits of every
        position or of the last one only."""
        llama_cpp, batch = self._llama_cpp, self._batch
        count = len(ids)
        for i, token in enumerate(ids):
            batch.token[i] = token
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if every_position else 0
        batch.logits[count - 1] = 1
        batch.n_tokens = count
        status = llama_cpp.llama_decode(self._ctx, batch)
        if status != 0:
            raise ApplyError(f"llama_decode failed with status {status} at position {start}: {llama_log()}")

    def _next_token(self, ids: list[int], start: int) -> int:
        """Decode `ids` at positions start..; the argmax of the last position's logits."""
        import numpy as np

        self._run(ids, start, every_position=False)
        logits = np.ctypeslib.as_array(self._llama_cpp.llama_get_logits_ith(self._ctx, -1), shape=(self.n_vocab,))
        return int(logits.argmax())

    def _new_request(self) -> None:
        """Forget every earlier request: clear the KV cache."""
        self._llama_cpp.llama_memory_clear(self._llama_cpp.llama_get_memory(self._ctx), True)

    def logits(self, prompts: Any) -> Any:
        """The next-token logits at every position of `prompts` (one prefill, a fresh request): a
        float32 tensor [1, prompt_len, vocab]."""
        import numpy as np
        import torch

        ids = self._prompt_ids(prompts, 0)
        self._new_request()
        self._run(ids, 0, every_position=True)
        rows = np.ctypeslib.as_array(self._llama_cpp.llama_get_logits(self._ctx), shape=(len(ids), self.n_vocab))
        return torch.from_numpy(rows.copy())[None]

    def stream(self, prompts: Any, new_tokens: int) -> Iterator[Any]:
        """Yield `new_tokens` times the greedy next token as an int64 tensor [1]; the first after
        the prefill. Every call clears the KV cache first: a new request."""
        ids = self._prompt_ids(prompts, new_tokens)
        self._new_request()
        return self._tokens(ids, new_tokens)

    def _tokens(self, ids: list[int], new_tokens: int) -> Iterator[Any]:
        """The generation loop behind `stream`."""
        import torch

        if new_tokens < 1:
            return
        token = self._next_token(ids, 0)
        yield torch.tensor([token], dtype=torch.int64)
        for step in range(1, new_tokens):
            token = self._next_token([token], len(ids) + step - 1)
            yield torch.tensor([token], dtype=torch.int64)
