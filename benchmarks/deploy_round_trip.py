"""Deploy what was measured: does a user's program get the speedup the study confirmed?

For each setting: a short search in a space that holds that family of winners, its confirmation
against PyTorch's defaults, `autotune export best.env --artifacts compiled/`, then
examples/serve.py in fresh processes, interleaved round by round: under `autotune run best.env`
and plainly (PyTorch's defaults). Reported: the confirmed speedup, the deployed one (median of
the per-round p50 ratios), and a fresh process's time to its first answer with the artifact
against compiling without it (AUTOTUNE_ARTIFACTS pointed at an empty folder).

    .venv/bin/python benchmarks/deploy_round_trip.py --model resnext101 --trials 4 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune.child.envfile import quote
from autotune.measure import stats
from autotune.study.storage import find_study

ROOT = Path(__file__).resolve().parent.parent
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
SERVE = str(ROOT / "examples" / "serve.py")
# Spaces that hold one family of winners each (the default space holds both; these keep it short).
SETTINGS = {
    "inductor + bf16": "knobs:\n  backend: [inductor]\n  precision: [bf16]\n"
                       "  memory_format: [contiguous, channels_last]\n  allocator: [default, tcmalloc]\n",
    "torchscript": "knobs:\n  backend: [torchscript]\n  precision: [fp32, bf16]\n  allocator: [default, tcmalloc]\n",
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnext101")
    p.add_argument("--trials", type=int, default=4, help="trials per search, baseline included")
    p.add_argument("--rounds", type=int, default=5, help="confirmation rounds and deployed rounds")
    p.add_argument("--requests", type=int, default=30, help="requests per serve.py run")
    p.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    args = p.parse_args()
    rows = []
    for name in args.settings:
        with tempfile.TemporaryDirectory(prefix="deploy-round-trip-") as tmp:
            rows.append(round_trip(args, name, Path(tmp)))
    print(f"\n{args.model}, batch 1, {args.trials}-trial search, {args.rounds} confirmation rounds, "
          f"{args.rounds} deployed rounds of {args.requests} requests\n")
    print("| setting | exported knobs | confirmed speedup (interval) | deployed speedup (min-max of rounds) | "
          "deployed / confirmed | first answer, artifact s | first answer, compiling s |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


def round_trip(args: argparse.Namespace, name: str, folder: Path) -> list[str]:
    space = folder / "space.yaml"
    space.write_text(SETTINGS[name])
    cli(folder, "search", "--model", args.model, "--trials", str(args.trials), "--space", str(space),
        "--confirm-top", "1", "--confirm-rounds", str(args.rounds))
    verdict = find_study(folder / "studies", None, None).user_attrs["confirmation"]
    cli(folder, "export", "best.env", "--artifacts", "compiled")
    deployed, plain, ready = [], [], []
    for number in range(args.rounds):
        order = [True, False] if number % 2 == 0 else [False, True]  # alternate who goes first
        for tuned in order:
            result = serve(folder, args, tuned)
            (deployed if tuned else plain).append(result["p50_ms"])
            if tuned:
                ready.append(result["ready_s"])
    compiling = [serve(folder, args, True, artifacts=str(folder / f"empty-{n}"))["ready_s"] for n in range(2)]
    ratios = [p / d for p, d in zip(plain, deployed, strict=True)]
    deployed_speedup = stats.median(ratios)
    confirmed = verdict.get("speedup", 1.0)
    interval = verdict.get("ci") or [1.0, 1.0]
    label = verdict.get("ci_label", "")
    knobs = next((c["config"] for c in verdict["candidates"] if c["trial"] == verdict["winner_trial"]), "defaults")
    print(f"[{name}] confirmed {confirmed:.3f}x, deployed ratios {[round(r, 3) for r in ratios]}", file=sys.stderr)
    return [name, knobs, f"{confirmed:.2f}x ({label} {interval[0]:.2f}-{interval[1]:.2f})",
            f"{deployed_speedup:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
            f"{deployed_speedup / confirmed:.2f}", f"{stats.median(ready):.1f}", f"{stats.median(compiling):.1f}"]


def serve(folder: Path, args: argparse.Namespace, tuned: bool, artifacts: str | None = None) -> dict[str, float]:
    command = [sys.executable, SERVE, "--model", args.model, "--requests", str(args.requests), "--json"]
    if tuned:
        env_file = folder / "best.env"
        if artifacts is not None:  # the same file, pointing at an empty folder: apply compiles
            env_file = folder / "compiling.env"
            text = (folder / "best.env").read_text().splitlines()
            env_file.write_text("\n".join(line for line in text if "AUTOTUNE_ARTIFACTS=" not in line)
                                + f"\nexport AUTOTUNE_ARTIFACTS={quote(artifacts)}\n")
        command = [AUTOTUNE, "run", str(env_file), "--", *command]
    out = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def cli(folder: Path, *argv: str) -> None:
    print(f"$ autotune {' '.join(argv)}", file=sys.stderr)
    subprocess.run([AUTOTUNE, *argv], cwd=folder, check=True, stdout=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
