"""Does a neighbour change what a search finds? The same `autotune search` twice, each in an empty
folder of its own: once on a quiet machine, once with a CPU-bound neighbour (pure-Python busy
loops, one process per `--spinners`) for the first third of the search. Both should confirm a
winner of the same family (backend + precision) with speedups within 10% of each other, and no
expert recipe should end pruned on a disturbed window, one where something else took CPU
(docs/searching.md, "When a trial stops early": such a stop leaves the trial undecided, never
pruned). A window only wider than this host's floor may prune where its interval clears the limit
(decisions under spread, docs/noise.md): those prunes are listed, not failed.

The neighbour starts right before the second search and is stopped (its process groups killed and
reaped) once the study holds a third of --trials counted trials, or at the latest after half the
quiet run's wall time (a third of it x 1.5), or when the search ends, whichever comes first. The
study is watched read-only every few seconds; a locked database only delays the next look.

Each search's output goes to OUT/quiet/search.log and OUT/neighbour/search.log, its study stays
in OUT/<run>/studies/, everything measured goes to OUT/noisy_neighbour.json, and the table for
benchmarks/RESULTS.md goes to OUT/noisy_neighbour.md and stdout. Checks that fail print FAIL lines;
the exit code stays 0. Takes 20.6 + 27.8 min on the 2-core AVX-512 EPYC (2026-12-03); --quick
(resnet18, 6 trials, the quick space, short windows) is meant to take minutes.

    .venv/bin/python benchmarks/noisy_neighbour.py                        # resnext101, 50 trials, twice
    .venv/bin/python benchmarks/noisy_neighbour.py --seed 0 --spinners 2 --out /tmp/nn
    .venv/bin/python benchmarks/noisy_neighbour.py --quick --out /tmp/nn-smoke   # resnet18, 6 trials, quick space
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config.knobs import Config
from autotune.study import records, storage

from lib import common

POLL_S = 3.0  # how often the neighbour's watcher reads the study
SHARE_OF_SEARCH = 1 / 3  # the neighbour runs for the first third of the trials
TIME_MARGIN = 1.5  # ... and at most a third of the quiet run's wall time x this
SPEEDUP_SPREAD = 0.10  # the two winners' speedups agree when the larger is at most 10% above the smaller
STOP_WAIT_S = 120.0  # how long an interrupted search gets to record its trial before it is killed
SPIN = "while True:\n    pass\n"
QUICK_TRIALS = 6


@dataclass
class NeighbourLog:
    """When the neighbour ran, in seconds from its search's start, and what the study held then."""

    spinners: int
    target_trials: int
    time_limit_s: float
    started_at: str = ""
    started_s: float = 0.0
    stopped_at: str = ""
    stopped_s: float | None = None
    counted_at_stop: int | None = None
    finished_at_stop: int | None = None
    why: str = ""
    pids: list[int] = field(default_factory=list)


def main() -> int:
    args = parse()
    common.say(f"noisy_neighbour: {args.model}, {args.trials} trials")
    quiet = run_search(args, "quiet", None)
    log = NeighbourLog(args.spinners, math.ceil(args.trials * SHARE_OF_SEARCH),
                       quiet["wall_s"] * SHARE_OF_SEARCH * TIME_MARGIN)
    noisy = run_search(args, "neighbour", log)
    runs = [quiet | read_study(quiet["folder"]), noisy | read_study(noisy["folder"])]
    checks = judge(runs)
    found = {**common.provenance(args.out), "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
             "neighbour": asdict(log), "checks": checks}
    common.write_json(args.out, "noisy_neighbour", found)
    common.write_table(args.out, "noisy_neighbour", report(found))
    return 0


def parse() -> argparse.Namespace:
    p = common.parser(__doc__, f"{common.QUICK_MODEL}, {QUICK_TRIALS} trials, quick space, short windows")
    common.add_model(p)
    p.add_argument("--trials", type=int, help=f"default 50 ({QUICK_TRIALS} with --quick)")
    p.add_argument("--seed", type=int, help="passed to both searches (default: none, as a user runs it)")
    p.add_argument("--spinners", type=int, default=1, help="busy-loop processes of the neighbour (1 = one CPU)")
    p.add_argument("extra", nargs="*", help="more `autotune search` flags, after --")
    args = p.parse_args()
    common.fill(args, {"model": common.MODEL, "trials": 50}, {"model": common.QUICK_MODEL, "trials": QUICK_TRIALS})
    args.extra = [*(common.QUICK_SEARCH if args.quick else ()), *args.extra]
    args.out = common.out_folder(args.out, "autotune-noisy-neighbour-")
    return args


def search_command(args: argparse.Namespace) -> list[str]:
    seed = ["--seed", str(args.seed)] if args.seed is not None else []
    return [sys.executable, "-m", "autotune", "search", "--model", args.model, "--trials", str(args.trials), *seed,
            *args.extra]


def run_search(args: argparse.Namespace, name: str, log: NeighbourLog | None) -> dict[str, Any]:
    """One search in OUT/name (its own studies/ and TMPDIR, so inductor's headers are built again
    as for a new user), with the neighbour beside it when `log` is given."""
    folder = args.out / name
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    command = search_command(args)
    common.say(f"{name}: $ autotune {' '.join(command[3:])} (log: {folder / 'search.log'})")
    load = os.getloadavg()[0]
    start = time.monotonic()
    with open(folder / "search.log", "wb") as out:
        search = subprocess.Popen(command, cwd=folder, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=common.cli_env(folder), start_new_session=True)
        try:
            if log is None:
                search.wait()
            else:
                with Neighbour(log, start) as neighbour:
                    watch(search, folder / "studies", neighbour, log, start)
        finally:
            stop_search(search)
    wall = time.monotonic() - start
    common.say(f"{name}: exit {search.returncode} after {wall / 60:.1f} min")
    return {"run": name, "folder": str(folder), "exit": search.returncode, "wall_s": round(wall, 1),
            "load_before": round(load, 2)}


def stop_search(search: subprocess.Popen[bytes]) -> None:
    """Interrupt a search still running (Ctrl-C, an exception here) as a user would, then kill it."""
    if search.poll() is not None:
        return
    os.killpg(search.pid, signal.SIGINT)
    try:
        search.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(search.pid, signal.SIGKILL)
        search.wait()


class Neighbour:
    """`log.spinners` busy loops, each its own process group, killed and reaped on exit whatever happens."""

    def __init__(self, log: NeighbourLog, origin: float) -> None:
        self.log, self.origin = log, origin
        self.spinners: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Neighbour:
        for _ in range(self.log.spinners):
            self.spinners.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL,
                                                  stdout=subprocess.DEVNULL, start_new_session=True))
        self.log.started_at, self.log.started_s = common.clock(), round(time.monotonic() - self.origin, 1)
        self.log.pids = [s.pid for s in self.spinners]
        return self

    def running(self) -> bool:
        return any(s.poll() is None for s in self.spinners)

    def stop(self, why: str, counted: int | None = None, finished: int | None = None) -> None:
        if not self.running():
            return
        for spinner in self.spinners:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(spinner.pid, signal.SIGKILL)
            spinner.wait()
        self.log.stopped_at, self.log.stopped_s = common.clock(), round(time.monotonic() - self.origin, 1)
        self.log.why, self.log.counted_at_stop, self.log.finished_at_stop = why, counted, finished
        common.say(f"neighbour stopped: {why}")

    def __exit__(self, *exc: object) -> None:
        self.stop("the search ended (or was interrupted) first")


def watch(search: subprocess.Popen[bytes], studies: Path, neighbour: Neighbour, log: NeighbourLog,
          origin: float) -> None:
    """Wait for the search, stopping the neighbour once a third of the trials are counted or its time is up."""
    common.say(f"neighbour: {log.spinners} busy loop(s) (pids {log.pids}) until {log.target_trials} counted "
               f"trials or {log.time_limit_s / 60:.1f} min")
    while search.poll() is None:
        if neighbour.running():
            seen = progress(studies)
            counted, finished = seen if seen else (None, None)
            if counted is not None and counted >= log.target_trials:
                neighbour.stop(f"{counted} counted trials (target {log.target_trials})", counted, finished)
            elif time.monotonic() - origin >= log.time_limit_s:
                neighbour.stop(f"time limit {log.time_limit_s:.0f} s", counted, finished)
        time.sleep(POLL_S)


def progress(studies: Path) -> tuple[int, int] | None:
    """(trials counted toward --trials, trials finished in any way) of the study, read-only; None
    while there is no study yet or its database is busy."""
    dbs = sorted(studies.glob("*.db"))
    if not dbs:
        return None
    url = f"sqlite:///file:{dbs[0].resolve()}?mode=ro&uri=true"
    try:
        with storage.quiet_optuna():
            rdb = optuna.storages.RDBStorage(url, skip_table_creation=True, skip_compatibility_check=True)
            try:
                trials = optuna.load_study(study_name=dbs[0].stem, storage=rdb).get_trials(deepcopy=False)
            finally:
                rdb.engine.dispose()
    except Exception:  # locked, half-created, no study in it yet: look again later
        return None
    return len(records.counted(trials)), sum(t.state in records.FINISHED for t in trials)


def read_study(folder: str) -> dict[str, Any]:
    """What the finished search recorded: trial states, undecided trials, recipes, the verdict."""
    try:
        study = storage.find_study(Path(folder) / "studies", None, None)
    except storage.StudyError as exc:
        return {"study_error": str(exc)}
    trials = study.get_trials(deepcopy=False)
    return {"study": study.study_name, "trials": trial_counts(trials), "recipes": [recipe_row(t) for t in trials
            if t.user_attrs.get("recipe")], "verdict": verdict_of(study, trials)}


def trial_counts(trials: list[FrozenTrial]) -> dict[str, Any]:
    undecided = [t for t in trials if records.fail_cause(t) == records.UNDECIDED]
    return {"total": len(trials), "counted": len(records.counted(trials)),
            "states": dict(Counter(t.state.name for t in trials)),
            "undecided": len(undecided), "undecided_final": sum(bool(t.user_attrs.get(records.UNDECIDED_FINAL))
                                                                for t in undecided),
            "failed_not_undecided": sum(t.state == TrialState.FAIL and t not in undecided for t in trials),
            "noisy": sum(bool(t.user_attrs.get("noisy")) for t in trials)}


def recipe_row(trial: FrozenTrial) -> dict[str, Any]:
    noisy, disturbed = bool(trial.user_attrs.get("noisy")), bool(trial.user_attrs.get("disturbed"))
    pruned = trial.state == TrialState.PRUNED
    return {"trial": trial.number, "recipe": trial.user_attrs.get("recipe"), "state": trial.state.name,
            "fail_cause": records.fail_cause(trial), "noisy": noisy, "disturbed": disturbed,
            "noisy_reason": trial.user_attrs.get("noisy_reason"),
            "noisy_attempts": trial.user_attrs.get("noisy_attempts"),
            "pruned_on_disturbed_window": pruned and disturbed,
            "pruned_under_spread": pruned and noisy and not disturbed}


def verdict_of(study: optuna.Study, trials: list[FrozenTrial]) -> dict[str, Any]:
    verdict = study.user_attrs.get("confirmation")
    if not verdict:
        return {"message": "no confirmation recorded"}
    by_number = {t.number: t for t in trials}
    winner = by_number.get(int(verdict["winner_trial"]))
    config = str(winner.user_attrs.get("config", "")) if winner else ""
    keep = ("significant", "winner_trial", "recommended_trial", "speedup", "ci", "ci_label", "p_value", "message")
    versus = verdict.get("against_recipe") or {}
    return {**{k: verdict.get(k) for k in keep}, "winner_config": config, "family": family(config),
            "against_recipe": {k: versus.get(k) for k in ("status", "recipe", "trial", "speedup", "ci", "ci_label",
                                                           "p_value", "recommended_trial")}}


def family(config: str) -> str:
    """backend + precision of a recorded configuration; an unset knob is its default (eager, fp32)."""
    try:
        parsed = Config.from_assignments([] if config in ("", "defaults") else config.split())
        return f"{parsed.text('backend')} {parsed.text('precision')}"
    except Exception:  # a knob this autotune no longer knows: read the two by hand
        pairs = dict(item.partition("=")[::2] for item in config.split())
        return f"{pairs.get('backend', 'eager')} {pairs.get('precision', 'fp32')}"


def judge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    verdicts = [r.get("verdict", {}) for r in runs]
    families = [v.get("family") for v in verdicts]
    confirmed = all(v.get("significant") for v in verdicts)
    speedups = [float(v["speedup"]) for v in verdicts if v.get("speedup") is not None]
    ratio = max(speedups) / min(speedups) if confirmed and len(speedups) == len(runs) else None
    def listed(key: str) -> list[str]:
        return [f"{r['run']}: trial {x['trial']} ({x['recipe']})" for r in runs for x in r.get("recipes", [])
                if x.get(key)]

    return {"both_confirmed": confirmed, "same_family": confirmed and families[0] == families[1],
            "speedup_ratio": ratio, "within_10pct": ratio is not None and ratio <= 1 + SPEEDUP_SPREAD,
            "recipes_pruned_on_disturbed_window": listed("pruned_on_disturbed_window"),
            "recipes_pruned_under_spread": listed("pruned_under_spread")}


def report(found: dict[str, Any]) -> str:
    """The table for RESULTS.md, the checks and what each run's recipes did."""
    lines = ["", common.provenance_line(found), "",
             "| run | wall (load before) | trials: counted / all, noisy, undecided (final), pruned, failed | winner "
             "| family | speedup over defaults | against the best recipe | recipes pruned on a disturbed window |",
             "|---|---|---|---|---|---|---|---|", *(table_row(run) for run in found["runs"]), ""]
    checks, log = found["checks"], found["neighbour"]
    lines.append(line("same family", checks["same_family"], " / ".join(shown_family(r) for r in found["runs"])))
    ratio = checks["speedup_ratio"]
    lines.append(line("speedups within 10%", checks["within_10pct"],
                      f"larger / smaller = {ratio:.3f}" if ratio else "n/a"))
    pruned = checks["recipes_pruned_on_disturbed_window"]
    lines.append(line("no recipe pruned on a disturbed window", not pruned, ", ".join(pruned) or "none"))
    lines.append(f"- recipes pruned on a window only wider than the floor, its interval clear of the limit: "
                 f"{', '.join(checks['recipes_pruned_under_spread']) or 'none'}")
    lines.append(f"- neighbour: {log['spinners']} busy loop(s), started {log['started_at']} "
                 f"(search +{log['started_s']:.0f} s), "
                 f"stopped {log['stopped_at']} (+{log['stopped_s'] or 0:.0f} s) at {log['counted_at_stop']} counted / "
                 f"{log['finished_at_stop']} finished trials: {log['why']}")
    for run in found["runs"]:
        lines.append(f"- {run['run']}, verdict: {run.get('verdict', {}).get('message')}")
        lines += [f"  - recipe {r['recipe']} (trial {r['trial']}): {r['state']}"
                  f"{' (' + r['fail_cause'] + ')' if r['fail_cause'] else ''}, noisy {r['noisy']}"
                  f"{': ' + str(r['noisy_reason']) if r['noisy_reason'] else ''}" for r in run.get("recipes", [])]
    return "\n".join(lines) + "\n"


def shown_family(run: dict[str, Any]) -> str:
    verdict = run.get("verdict", {})
    return f"{run['run']}: {verdict.get('family')}{'' if verdict.get('significant') else ' (not confirmed)'}"


def table_row(run: dict[str, Any]) -> str:
    n, v = run.get("trials", {}), run.get("verdict", {})
    states = n.get("states", {})
    trials = (f"{n.get('counted')} / {n.get('total')}, {n.get('noisy')}, {n.get('undecided')} "
              f"({n.get('undecided_final')}), "
              f"{states.get('PRUNED', 0)}, {n.get('failed_not_undecided')}")
    speedup = (f"{v['speedup']:.3f}x ({v['ci_label']} {v['ci'][0]:.3f}-{v['ci'][1]:.3f}, p={v['p_value']:.3g})"
               if v.get("significant") else "not confirmed")
    a = v.get("against_recipe") or {}
    versus = f"{a.get('status')} {a.get('recipe')!r} (trial {a.get('trial')})" if a.get("status") else "-"
    if a.get("speedup") is not None:
        versus += f": {a['speedup']:.3f}x ({a['ci_label']} {a['ci'][0]:.3f}-{a['ci'][1]:.3f}, p={a['p_value']:.3g})"
    pruned = sum(r["pruned_on_disturbed_window"] for r in run.get("recipes", []))
    return (f"| {run['run']} (exit {run['exit']}) | {run['wall_s'] / 60:.1f} min ({run['load_before']}) | {trials} "
            f"| trial {v.get('winner_trial')}: {v.get('winner_config', '-')} | {v.get('family', '-')} | {speedup} "
            f"| {versus} | {pruned} |")


def line(name: str, ok: bool, detail: str) -> str:
    return f"- {'ok' if ok else 'FAIL'}: {name}? {'yes' if ok else 'no'} ({detail})"


if __name__ == "__main__":
    sys.exit(main())
