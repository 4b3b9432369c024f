"""Deploy what was measured: does a user's program get the speedup the study confirmed?

For each setting: a short search in a space that holds that family of winners, its confirmation
against PyTorch's defaults, `autotune export best.env --artifacts compiled/`, then
examples/serve.py in fresh processes, interleaved round by round: under `autotune run best.env`
and plainly (PyTorch's defaults). Reported: the confirmed speedup, the deployed one (median of
the per-round p50 ratios), and a fresh process's time to its first answer with the artifact
against compiling without it (AUTOTUNE_ARTIFACTS pointed at an empty folder).

Each setting runs in OUT/<setting> (the search's and export's logs, the study, the env file and the
compiled artifacts); the table goes to OUT/deploy_round_trip.md and stdout. How long the RESULTS.md
table took (resnext101, 4 trials, 7 rounds, 30 requests) was not recorded; --quick (resnet18,
3 trials, 5 rounds of 10 requests) is meant to take minutes a setting.

    .venv/bin/python benchmarks/deploy_round_trip.py --model resnext101 --trials 4 --rounds 7 --requests 30
    .venv/bin/python benchmarks/deploy_round_trip.py --quick --settings torchscript
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from autotune.measure import stats
from autotune.model import envfile
from autotune.study.storage import find_study

from lib import common

SERVE = str(common.REPO / "examples" / "serve.py")
FULL = {"model": common.MODEL, "trials": 4, "rounds": 5, "requests": 30}
QUICK = {"model": common.QUICK_MODEL, "trials": 3, "rounds": common.QUICK_CONFIRM_ROUNDS, "requests": 10}
# Spaces that hold one family of winners each (the default space holds both; these keep it short).
SETTINGS = {
    "inductor + bf16": "knobs:\n  backend: [inductor]\n  precision: [bf16]\n"
                       "  memory_format: [contiguous, channels_last]\n  allocator: [default, tcmalloc]\n",
    "torchscript": "knobs:\n  backend: [torchscript]\n  precision: [fp32, bf16]\n  allocator: [default, tcmalloc]\n",
}


def main() -> int:
    args = parse()
    found = common.provenance(args.out)
    rows = [round_trip(args, name, args.out / name.replace(" + ", "-")) for name in args.settings]
    common.write_table(args.out, "deploy_round_trip", table(args, found, rows))
    return 0


def table(args: argparse.Namespace, found: dict[str, str], rows: list[list[str]]) -> list[str]:
    return [f"{args.model}, batch 1, {args.trials}-trial search, {args.rounds} confirmation rounds, "
            f"{args.rounds} deployed rounds of {args.requests} requests", "", common.provenance_line(found), "",
            "| setting | exported knobs | confirmed speedup (interval) | deployed speedup (min-max of rounds) | "
            "deployed / confirmed | first answer, artifact s | first answer, compiling s |",
            "|---|---|---|---|---|---|---|", *("| " + " | ".join(row) + " |" for row in rows)]


def parse() -> argparse.Namespace:
    p = common.parser(__doc__, "resnet18, 3-trial searches, 5 rounds of 10 requests")
    common.add_model(p)
    p.add_argument("--trials", type=int, help="trials per search, baseline included (default 4)")
    p.add_argument("--rounds", type=int, help="confirmation rounds and deployed rounds (default 5)")
    p.add_argument("--requests", type=int, help="requests per serve.py run (default 30; 10 with --quick)")
    p.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    args = p.parse_args()
    common.fill(args, FULL, QUICK)
    args.out = common.out_folder(args.out, "autotune-deploy-round-trip-")
    return args


def round_trip(args: argparse.Namespace, name: str, folder: Path) -> list[str]:
    folder.mkdir(exist_ok=True)
    space = folder / "space.yaml"
    space.write_text(SETTINGS[name])
    cli(folder, "search", "--model", args.model, "--trials", str(args.trials), "--space", str(space),
        "--confirm-top", "1", "--confirm-rounds", str(args.rounds))
    verdict = find_study(folder / "studies", None, None).user_attrs["confirmation"]
    cli(folder, "export", "best.env", "--artifacts", "compiled")
    deployed: list[float] = []
    plain: list[float] = []
    ready: list[float] = []
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
    common.say(f"[{name}] confirmed {confirmed:.3f}x, deployed ratios {[round(r, 3) for r in ratios]}")
    return [name, knobs, f"{confirmed:.2f}x ({label} {interval[0]:.2f}-{interval[1]:.2f})",
            f"{deployed_speedup:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
            f"{deployed_speedup / confirmed:.2f}", f"{stats.median(ready):.1f}", f"{stats.median(compiling):.1f}"]


def serve(folder: Path, args: argparse.Namespace, tuned: bool, artifacts: str | None = None) -> dict[str, float]:
    command = [sys.executable, SERVE, "--model", args.model, "--requests", str(args.requests), "--json"]
    if tuned:
        env_file = folder / "best.env"
        if artifacts is not None:  # the same file, pointing at an empty folder: apply compiles
            env_file = folder / "compiling.env"
            kept = [line for line in (folder / "best.env").read_text().splitlines()
                    if not line.startswith(f"export {envfile.ARTIFACTS_VAR}=")]
            env_file.write_text("\n".join([*kept[:-1], envfile.export_line(envfile.ARTIFACTS_VAR, artifacts),
                                           kept[-1]]) + "\n")  # the last line says the file is whole
        command = [sys.executable, "-m", "autotune", "run", str(env_file), "--", *command]
    out = subprocess.run(command, cwd=folder, env=common.cli_env(folder), capture_output=True, text=True,
                         check=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def cli(folder: Path, *argv: str) -> None:
    """`autotune ARGV` in `folder`; the benchmark stops where one fails (its log says why)."""
    code = common.autotune(folder, *argv, log=f"{argv[0]}.log")
    if code != 0:
        raise SystemExit(f"autotune {argv[0]} exited {code}: see {folder / (argv[0] + '.log')}")


if __name__ == "__main__":
    sys.exit(main())
