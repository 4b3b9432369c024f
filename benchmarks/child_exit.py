"""What a benchmark child's exit costs: the seconds from its result file appearing to the process
being gone, with Python's teardown (`sys.exit(main())`, as the child ended before) and without it
(`python -m autotune.child.worker`, which ends with `worker.exit_now`). The runner waits for that
exit in every process of a search and of its confirmation. Each configuration runs once first to
fill the cache folder (compiling, tracing), then in interleaved rounds of fresh processes.

    .venv/bin/python benchmarks/child_exit.py                       # resnext101, 3 rounds
    .venv/bin/python benchmarks/child_exit.py --model resnet18 --rounds 5
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autotune.measure.stats import median

CONFIGS = {"defaults": [], "backend=torchscript": ["--backend", "torchscript"],
           "backend=inductor": ["--backend", "inductor"]}
MODES = {"teardown": [sys.executable, "-c", "import sys; from autotune.child import worker; sys.exit(worker.main())"],
         "exit_now": [sys.executable, "-m", "autotune.child.worker"]}
POLL_S = 0.005


def run(command: list[str], folder: Path, knobs: list[str], model: str) -> tuple[float, float]:
    """(seconds from the result file to the exit, the process's whole wall) of one fresh child."""
    result = folder / "result.json"
    result.unlink(missing_ok=True)
    start = time.monotonic()
    proc = subprocess.Popen([*command, "--model", model, "--item-shape", "3x224x224", "--duration", "1",
                             "--result", str(result), "--cache-dir", str(folder / "cache"), *knobs])
    written = None
    while proc.poll() is None:
        if written is None and result.exists():
            written = time.monotonic()
        time.sleep(POLL_S)
    ended = time.monotonic()
    if proc.returncode != 0 or not result.exists():
        sys.exit(f"the child failed (exit {proc.returncode}): {' '.join(command)} {' '.join(knobs)}")
    return ended - (written if written is not None else ended), ended - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnext101_32x8d")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    seen: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="autotune-child-exit-") as tmp:
        folder = Path(tmp)
        for knobs in CONFIGS.values():
            run(MODES["exit_now"], folder, knobs, args.model)  # compiles or traces once
        for _ in range(args.rounds):
            for name, knobs in CONFIGS.items():
                for mode, command in MODES.items():
                    seen.setdefault((name, mode), []).append(run(command, folder, knobs, args.model))
    print(f"\n{args.model} at batch 1, {args.rounds} interleaved rounds of fresh processes (1 s window)\n")
    print("| configuration | exit | result to exit, s: median (min-max) | process wall, s: median |")
    print("|---|---|---|---|")
    for (name, mode), runs in seen.items():
        gaps = [gap for gap, _ in runs]
        print(f"| {name} | {mode} | {median(gaps):.2f} ({min(gaps):.2f}-{max(gaps):.2f}) | "
              f"{median([wall for _, wall in runs]):.1f} |")


if __name__ == "__main__":
    main()
