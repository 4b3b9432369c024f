"""A small inference service loop that runs its model the way autotune measured it.

    autotune run best.env -- python examples/serve.py --model resnext101 --requests 100

The only autotune line is `autotune.apply(model, example)`: it reads the configuration that
`autotune run` (or `source best.env`) put in the environment (backend, precision, layout, ...)
and, where the env file names a folder of compiled artifacts, loads the compiled model from there
instead of compiling it again. Without a configuration the model runs as PyTorch's defaults.

The model has random weights seeded as the benchmark seeds them (no weights can be downloaded
here), so artifacts that `autotune export --artifacts` compiled for the study's model match it.
A real service loads its trained weights; `apply` then compiles them once into the artifacts folder
and every later process loads them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="torchvision classification model (random weights)")
    p.add_argument("--batch-size", type=int, default=1, help="images per request")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--requests", type=int, default=50, help="requests to serve after the first")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    return p.parse_args(argv)


def load_model(name: str) -> object:
    import torch
    import torchvision

    torch.manual_seed(0)  # the benchmark's seed: the same random weights
    aliases = {"resnext101": "resnext101_32x8d", "resnext50": "resnext50_32x4d"}
    return torchvision.models.get_model(aliases.get(name, name), weights=None).eval()


def requests(count: int, batch: int, size: int) -> list[object]:
    """Incoming work: preprocessed image batches, as a real service has them after decoding."""
    import torch

    generator = torch.Generator().manual_seed(1)
    return [torch.randn(batch, 3, size, size, generator=generator) for _ in range(min(count, 8))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    import torch

    import autotune

    model = load_model(args.model)
    pending = requests(args.requests, args.batch_size, args.image_size)
    serve = autotune.apply(model, pending[0])  # the one line that deploys what was measured
    with torch.no_grad():
        serve(pending[0])
    ready_s = time.perf_counter() - started
    latencies_ms = []
    begin = time.perf_counter()
    with torch.no_grad():
        for number in range(args.requests):
            batch = pending[number % len(pending)]
            t0 = time.perf_counter()
            serve(batch)
            latencies_ms.append((time.perf_counter() - t0) * 1e3)
    window = time.perf_counter() - begin
    configured = serve.knobs.describe() if isinstance(serve, autotune.Applied) else "PyTorch defaults"
    summary = {"model": args.model, "configuration": configured, "ready_s": round(ready_s, 3),
               "p50_ms": round(statistics.median(latencies_ms), 3),
               "items_per_s": round(args.requests * args.batch_size / window, 3), "requests": args.requests}
    print(json.dumps(summary) if args.json else
          f"{summary['configuration']}: ready in {ready_s:.1f} s, p50 {summary['p50_ms']:.2f} ms, "
          f"{summary['items_per_s']:.1f} items/s over {args.requests} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
