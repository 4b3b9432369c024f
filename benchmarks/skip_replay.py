"""The compile skip replayed on kept latency studies (`benchmarks/search_cost.py --keep STUDY.db`):
for every trial that compiled a key no earlier trial had measured, or that the search skipped, what
`pruning.predict_compile` predicts from the trials before it, what `pruning.skip_compile` decides
today, and what the trial measured when it ran: its value over the best trial's before it, and
whether it gave up. A skipped trial that finished near the best is what the rule risks; the
seconds of skipped trials that gave up are what it saves.

The replay keeps the study's path: in a search under today's rule the sampler would have seen the
skipped trials as pruned and drawn others after them. The space is the default one, adapted to
this machine's cores with bf16 and int8 (the searches of benchmarks/RESULTS.md, "What a search costs").

    .venv/bin/python benchmarks/skip_replay.py STUDY.db [STUDY.db ...]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base import thresholds
from autotune.config import space, space_fit
from autotune.config.space import config_of_params
from autotune.search import pruning
from autotune.study import records, storage

NEAR_BEST = 1.2  # a ran trial at most this far behind the best before it: losing it would matter


def replay(study: optuna.Study, searched: space.SearchSpace) -> tuple[list[list[str]], float, int]:
    """One row per trial of a new key or skipped, in trial order; the seconds that trials which ran
    in the study but are skipped today took, and how many of those finished near the best."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    rows, seen, saved_s, lost = [], set(), 0.0, 0
    for at, trial in enumerate(trials):
        key = pruning.compile_key(searched, config_of_params(trial.params))
        skipped = bool(trial.user_attrs.get(records.SKIPPED))
        if key is None or (key in seen and not skipped):
            continue
        if not skipped:
            seen.add(key)
        before = optuna.create_study()  # the study as it stood when the trial was claimed
        before.add_trials(trials[:at])
        leader = next(iter(records.best_trials(before)), None)
        if leader is None or leader.value is None:
            continue
        best = float(leader.value)
        klass = str(trial.user_attrs.get(records.HOST_CLASS, ""))  # the prediction of the host that claimed it
        predicted = pruning.predict_compile(searched, trials[:at], key, klass)
        skip = pruning.skip_compile(before, searched, "latency", config_of_params(trial.params), klass) is not None
        forced = bool(trial.user_attrs.get("recipe")) or trial.user_attrs.get("proposed_by") == "enqueued"
        outcome, value, wall = _outcome(trial)
        if skip and not forced and value is not None:
            saved_s += wall
            lost += value <= NEAR_BEST * best
        rows.append([str(trial.number), " ".join(map(str, key)), f"{best:.2f}",
                     "-" if predicted is None else f"{predicted.value:.2f} ({predicted.value / best:.2f}x)",
                     "runs (recipe)" if forced else ("skip" if skip else "compile"),
                     outcome if value is None else f"{outcome}, {value / best:.2f}x the best before"])
    return rows, saved_s, lost


def _outcome(trial: FrozenTrial) -> tuple[str, float | None, float]:
    """What the trial did in the study: its state, value (None when skipped there) and wall."""
    if trial.user_attrs.get(records.SKIPPED):
        return "skipped in the study", None, 0.0
    if trial.state == TrialState.COMPLETE and trial.values:
        value, state = float(trial.values[0]), "finished"
    else:
        value, state = float(trial.intermediate_values[max(trial.intermediate_values)]), "gave up"
    setup = ((trial.user_attrs.get("instances") or [{}])[0]).get("setup", {})
    compiled = sum(float(setup.get(k, 0.0)) for k in ("compile_s", "quantize_s", "quantized_graph_load_s"))
    done, began = trial.datetime_complete, trial.datetime_start
    wall = (done - began).total_seconds() if done and began else 0.0
    return f"{state} at {value:.2f} ms ({compiled:.0f} s compiling, {wall:.0f} s in all)", value, wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("studies", nargs="+", type=Path)
    args = p.parse_args()
    searched = space_fit.adapt(space.load(space.find("default")), os.cpu_count() or 1, {"bf16": True, "int8": True})
    print(f"thresholds.SKIP_COMPILE = {thresholds.SKIP_COMPILE:g}\n")
    for path in args.studies:
        with storage.quiet_optuna():
            name = optuna.get_all_study_names(f"sqlite:///{path}")[0]
            study = optuna.load_study(study_name=name, storage=f"sqlite:///{path}")
        print(f"{path.name}\n")
        print("| trial | key (precision, layout, threads) | best before, ms | predicted today | today's rule "
              "| in the study |")
        print("|---|---|---|---|---|---|")
        with storage.quiet_optuna():
            rows, saved_s, lost = replay(study, searched)
        for row in rows:
            print("| " + " | ".join(row) + " |")
        print(f"\ntoday's rule skips {saved_s:.0f} s of trials that ran in the study; {lost} of them finished "
              f"within {NEAR_BEST:g}x of the best before them\n")


if __name__ == "__main__":
    main()
