"""Does what a process has served change what a request costs there? One exported text model that
takes any length (`shapes=dynamic`), timed in several process states that take turns on the machine.

In a folder holding an export (`best.env`, its artifacts, the study under studies/), one process per
state starts under `autotune run best.env`, one after another, and each gets to its state:

- `bench`: the measuring child's build and warm-up (autotune.child.worker's steps), without the fill;
- `bench+fill`: the same with `rounds.fill` (the shortest lengths served once), as the child measures;
- `bench+every`: the same, then one batch at every length up to the largest bucket;
- `served`: examples/serve_text.py's process: its model, its stream of 200 lengths through the one
  `apply` line, served once untimed;
- `served-stream`: the same process, timed as serve_text times it (the reference).

Then, turn after turn, each state in a seeded random order takes its turn while the others wait idle:
the child's rounds (the buckets' spread lengths interleaved, `buckets.Mixed`) for `--seconds`, or, for
`served-stream`, one pass of its stream, each request once (a bucket's figure: the mean of its
requests). The machine's slow spells last minutes, so states seconds apart meet the same machine,
where separate processes a minute apart do not (benchmarks/served_vs_measured.py pairs those). Per
bucket and state, the ratio reference / state per turn, over the turns: its Hodges-Lehmann estimate
with the signed-rank interval (above 1: the state reads faster than the served stream).

    PYTHONPATH=. .venv/bin/python benchmarks/process_states.py --folder /tmp/bert-search --turns 16
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peers
import peers_report
from served_vs_measured import configuration_args

from autotune.child.envfile import EnvFileError
from autotune.child.envfile import read as read_env

STATES = ("bench", "bench+fill", "bench+every", "served", "served-stream")
REFERENCE = "served-stream"


def main() -> int:
    args = parse()
    if args.state:
        # this folder's transformers.py (the benchmark) would shadow the package the model needs
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
        return serve_turns(args)
    argv = child_argv(args.folder, read_env(args.folder / "best.env").env)
    started = {state: start(args, state, argv) for state in args.states}
    rng = random.Random(args.seed)
    turns: list[dict[str, Any]] = []
    for number in range(args.turns):
        order = rng.sample(args.states, len(args.states))
        turns.append({state: turn(started[state], args.seconds) for state in order})
        peers.say(f"turn {number}: " + "  ".join(f"{s} {'/'.join(f'{v:.2f}' for v in turns[-1][s]['ms'].values())}"
                                                 for s in args.states))
    for process in started.values():
        assert process.stdin is not None
        process.stdin.close()
        process.wait()
    found = {"command": shlex.join(["PYTHONPATH=.", ".venv/bin/python", "benchmarks/process_states.py", *sys.argv[1:]]),
             **peers_report.provenance(peers.cli_env(args.folder)), "seed": args.seed, "seconds": args.seconds,
             "turns": turns, "summary": summarise(args.states, turns)}
    (args.folder / "process-states.json").write_text(json.dumps(found, indent=2) + "\n")
    print(markdown(found))
    return 0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folder", type=Path, required=True, help="where `autotune export best.env --artifacts` ran, "
                   "with the study under studies/ (its best.env sets shapes=dynamic)")
    p.add_argument("--states", type=lambda text: text.split(","), default=list(STATES),
                   help=f"comma-separated, of {', '.join(STATES)} (default: all; {REFERENCE} is the reference)")
    p.add_argument("--turns", type=int, default=16, help="turns of every state (default 16)")
    p.add_argument("--seconds", type=float, default=4.0, help="timed seconds of a state's turn (default 4)")
    p.add_argument("--seed", type=int, default=random.SystemRandom().randrange(2**31), help="seed of the order")
    p.add_argument("--state", default="", help=argparse.SUPPRESS)  # a state's own process
    p.add_argument("--child-argv", default="[]", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.folder = args.folder.resolve()
    if args.state:
        return args
    if not (args.folder / "best.env").is_file():
        p.error(f"{args.folder} has no best.env: run `autotune export best.env --artifacts artifacts` there first")
    try:
        shapes = read_env(args.folder / "best.env").env.get("AUTOTUNE_SHAPES")
    except EnvFileError as exc:
        p.error(str(exc))
    if shapes != "dynamic":
        p.error(f"{args.folder / 'best.env'} does not set shapes=dynamic: the states differ in the lengths a model "
                "that takes any length has served; export a search with --seq-lens and shapes=dynamic")
    unknown = [s for s in args.states if s not in STATES]
    if unknown or REFERENCE not in args.states or len(args.states) < 2:
        p.error(f"--states {','.join(args.states)}: give two or more of {', '.join(STATES)}, {REFERENCE} among them")
    if not args.seconds > 0:
        p.error(f"--seconds {args.seconds}: give a positive number of seconds for a turn")
    if args.turns < 2:
        p.error(f"--turns {args.turns}: give 2 or more, to pair them")
    return args


def child_argv(folder: Path, env: dict[str, str]) -> list[str]:
    """The measuring child's arguments for the exported configuration, as `autotune plan` launches it."""
    done = subprocess.run([sys.executable, "-m", "autotune", "plan", *configuration_args(env), "--json"],
                          cwd=folder, env=peers.cli_env(folder), capture_output=True, text=True, check=True)
    command: list[str] = json.loads(done.stdout)["instances"][0]["command"]
    return command[command.index("autotune.child.worker") + 1:]


def start(args: argparse.Namespace, state: str, argv: list[str]) -> subprocess.Popen[str]:
    """A state's process under `autotune run best.env`, once it said it is ready (the others wait idle)."""
    began = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", "best.env", "--", sys.executable, __file__, "--folder",
         str(args.folder), "--state", state, "--child-argv", json.dumps(argv)],
        cwd=args.folder, env=peers.cli_env(args.folder), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        sys.exit(f"the {state} process exited before it was ready: exit {process.wait()}")
    peers.say(f"{state}: ready in {time.perf_counter() - began:.0f} s")
    return process


def turn(process: subprocess.Popen[str], seconds: float) -> dict[str, Any]:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(f"{seconds}\n")
    process.stdin.flush()
    line = process.stdout.readline()
    if not line:
        sys.exit(f"a state's process exited during its turn: exit {process.wait()}")
    return dict(json.loads(line))


def summarise(states: list[str], turns: list[dict[str, Any]]) -> dict[str, Any]:
    """Per state and bucket: the median ms over the turns and, against the reference, the paired ratio."""
    lengths = list(turns[0][REFERENCE]["ms"])
    found: dict[str, Any] = {}
    for state in states:
        found[state] = {}
        for length in lengths:
            ms = [t[state]["ms"][length] for t in turns]
            ratios = [t[REFERENCE]["ms"][length] / t[state]["ms"][length] for t in turns]
            found[state][length] = {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
                                    "paired": None if state == REFERENCE else peers_report.paired(ratios)}
    return found


def markdown(found: dict[str, Any]) -> str:
    lengths = list(found["summary"][REFERENCE])
    lines = [peers_report.provenance_line(found), "",
             f"{len(found['turns'])} turns of {found['seconds']:g} s per state (seed {found['seed']})", "",
             "| state | " + " | ".join(f"{n} tokens: median ms (min-max), served over it (paired)" for n in lengths)
             + " |", "|---" * (len(lengths) + 1) + "|"]
    for state, buckets in found["summary"].items():
        cells = [f"{b['median_ms']:.2f} ({b['min_ms']:.2f}-{b['max_ms']:.2f}), "
                 + ("the reference" if b["paired"] is None else peers_report.speedup_text(b["paired"]))
                 for b in buckets.values()]
        lines.append(f"| {state} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --- a state's own process ---------------------------------------------------------------------------


def serve_turns(args: argparse.Namespace) -> int:
    """Get to the state, say `ready`, then time a turn for each line of seconds on stdin."""
    import torch

    timed = child_state(args) if args.state.startswith("bench") else served_state(args.state == "served-stream")
    print("ready", flush=True)
    for line in sys.stdin:
        with torch.no_grad():
            print(json.dumps(timed(float(line))), flush=True)
    return 0


Turn = Callable[[float], dict[str, Any]]


def rounds_turn(forward: Any, next_round: Callable[[], Any]) -> Turn:
    """A turn of the child's rounds for `seconds`: per bucket the median of its sweeps' mean call."""
    def timed(seconds: float) -> dict[str, Any]:
        forward(next_round())  # untimed: the process that ran before left the caches cold
        forward.reset()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            forward.timed(next_round())
        return {"ms": {str(n): statistics.median(t) for n, t in zip(forward.buckets.lengths, forward.times_ms,
                                                                    strict=True)},
                "rounds": len(forward.times_ms[0])}
    return timed


def child_state(args: argparse.Namespace) -> Turn:
    """The measuring child's steps (autotune.child.worker.main) up to its timed window."""
    import os

    import torch

    from autotune.child import rounds, worker
    from autotune.child.artifacts import installed_torch_version
    from autotune.child.build import build, dataset_of, knobs_of
    from autotune.child.timing import warm_up

    child = worker.parse_args([*json.loads(args.child_argv), "--result", os.devnull])
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(child.cache_dir, "inductor",
                                                              installed_torch_version())))
    found = rounds.buckets_of(child)
    assert found is not None, "the export has no sequence-length buckets"
    parts = rounds.per_length(child, found, not knobs_of(child).one_shape)
    streams = [iter(torch.utils.data.DataLoader(dataset_of(part), batch_size=child.batch_size)) for part in parts]
    examples = [next(stream) for stream in streams]
    batches = rounds.rounds(streams, [len(part.lengths) for part in parts])
    forward = rounds.build_mixed(parts, examples, found, knobs_of(child).one_shape, {},
                                 lambda part, example, setup: build(part, example, setup))
    worker.release_setup_memory()
    with torch.no_grad():
        if args.state == "bench+fill":
            rounds.fill(forward, examples[-1], found.lengths[-1])
        elif args.state == "bench+every":
            rounds.fill(forward, examples[-1], found.lengths[-1], count=found.lengths[-1])
        warm_up(child, forward, batches)
    return rounds_turn(forward, lambda: next(batches))


def served_state(stream: bool) -> Turn:
    """examples/serve_text.py's process after its untimed pass; a turn times its stream as serve_text does
    (`stream`: each request once, per bucket the mean) or the child's rounds of lengths."""
    import os

    import torch

    sys.path.insert(0, str(peers.REPO / "examples"))
    import serve_text

    import autotune
    from autotune.child.buckets import Buckets, Mixed, Round, sequence_length, spread

    lengths = tuple(int(n) for n in os.environ["AUTOTUNE_SEQ_LENS"].split(","))
    size = int(os.environ["AUTOTUNE_BATCH_SIZE"])
    model = serve_text.load_model(os.environ["AUTOTUNE_MODEL"], os.environ["AUTOTUNE_TASK"])
    pending = serve_text.requests(model, 201, size, 1, lengths[-1], seed=1)
    serve = autotune.apply(model, pending[0])
    with torch.no_grad():
        for batch in pending:
            serve(**batch)
    found = Buckets.parse(",".join(map(str, lengths)))
    if stream:
        def timed(seconds: float) -> dict[str, Any]:
            serve(**pending[0])  # untimed: the process that ran before left the caches cold
            spent: dict[int, list[float]] = {n: [] for n in lengths}
            for batch in pending[1:]:
                start = time.perf_counter()
                serve(**batch)
                spent[found.fitting(sequence_length(batch))].append((time.perf_counter() - start) * 1e3)
            return {"ms": {str(n): statistics.fmean(t) for n, t in spent.items()}, "requests": len(pending) - 1}
        return timed
    spreads = [spread(low + 1, high) for low, high in zip((0, *lengths[:-1]), lengths, strict=True)]
    sweeps = tuple(tuple(serve_text.requests(model, 1, size, n, n, seed=n)[0] for n in each) for each in spreads)
    return rounds_turn(Mixed([serve.run] * len(lengths), found, size, spreads), lambda: Round(sweeps))


if __name__ == "__main__":
    sys.exit(main())
