"""A text-generation service loop that generates the way autotune measured it, streaming each token.

    autotune search --model hf:qwen2 --model-size 0.5b --task generate --prompt-len 128 --new-tokens 64 --trials 50
    autotune export best.env --artifacts artifacts/
    autotune run best.env -- python examples/serve_llm.py --model hf:qwen2@0.5b --requests 20

The only autotune line is `autotune.apply(model, example)`: for a causal LM it returns a generator
whose `stream(prompts, new_tokens)` yields each sequence's next token as it is made, running what
the study measured (bf16 or int8/int4 weights, the static KV cache, the compiled decode step, or a
peer runtime: llama.cpp, OpenVINO GenAI). Without a configuration it generates as PyTorch's defaults.

Each request is a random prompt of `--prompt-len` tokens and `--new-tokens` greedy tokens, streamed
to a sink as they come; the service times the first token (TTFT) and every later one (TPOT) as a
client would see them. Two requests are served untimed first (a compiled decode step compiles then).

`--model hf:TYPE@SIZE` builds that configuration with random weights seeded as the benchmark seeds
them (nothing can be downloaded here), so a peer's converted weights and the guard match the study's;
`--model hf:FOLDER` loads a model saved with `save_pretrained`, as a real service does.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from typing import Any


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="hf:qwen2@0.5b", help="hf:TYPE[@SIZE] (random weights) or hf:FOLDER")
    p.add_argument("--prompt-len", type=int, default=128, help="tokens per prompt")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--batch-size", type=int, default=1, help="sequences generated together")
    p.add_argument("--requests", type=int, default=10, help="requests timed, after two untimed ones")
    p.add_argument("--seed", type=int, default=1, help="of the prompts")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = p.parse_args(argv)
    if min(args.prompt_len, args.new_tokens, args.batch_size, args.requests) < 1:
        p.error("--prompt-len, --new-tokens, --batch-size and --requests take 1 or more")
    return args


def load_model(name: str) -> Any:
    """What a service loads: a saved folder, or a type's configuration with the benchmark's seeded random weights."""
    import torch

    from autotune.model import hf

    torch.manual_seed(0)  # the weights the benchmark child builds from the same configuration
    return hf.load_causal(name)


def serve(generating: Any, prompts: list[Any], new_tokens: int, sink: list[int]) -> list[tuple[float, float]]:
    """Each request streamed token by token into `sink`: its time to first token and mean time per later token (ms)."""
    timings = []
    for prompt in prompts:
        start = time.perf_counter()
        first = start
        for step, tokens in enumerate(generating.stream(prompt, new_tokens)):
            sink.append(int(tokens[0]))  # what a service would write to its client
            if step == 0:
                first = time.perf_counter()
        end = time.perf_counter()
        timings.append(((first - start) * 1e3, (end - first) * 1e3 / max(new_tokens - 1, 1)))
    return timings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    import autotune

    model = load_model(args.model)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, vocab, (args.batch_size, args.prompt_len), generator=generator)
               for _ in range(args.requests + 2)]
    start = time.perf_counter()
    generating = autotune.apply(model, prompts[0])
    applied_s = time.perf_counter() - start
    del model  # a peer runtime or a converted copy serves from here on
    sink: list[int] = []
    serve(generating, prompts[:2], args.new_tokens, sink)
    timings = serve(generating, prompts[2:], args.new_tokens, sink)
    ttft, tpot = statistics.median(t for t, _ in timings), statistics.median(p for _, p in timings)
    summary = {"configuration": generating.knobs.describe(), "requests": len(timings), "prompt_len": args.prompt_len,
               "new_tokens": args.new_tokens, "batch_size": args.batch_size, "ttft_p50_ms": ttft,
               "tpot_p50_ms": tpot, "decode_tokens_per_s": args.batch_size * 1e3 / tpot,
               "request_p50_ms": statistics.median(t + p * (args.new_tokens - 1) for t, p in timings),
               "apply_s": applied_s, "tokens_streamed": len(sink),
               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['configuration']}: {len(timings)} requests of {args.prompt_len} + {args.new_tokens} tokens: "
              f"first token {ttft:.1f} ms, then {tpot:.2f} ms per token ({summary['decode_tokens_per_s']:.1f} "
              f"tokens/s), peak RSS {summary['peak_rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
