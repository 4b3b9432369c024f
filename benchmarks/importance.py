"""Which knob-importance evaluator should `autotune report` use? fANOVA against PED-ANOVA on a real study.

For each evaluator: the importances on the study's measured trials (as `autotune report` builds
them: every knob of the space, unset ones as their default), how stable they are across seeds and
across bootstrap resamples of the trials, how well they agree with the marginal effects (Spearman
correlation with each knob's eta squared: the share of variance its value groups explain on
their own), and the median time of one evaluation.

    .venv/bin/python benchmarks/importance.py studies/resnext101_32x8d-bs8-throughput.db
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.importance import BaseImportanceEvaluator, FanovaImportanceEvaluator, PedAnovaImportanceEvaluator
from scipy.stats import spearmanr

from autotune.measure.objectives import Metric, lower_is_better
from autotune.report import contents, importance
from autotune.report.importance import Row
from autotune.study import storage

RUNS = 10
EVALUATORS: dict[str, Callable[[int], BaseImportanceEvaluator]] = {
    "fANOVA": lambda seed: FanovaImportanceEvaluator(seed=seed),
    "PED-ANOVA": lambda seed: PedAnovaImportanceEvaluator(),  # deterministic: no seed
}


def importances(rows: Sequence[Row], metric: Metric, evaluator: BaseImportanceEvaluator) -> dict[str, float]:
    knobs = importance.varying(rows)
    dists: dict[str, BaseDistribution] = {
        k: CategoricalDistribution(sorted({r.knobs[k] for r in rows})) for k in knobs}
    copy = optuna.create_study(direction="minimize" if lower_is_better(metric) else "maximize")  # PED-ANOVA: the best
    copy.add_trials([optuna.trial.create_trial(params={k: r.knobs[k] for k in knobs}, distributions=dists,
                                               value=r.values[metric]) for r in rows])
    return optuna.importance.get_param_importances(copy, evaluator=evaluator, normalize=True)


def eta_squared(rows: Sequence[Row], metric: Metric) -> dict[str, float]:
    values = [r.values[metric] for r in rows]
    mean = statistics.fmean(values)
    total = sum((v - mean) ** 2 for v in values)
    found = {}
    for knob in importance.varying(rows):
        groups: dict[str, list[float]] = {}
        for r in rows:
            groups.setdefault(r.knobs[knob], []).append(r.values[metric])
        found[knob] = sum(len(g) * (statistics.fmean(g) - mean) ** 2 for g in groups.values()) / total
    return found


def compare(rows: Sequence[Row], metric: Metric, name: str) -> None:
    make, knobs = EVALUATORS[name], importance.varying(rows)
    eta = eta_squared(rows, metric)
    runs, seconds = [], []
    for seed in range(RUNS):
        start = time.perf_counter()
        runs.append(importances(rows, metric, make(seed)))
        seconds.append(time.perf_counter() - start)
    mean = {k: statistics.fmean(r.get(k, 0.0) for r in runs) for k in knobs}
    rng = random.Random(0)
    boot = [importances(sample, metric, make(b)) for b in range(RUNS)
            if importance.varying(sample := [rows[rng.randrange(len(rows))] for _ in rows])]
    print(f"{name}: median {statistics.median(seconds):.3f} s per evaluation")
    print("  importance:", ", ".join(f"{k} {v:.3f}" for k, v in sorted(mean.items(), key=lambda kv: -kv[1])))
    print(f"  top knob per seed: {sorted({max(r, key=r.__getitem__) for r in runs})}; largest sd across seeds "
          f"{max(statistics.pstdev([r.get(k, 0.0) for r in runs]) for k in knobs):.3f}")
    tops = [max(b, key=b.__getitem__) for b in boot]
    print(f"  top knob over {len(boot)} bootstrap resamples: {dict(sorted((t, tops.count(t)) for t in set(tops)))}")
    print(f"  Spearman with the marginal effects (eta squared): "
          f"{spearmanr([mean[k] for k in knobs], [eta[k] for k in knobs]).statistic:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", help="a study database (read only)")
    parser.add_argument("--study", help="the study's name, when the database holds several")
    args = parser.parse_args()
    with storage.quiet_optuna(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = storage.find_study(Path("studies"), args.study, f"sqlite:///{args.db}")
        rows = importance.design(study)
        metric = contents.metrics_of(str(study.user_attrs.get("objective", "latency")))[0]
        used = [r for r in rows if metric in r.values]
        print(f"study {study.study_name}: {len(used)} measured trials, {metric}, knobs {importance.varying(used)}")
        for name in EVALUATORS:
            compare(used, metric, name)


if __name__ == "__main__":
    main()
