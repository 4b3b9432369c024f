"""Skipping a compile: a sampled inductor configuration whose compile is predicted to lose is
pruned before it runs (when a started trial stops early is `pruning`'s rule).

With backend=inductor, a new (precision, memory format, thread count) is a
new compile, 20-46 s on resnext101 at batch 1 on 2 cores, where the other trials take 5-10 s. In
a latency search, a sampled configuration of a key no trial has measured is predicted from the
keys that were, on hosts of this host's class (`measured_here`: the same CPU, cores, memory and
versions; a trial of another class under --allow-mixed says nothing of this one's speed): from
each measured key's fastest trial, times, for each of the three that differs, that step's lowest
ratio between two measured keys that differ by it alone (int8 at 1 thread over int8 at 2, to
predict bf16 at 1 thread from bf16 at 2). A step no pair measured is unknown, not "no change": a
route that needs one is no prediction, and with no complete route the key compiles (on a 16-core
host most thread steps are never measured, and "no change" carried a slow bf16 at 16 threads to
every bf16 key from 1 to 15). The most hopeful prediction is kept. Predicted more than
`SKIP_COMPILE` times the best trial's value (this class's best), the trial is pruned without
running (`skip_compile`): that is the margin a trial gives up at after its last checked window, so
it would most likely have paid the compile and the windows, then stopped. A measured key that gave
up after its first window (at least 2x, its median of one window, which can read up to 1.5x its
value) stands at 1.33x the best or more, so a key skipped on it alone is at least that far behind
unless a step between them gains; benchmarks/RESULTS.md ("Skipping a compile, replayed") replays
the rule on recorded searches.

Coverage: a key at the thread count of this class's best trial is never skipped, and every
precision and layout the space offers is compiled at least once at the threads that win so far,
whatever the other keys predict: while a key (precision, layout, the best's threads) has no trial
of this class, the best trial's configuration with backend=inductor and that precision and layout
is proposed before the sampler's next (`uncovered`, after the recipes).

A prediction is not a measurement: a skipped trial (`records.record_skipped`) takes no trial of
--trials (`records.counts`) and is never reused as a configuration's result
(`records.same_config`, `records.measured_configs`). It records what its decision read
(`Evidence.mark`: this class's best trial and each key's fastest trial), and its configuration is
not proposed again while that is unchanged (`held`): once a measurement changes it, the
configuration is proposable, and a proposal of it is decided afresh on the new evidence (run, or
skipped again on it). Evidence changes only with a measurement, so between two measurements each
configuration is skipped at most once, and a search whose every configuration has run or is held
stops ("every configuration of the space has run"). The baseline, the recipes and trials enqueued
through Optuna always run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import ConfigError
from autotune.base.thresholds import SKIP_COMPILE
from autotune.config.knobs import Config, KnobValue
from autotune.config.space import SearchSpace, config_of_params
from autotune.measure.objectives import Objective, lower_is_better, metric_of
from autotune.model import backends
from autotune.model.knobs import KNOBS, conditions, shown
from autotune.study import records

# What an inductor artifact is compiled for, as its backend says: precision, memory format, threads, shapes.
CompileKey = tuple[str, str, int, str]
KEY_NAMES = backends.get("inductor").compiled_for


@dataclass(frozen=True)
class Prediction:
    value: float  # the latency (ms) the configuration is predicted at
    near: int  # the trial of the measured key it is predicted from
    # for each of the three that differs from that key: its name, and the two trials whose ratio
    # gives that step (every step of a prediction was measured: an unmeasured one is unknown)
    steps: tuple[tuple[str, tuple[int, int]], ...] = ()

    def why(self) -> str:
        """Where the prediction comes from, for the skipped trial's reason: the measured key's
        trial, times each step's two trials (all measured on this host class)."""
        return f"trial {self.near}" + "".join(f" times trial {b} over trial {a}" for _, (b, a) in self.steps)


class Best(NamedTuple):
    """This host class's best trial: its number, value (ms) and thread count."""

    number: int
    value: float
    threads: int


@dataclass(frozen=True)
class Evidence:
    """What a skip decision reads: each key measured on this host class with its fastest value and
    trial, and this class's best trial (number, value, thread count)."""

    fastest: dict[CompileKey, tuple[float, int]]
    best: Best | None

    def mark(self) -> str:
        """The decision's inputs in one line, recorded on a skipped trial (`records.SKIPPED_ON`): a
        configuration skipped on a mark is proposed again once the mark differs (`held`)."""
        best = "none" if self.best is None else str(self.best.number)
        return f"best trial {best}; fastest of each key: trials {sorted(n for _, n in self.fastest.values())}"


@dataclass(frozen=True)
class Skip:
    """A sampled configuration not run: why, and the evidence it was decided on."""

    reason: str
    evidence: str


def compile_key(space: SearchSpace, config: Config) -> CompileKey | None:
    """The artifact an inductor configuration compiles (None: not inductor, or not in the space)."""
    full = space.as_run(config)
    if full is None or full.get("backend") != "inductor":
        return None
    precision, layout, threads, shapes = (full.get(name) for name in KEY_NAMES)
    return str(precision), str(layout), int(threads or 0), str(shapes)


def measured_here(trials: Sequence[FrozenTrial], klass: str) -> list[FrozenTrial]:
    """The trials a prediction may read: measured (not skipped) on a host of class `klass`. A
    trial recorded before host classes counts as this class's (one host ran such a study)."""
    return [t for t in trials if t.user_attrs.get(records.HOST_CLASS, klass) == klass
            and not t.user_attrs.get(records.SKIPPED)]


def evidence(space: SearchSpace, trials: Sequence[FrozenTrial], klass: str) -> Evidence:
    """What a skip decision reads from `trials` (the study's): only trials of this host class."""
    here = measured_here(trials, klass)
    done = [t for t in here if t.state == TrialState.COMPLETE and t.values and t.user_attrs.get("feasible", True)]
    best = min(done, key=lambda t: float(t.values[0]), default=None)  # skips are in latency searches only
    threads = _threads(space, best) if best is not None else None
    return Evidence(_fastest_per_key(space, here),
                    None if best is None or threads is None else Best(best.number, float(best.values[0]), threads))


def _threads(space: SearchSpace, trial: FrozenTrial) -> int | None:
    """The thread count a trial ran at, as the space fills in what it left unset."""
    try:
        full = space.as_run(config_of_params(trial.params))
    except ConfigError:
        return None
    return None if full is None else int(full.get("omp_threads") or 0)


def predict_compile(space: SearchSpace, trials: Sequence[FrozenTrial], key: CompileKey,
                    klass: str) -> Prediction | None:
    """`key`'s latency as predicted from the keys measured on host class `klass` (module
    docstring); None when a trial measured it already, none was measured, or every route from a
    measured key needs a step no pair measured (unknown)."""
    return _predict(_fastest_per_key(space, measured_here(trials, klass)), key)


def _predict(seen: dict[CompileKey, tuple[float, int]], key: CompileKey) -> Prediction | None:
    if key in seen:
        return None
    predictions = []
    for near, (value, number) in seen.items():
        steps = []
        for axis in (i for i in range(len(key)) if near[i] != key[i]):
            step = _step(seen, axis, near[axis], key[axis])
            if step is None:  # unknown: no route from this key
                break
            value *= step[0]
            steps.append((KEY_NAMES[axis], step[1]))
        else:
            predictions.append(Prediction(value, number, tuple(steps)))
    # level predictions (routes through the same measurements) name the nearest key
    return min(predictions, key=lambda p: (round(p.value, 6), len(p.steps)), default=None)


def _fastest_per_key(space: SearchSpace, trials: Sequence[FrozenTrial]) -> dict[CompileKey, tuple[float, int]]:
    """Each measured key's lowest latency and its trial: a completed trial's value, a pruned
    one's last intermediate value (the median it had measured)."""
    seen: dict[CompileKey, tuple[float, int]] = {}
    for trial in trials:
        if trial.state == TrialState.COMPLETE and trial.values:
            value = float(trial.values[0])
        elif trial.state == TrialState.PRUNED and trial.intermediate_values:
            value = float(trial.intermediate_values[max(trial.intermediate_values)])
        else:
            continue
        try:
            key = compile_key(space, config_of_params(trial.params))
        except ConfigError:  # a trial of a knob this autotune no longer knows
            continue
        if key is not None and (key not in seen or value < seen[key][0]):
            seen[key] = (value, trial.number)
    return seen


def _step(seen: dict[CompileKey, tuple[float, int]], axis: int, start: object,
          end: object) -> tuple[float, tuple[int, int]] | None:
    """The lowest measured ratio of going from `start` to `end` along `axis`, between two
    keys equal otherwise, with the two trials it comes from."""
    ratios = [(seen[b][0] / seen[a][0], (seen[b][1], seen[a][1]))
              for a in seen for b in seen
              if a[axis] == start and b[axis] == end and all(a[i] == b[i] for i in range(len(a)) if i != axis)]
    return min(ratios, key=lambda r: r[0], default=None)


def skip_compile(study: optuna.Study, space: SearchSpace, objective: Objective, config: Config,
                 klass: str) -> Skip | None:
    """Whether this sampled configuration is not run (None: run it): a latency search, a key no
    trial of host class `klass` measured, other than a precision and layout at the thread count of
    this class's best trial, predicted more than SKIP_COMPILE times that best trial's value."""
    if len(study.directions) != 1 or not lower_is_better(metric_of(objective)):
        return None
    key = compile_key(space, config)
    if key is None:
        return None
    seen = evidence(space, study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)), klass)
    best = seen.best
    if best is None or key[2] == best.threads:  # every precision and layout compiles at the best's threads
        return None
    predicted = _predict(seen.fastest, key)
    if predicted is None or predicted.value <= SKIP_COMPILE * best.value:
        return None
    precision, layout, threads, shapes = key
    dynamic = " shapes=dynamic" if shapes == "dynamic" else ""
    return Skip(f"not compiled: {precision} {layout}{dynamic} at {threads} thread(s) predicted at "
                f"{predicted.value:.2f} ms ({predicted.why()}), more than {SKIP_COMPILE:g}x trial {best.number}'s "
                f"{best.value:.2f} ms",
                seen.mark())


def held(space: SearchSpace, trials: Sequence[FrozenTrial], klass: str, digest: str) -> set[tuple[str, int]]:
    """(config, batch size) of the configurations this host class skipped on the evidence it still
    has (`Evidence.mark`): not proposed again until a measurement changes what the skip read."""
    mark = evidence(space, [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)], klass).mark()
    return {records.identity(t) for t in trials
            if t.user_attrs.get(records.SKIPPED) and t.user_attrs.get(records.HOST_CLASS, klass) == klass
            and t.user_attrs.get("settings_digest") == digest and t.user_attrs.get(records.SKIPPED_ON) == mark}


def uncovered(space: SearchSpace, trials: Sequence[FrozenTrial],
              klass: str) -> list[tuple[dict[str, KnobValue], int]]:
    """(configuration, batch size) of each precision x layout (x shapes, with sequence-length buckets)
    the space offers that no trial of host class `klass` ran at the thread count of this class's best
    trial: the best's configuration with backend=inductor and that precision and layout, in the space's
    order, as knob values (without the best's knobs that no longer apply: eager's mkldnn, int8's
    int8_fallback with another precision; the proposer samples the nearest valid configuration)."""
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    best = evidence(space, finished, klass).best
    precisions, layouts = space.get("precision"), space.get("memory_format")
    if best is None or precisions is None or layouts is None or not _offers_inductor(space):
        return []
    trial = next(t for t in trials if t.number == best.number)
    base = space.as_run(config_of_params(trial.params))
    if base is None:
        return []
    tried = {_key_of(space, t) for t in measured_here(trials, klass)
             if t.state == TrialState.RUNNING or records.counts(t) or records.awaits_retry(t)}
    offered = space.get("shapes")
    found = []
    for precision in precisions.choices:
        for layout in layouts.choices:
            for shapes in offered.choices if offered is not None else (str(base.get("shapes")),):
                wanted = _applying(base.as_dict() | {"backend": "inductor", "precision": precision,
                                                     "memory_format": layout, "omp_threads": best.threads}
                                   | ({"shapes": shapes} if offered else {}))
                if (str(precision), str(layout), best.threads, str(shapes)) not in tried:
                    found.append((wanted, int(trial.user_attrs.get("batch_size", 1))))
    return found


def _applying(values: dict[str, KnobValue]) -> dict[str, KnobValue]:
    """`values` without the knobs the others' new values make inapplicable (the best's int8_fallback
    where the precision is no longer int8)."""
    return {name: value for name, value in values.items()
            if all(shown(values.get(other, KNOBS[other].default)) in allowed
                   for other, allowed in conditions(name, value))}


def _offers_inductor(space: SearchSpace) -> bool:
    backend = space.get("backend")
    return backend is not None and "inductor" in backend.choices


def _key_of(space: SearchSpace, trial: FrozenTrial) -> CompileKey | None:
    try:
        return compile_key(space, config_of_params(trial.params))
    except ConfigError:
        return None
