"""A text-classification service loop that runs its model the way autotune measured it, for requests
of any length.

    autotune search --model hf:bert --seq-lens 32,128,384 --trials 50
    autotune export best.env --artifacts artifacts/
    autotune run best.env -- python examples/serve_text.py --model hf:bert --requests 200

The only autotune line is `autotune.apply(model, example)`. With a configuration searched at
sequence-length buckets (`--seq-lens`), `apply` loads one compiled model per bucket and serves each
request through the smallest bucket that holds it: padded (the attention mask's zeros keep the
padding out), its outputs cut back to its own tokens; with `shapes=dynamic`, one compiled model runs
each request at its own length. A request longer than the largest bucket is one clear error. Without
a configuration the model runs as PyTorch's defaults.

The requests' lengths are spread evenly over `--lengths` in a random order. The stream is served once
untimed, then timed (`--cold` times the first pass): a fresh process serves its first requests
slower than it serves once it has run a while (a dynamic int8 BERT-base: 13 ms against 10.5 at 1-32
tokens), and the search times a model after its warmup too.

`--model hf:bert` builds BERT's default configuration with random weights seeded as the benchmark
seeds them (nothing can be downloaded here), so the artifacts `autotune export --artifacts` compiled
match it; `--model hf:FOLDER` loads a model saved with `save_pretrained`, as a real service does.
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
    p.add_argument("--model", default="hf:bert", help="hf:MODEL_TYPE (random weights) or hf:FOLDER (save_pretrained)")
    p.add_argument("--task", default="sequence-classification", choices=("sequence-classification",
                                                                         "feature-extraction"))
    p.add_argument("--lengths", default="8-384", help="request lengths in tokens, LOW-HIGH: spread evenly over the "
                   "range, in a random order")
    p.add_argument("--batch-size", type=int, default=1, help="requests per call")
    p.add_argument("--requests", type=int, default=100, help="requests to serve after the first")
    p.add_argument("--seed", type=int, default=1, help="of the request stream")
    p.add_argument("--group", type=lengths, default=(), help="lengths like 32,128,384: without a configuration's "
                   "buckets, report the times per bucket of these lengths (to compare eager with buckets)")
    p.add_argument("--cold", action="store_true", help="time the stream's first pass in this process instead of "
                   "a second pass (what a service serves once it has run a while)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    return p.parse_args(argv)


def lengths(text: str) -> tuple[int, ...]:
    return tuple(sorted(int(n) for n in text.split(",") if n.strip()))


def load_model(name: str, task: str) -> Any:
    """What a service loads: a saved folder, or a model type's default configuration with the
    benchmark's seeded random weights."""
    import torch
    import transformers

    source = name.removeprefix("hf:")
    head = transformers.AutoModel if task == "feature-extraction" else \
        transformers.AutoModelForSequenceClassification
    if "/" in source:
        return head.from_pretrained(source).eval()
    torch.manual_seed(0)  # the benchmark's seed: the same random weights
    return head.from_config(transformers.AutoConfig.for_model(source)).eval()


def requests(model: Any, count: int, batch: int, low: int, high: int, seed: int) -> list[dict[str, Any]]:
    """Tokenized requests of mixed lengths, as a service has them after its tokenizer: token ids, an
    attention mask and, for a model that takes them, token type ids (the inputs the search measured).
    Their lengths are spread evenly over `low`..`high` (the middles of `count` equal parts) and served
    in a random order: a uniform stream without the luck of the draw, whose every bucket holds the
    spread of lengths the search assumed for it (200 lengths drawn at random put the median of the
    129-384 bucket at 292 tokens, not 257)."""
    import inspect

    import torch

    generator = torch.Generator().manual_seed(seed)
    types = "token_type_ids" in inspect.signature(model.forward).parameters
    span = high - low + 1
    spread = [low + (2 * k + 1) * span // (2 * count) for k in range(count)]
    made = []
    for index in torch.randperm(count, generator=generator).tolist():
        ids = torch.randint(1, model.config.vocab_size, (batch, spread[index]), generator=generator)
        made.append({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                     **({"token_type_ids": torch.zeros_like(ids)} if types else {})})
    return made


def bucket_of(serve: Any, length: int, group: tuple[int, ...]) -> str:
    """The bucket a request of `length` tokens runs in; for a model that takes every length, the
    smallest `--group` length that holds it ("any" without --group)."""
    found = getattr(getattr(serve, "run", None), "buckets", None)
    if found is not None:
        return str(found.fitting(length))
    return next((str(n) for n in group if length <= n), f"over {group[-1]}" if group else "any")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    import torch

    import autotune

    low, _, high = args.lengths.partition("-")
    model = load_model(args.model, args.task)
    pending = requests(model, args.requests + 1, args.batch_size, int(low), int(high or low), args.seed)
    serve = autotune.apply(model, pending[0])  # the one line that deploys what was measured
    with torch.no_grad():
        serve(**pending[0])
    ready_s = time.perf_counter() - started
    with torch.no_grad():  # a fresh process's first pass is slower than the next ones: keep it untimed
        for batch in [] if args.cold else pending[1:]:
            serve(**batch)
    per_bucket: dict[str, list[float]] = {}
    begin = time.perf_counter()
    with torch.no_grad():
        for batch in pending[1:]:
            t0 = time.perf_counter()
            serve(**batch)
            spent_ms = (time.perf_counter() - t0) * 1e3
            per_bucket.setdefault(bucket_of(serve, batch["input_ids"].shape[1], args.group), []).append(spent_ms)
    window = time.perf_counter() - begin
    every = [ms for times in per_bucket.values() for ms in times]
    configured = serve.knobs.describe() if isinstance(serve, autotune.Applied) else "PyTorch defaults"
    summary = {"model": args.model, "configuration": configured, "ready_s": round(ready_s, 3),
               "p50_ms": round(statistics.median(every), 3), "requests": args.requests,
               "items_per_s": round(args.requests * args.batch_size / window, 3),
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
               "buckets": {b: {"p50_ms": round(statistics.median(t), 3), "mean_ms": round(statistics.fmean(t), 3),
                               "requests": len(t)}
                           for b, t in sorted(per_bucket.items(), key=lambda kv: (len(kv[0]), kv[0]))}}
    print(json.dumps(summary) if args.json else
          f"{configured}: ready in {ready_s:.1f} s, p50 {summary['p50_ms']:.2f} ms over {args.requests} requests; "
          + ", ".join(f"{b} tokens: p50 {v['p50_ms']:.2f} ms, mean {v['mean_ms']:.2f} ({v['requests']})"
                      for b, v in summary["buckets"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
