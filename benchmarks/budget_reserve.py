"""How well `--time-budget` foresees the confirmation: for kept studies that were searched and then
confirmed (`benchmarks/search_cost.py --keep STUDY.db`), the confirmation's share the budget would
reserve after the last trial, costing a candidate's process as the median trial that compiled
nothing (`budget.TimeBudget.reserve` without candidates, its rule before 2026-12-01) and from the
candidates the confirmation took (with them), against what the confirmation took: the time from
the last trial's end to the stored verdict. Where the confirmation stored its processes' walls
(since 2026-12-01), also one process of the baseline and of a candidate, estimated against
measured (the median over the candidates of their median process). It reads a trial's windows
as one process's, as `search` runs them by default (not `--fresh-replicates`).

    .venv/bin/python benchmarks/budget_reserve.py STUDY.db [STUDY.db ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from autotune.measure.stats import median
from autotune.search import budget
from autotune.study import records


def spent(trial: FrozenTrial) -> budget.Spent:
    """What the trial cost, from its record, as the search loop counts it from the trial's run."""
    attrs = trial.user_attrs
    if records.is_duplicate(trial) or "timed_s" not in attrs or trial.datetime_complete is None:
        return budget.Spent(None, bool(attrs.get("baseline")), number=trial.number)
    first_call = attrs.get("first_call_s") or {}
    wall = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_start else 0.0
    windows = len(attrs.get("replicate_p50_ms") or [None])
    return budget.spent(wall, budget.compile_seconds(first_call), float(attrs["timed_s"]), windows, warm=True,
                        baseline=bool(attrs.get("baseline")), settle_s=budget.settle_seconds(first_call),
                        number=trial.number)


def row(path: Path) -> list[str]:
    storage = f"sqlite:///{path}"
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    confirmation = study.user_attrs.get("confirmation")
    finished = [t for t in study.get_trials(deepcopy=False, states=records.FINISHED) if t.datetime_complete]
    if not confirmation or not finished:
        raise SystemExit(f"{path}: no confirmed search in it; keep one with benchmarks/search_cost.py --keep")
    candidates = [int(c["trial"]) for c in confirmation["candidates"]]
    rounds = int(confirmation["rounds"])
    # a budget without end: the reserve is for the rounds the confirmation ran, not a share of a budget
    limit = budget.TimeBudget(math.inf, rounds, len(candidates), replicates=3, window_s=2.0, warm=True)
    trials = [spent(t) for t in finished]
    processes, before = limit.reserve(trials, len(candidates), 0.0)
    _, now = limit.reserve(trials, len(candidates), 0.0, candidates)
    baseline_s, candidate_s = limit.process_costs(trials, 0.0, candidates)
    walls = [c.get("process_wall_s") for c in confirmation["candidates"]]
    measured = [w for w in walls if w is not None]
    ended = max(t.datetime_complete for t in finished if t.datetime_complete)
    confirmed = dt.datetime.strptime(confirmation["confirmed_at"], "%Y-%m-%dT%H:%M:%S%z")
    took = (confirmed.replace(tzinfo=None) - ended).total_seconds()
    return [path.name, str(len(finished)), str(processes), f"{took:.0f}", f"{before:.0f} ({before / took:.2f}x)",
            f"{now:.0f} ({now / took:.2f}x)", _versus(baseline_s, confirmation.get("baseline_process_wall_s")),
            _versus(candidate_s, median(measured) if measured else None)]


def _versus(estimate: float, measured: float | None) -> str:
    return f"{estimate:.1f} / {measured:.1f}" if measured is not None else f"{estimate:.1f} / -"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("studies", nargs="+", type=Path)
    args = parser.parse_args()
    for path in args.studies:
        if not path.is_file():  # optuna would create an empty database there
            parser.error(f"{path}: no such file; keep a study with benchmarks/search_cost.py --keep {path}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("| study | trials | confirmation processes | confirmation took, s | reserve from the median trial, s "
          "| reserve from the candidates, s | baseline process, s: estimate / measured "
          "| candidate process, s: estimate / measured |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args.studies:
        print("| " + " | ".join(row(path)) + " |")


if __name__ == "__main__":
    main()
