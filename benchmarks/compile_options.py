"""What AOTInductor's compile costs a search, and what its build settings buy back.

Each variant compiles one configuration from nothing (its own empty artifacts and inductor cache
folders) in a fresh process through `autotune.child.deploy.apply_deployment`, the benchmark
child's own path, then compiles it again for another thread count into the same folders: that
second compile is what every compile after a search's first one costs, since the first leaves
inductor's precompiled headers and constant-folding kernels behind (an empty cache builds them,
about 12 s, and a setting that changes compiler flags builds its own), and int8's quantized
graph. Then the first saved artifact is measured in fresh processes, interleaved with the other
variants, so that a setting that compiles faster but runs slower shows as such. Inductor reads
its settings from the environment when it is imported; autotune's benchmark child gets a
clean environment, so this script runs its own child (below) rather than `autotune bench`.

    .venv/bin/python benchmarks/compile_options.py --rounds 3
    .venv/bin/python benchmarks/compile_options.py --precision int8 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from autotune.measure import stats

VARIANTS: dict[str, dict[str, str]] = {
    "inductor's defaults": {},
    "wrapper -O0": {"AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL": "O0"},
    "compile threads 1": {"TORCHINDUCTOR_COMPILE_THREADS": "1"},
}
CHILD = """
import json, os, sys, time
from pathlib import Path
import torch
from autotune.child import deploy
from autotune.child.build import load_model
from autotune.child.knobs import ModelKnobs

model_name, memory_format, precision, folder, seconds = sys.argv[1:6]
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
example = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
chosen = deploy.Deployment(ModelKnobs(backend="inductor", memory_format=memory_format, precision=precision),
                           -1.0, Path(folder))
setup = {}
applied = deploy.apply_deployment(load_model(model_name, ""), example, chosen, check=False, setup=setup,
                                  calibration=[example])
with torch.no_grad():
    for _ in range(3):
        applied(example)
    times, end = [], time.perf_counter() + float(seconds)
    while time.perf_counter() < end or len(times) < 10:
        start = time.perf_counter()
        applied(example)
        times.append(time.perf_counter() - start)
times.sort()
print(json.dumps({"p50_ms": 1000 * times[len(times) // 2], "compile_s": setup.get("compile_s"),
                  "quantize_s": setup.get("quantize_s")}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnext101_32x8d")
    p.add_argument("--memory-format", default="channels_last")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="measuring runs of each saved artifact")
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measuring run")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="autotune-compile-options-") as folder:
        caches = {name: Path(folder, str(i)) for i, name in enumerate(VARIANTS)}
        built = {name: child(args, caches[name], VARIANTS[name]) for name in VARIANTS}
        again = {name: child(args, caches[name], VARIANTS[name], other_threads(args.threads)) for name in VARIANTS}
        runs: dict[str, list[float]] = {name: [] for name in VARIANTS}
        rng = random.Random(args.seed)
        for _ in range(args.rounds):
            for name in rng.sample(list(VARIANTS), len(VARIANTS)):
                result = child(args, caches[name], VARIANTS[name])
                if result.get("p50_ms"):
                    runs[name].append(result["p50_ms"])
    table(args, built, again, runs)


def other_threads(threads: int) -> int:
    return 2 if threads == 1 else 1


def child(args: argparse.Namespace, cache: Path, variables: dict[str, str], threads: int = 0) -> dict[str, Any]:
    """One fresh process: compile into `cache` when nothing is saved there, else load; then time."""
    env = os.environ | variables | {"OMP_NUM_THREADS": str(threads or args.threads),
                                    "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
    command = [sys.executable, "-c", CHILD, args.model, args.memory_format, args.precision, str(cache / "artifacts"),
               str(args.seconds)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    try:
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"failed: {done.stderr.strip()[-300:]}", file=sys.stderr)
        return {}
    print(json.dumps(result), file=sys.stderr, flush=True)
    return result


def table(args: argparse.Namespace, built: dict[str, dict[str, Any]], again: dict[str, dict[str, Any]],
          runs: dict[str, list[float]]) -> None:
    print(f"\n{args.model} {args.precision} {args.memory_format}, {args.threads} thread(s), batch 1: compile from "
          f"empty caches, again for {other_threads(args.threads)} thread(s) into the same inductor cache, then "
          f"p50 of the first artifact in {args.rounds} fresh processes (median, min-max)")
    print("| variant | compile s, empty cache | of which quantize s | compile s, again | p50 ms | min-max |")
    print("|---|---|---|---|---|---|")
    for name, first in built.items():
        values = runs[name]
        middle = f"{stats.median(values):.1f}" if values else "failed"
        spread = f"{min(values):.1f}-{max(values):.1f}" if values else "-"
        compile_s = f"{first['compile_s']:.1f}" if first.get("compile_s") else "failed"
        quantize_s = f"{first['quantize_s']:.1f}" if first.get("quantize_s") else "-"
        second = again[name].get("compile_s")
        print(f"| {name} | {compile_s} | {quantize_s} | {f'{second:.1f}' if second else 'failed'} | {middle} | "
              f"{spread} |")


if __name__ == "__main__":
    main()
