"""What the next trial measures: the experts' recipes first, then the sampler's proposals, and
never a configuration that already ran, so that N trials are N distinct configurations.

The sampler is asked on a copy of the study held in memory, so that a proposal it makes twice
leaves no trial behind. When it keeps proposing configurations that ran (TPE does, once it has
settled on a region), the next trial is the configuration nearest its last proposal that has not
run: fewest knobs changed, ties broken at random. That keeps exploiting where the sampler points
instead of spending a trial on a repeat. When every configuration of the space has run there is
nothing to propose, and the search stops and says so. A configuration whose model gave wrong
answers in an earlier trial (the guard's verdict, the same in every process that runs that model)
is not proposed either: only the recipes run regardless, as named references. Nor is a remedy
(`Knob.remedy`: int8_fallback, layers kept in fp32) for a model that has not fallen short on
quality without it (`quality_records.short_on_quality`): it can only cost speed there, and its
quantizing and ranking were half of a 50-trial resnext101 search's time before this rule.

The copy shows the sampler every trial with every knob the space samples: the baseline and the
recipes set few, and the rest run at their defaults (`_as_sampled`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import ConfigError
from autotune.config.knobs import KNOBS, Config, KnobValue
from autotune.config.recipes import Recipe
from autotune.config.space import BATCH_PARAM, SearchSpace, config_of_params, knob_of_param
from autotune.model.knobdefs import value_text
from autotune.study import quality_records, storage

RETRIES = 8  # proposals asked of the sampler before taking the nearest configuration that has not run
RANDOM_TRIES = 10_000  # a space too large to list: random draws looking for one that has not run
Identity = tuple[str, int]  # (configuration as a user types it, batch size)
Model = tuple[str, int]  # (what decides its answers, batch size): `quality_records.model_of`
COVERED = ("backend", "precision", "memory_format", "omp_threads")  # what a coverage proposal must keep


@dataclass(frozen=True)
class Proposal:
    """A configuration to measure, the Optuna parameters that make a trial sample it, and where it
    came from: a recipe, the sampler, or the nearest unmeasured neighbour of the sampler's choice."""

    config: Config
    batch: int
    params: dict[str, KnobValue] = field(default_factory=dict)
    recipe: str = ""
    origin: str = "sampler"
    retry_of: int | None = None  # the trial it measures again: a noisy stop's (study/undecided.py), a killed one's
    waiting: int | None = None  # the trial id of the retry enqueued for a killed autotune's trial (`resumed`)
    warm: dict[str, Any] | None = None  # a warm start's: where the configuration won (`warm.Winner.to_json`)

    @property
    def identity(self) -> Identity:
        return (self.config.identity(), self.batch)


@dataclass(frozen=True)
class Proposer:
    """Everything a proposal depends on besides the study."""

    space: SearchSpace
    batch_sizes: tuple[int, ...]  # more than one: the batch size is a searched parameter
    sampler: Callable[[int | None], optuna.samplers.BaseSampler]  # a new one per proposal, from a seed
    recipes: tuple[Recipe, ...] = ()
    seed: int | None = None
    warm: tuple[Any, ...] = ()  # warm.Winner: what won in other studies of this host class, proposed first

    @property
    def searches_batch(self) -> bool:
        return len(self.batch_sizes) > 1

    def next(self, study: optuna.Study, trials: Sequence[FrozenTrial], measured: set[Identity],
             cover: Sequence[tuple[Mapping[str, KnobValue], int]] = (),
             wrong: Collection[Model] = (), short: Collection[Model] = ()) -> Proposal | None:
        """The next configuration to measure, or None when every one of the space has run: what
        won in other studies of this host class (`warm`), the recipes, then `cover` (configurations
        the search compiles before the sampler's next, `compile_skip.uncovered`), then the sampler's.
        `trials`: the study's, as the caller read them (the sampler sees them, nothing reads again).
        Beyond the recipes, nothing of a model in `wrong` (`quality_records.wrong_models`: it gave wrong
        answers) is proposed, nor a remedy's value for a model not in `short` (`remedy_unneeded`)."""
        for winner in self.warm:
            named = next((r for r in self.recipes if r.config.identity() == winner.config.identity()), None)
            fixed = replace(self._recipe(named), origin="warm start") if named is not None else \
                self._fixed(winner.config, self.batch_sizes[0], "warm start")
            proposal = replace(fixed, warm=winner.to_json())
            if proposal.identity not in measured:
                return proposal
        for recipe in self.recipes:
            proposal = self._recipe(recipe)
            if proposal.identity not in measured:
                return proposal
        is_open = partial(_open, measured=measured, wrong=wrong, space=self.space, short=short)
        for wanted, batch in cover:
            config = self.space.sample(_Preferring(wanted))
            if all(config.as_dict().get(k) == v for k, v in wanted.items() if k in COVERED):
                proposal = self._fixed(config, batch, "coverage: a precision and layout at the best's threads")
                if is_open(proposal.config, proposal.batch):
                    return proposal
        last: Proposal | None = None
        # A sampler of its own: Optuna's samplers cache per study and refuse a second one; seeded
        # from the search's seed and the trial count, so that a seeded search repeats itself.
        seed = None if self.seed is None else self.seed * 1_000_003 + len(trials)
        probe = _in_memory_copy(study.directions, trials, self.sampler(seed), self.space)
        for _ in range(RETRIES):
            last = self._ask(probe)
            if is_open(last.config, last.batch):
                return last
        return self._nearest_unmeasured(last, is_open, len(trials))

    def again(self, trial: FrozenTrial) -> Proposal:
        """A configuration that stopped on a noisy window (study/undecided.py), measured again as it
        ran: a recipe stays that recipe."""
        config = config_of_params(trial.params)
        batch = int(trial.user_attrs.get("batch_size", self.batch_sizes[0]))
        params = self.space.params(config) | ({BATCH_PARAM: batch} if self.searches_batch else {})
        return Proposal(config, batch, params, recipe=str(trial.user_attrs.get("recipe", "")),
                        origin="retry of a noisy stop", retry_of=trial.number)

    def resumed(self, waiting: FrozenTrial) -> Proposal:
        """The retry enqueued for a trial a killed autotune left running (study/holders.py): exactly
        the configuration that trial ran, knob for knob (a recipe stays that recipe and sets nothing
        more), in that very enqueued trial."""
        proposal = self.again(waiting)
        return replace(proposal, origin="retry of a killed autotune's trial",
                       retry_of=int(waiting.system_attrs["failed_trial"]), waiting=waiting._trial_id)

    def _recipe(self, recipe: Recipe) -> Proposal:
        batch = max(self.batch_sizes)  # throughput recipes run at the largest batch asked for
        params = self.space.params(recipe.config) | ({BATCH_PARAM: batch} if self.searches_batch else {})
        return Proposal(recipe.config, batch, params, recipe=recipe.name, origin="recipe")

    def _ask(self, probe: optuna.Study) -> Proposal:
        trial = probe.ask()
        config = self.space.sample(trial)
        batch = int(trial.suggest_categorical(BATCH_PARAM, list(self.batch_sizes))) if self.searches_batch \
            else self.batch_sizes[0]
        return Proposal(config, batch, dict(trial.params))

    def _nearest_unmeasured(self, proposed: Proposal | None, is_open: Callable[[Config, int], bool],
                            salt: int) -> Proposal | None:
        rng = random.Random(f"{self.seed}-{salt}")
        configs = _listed(self.space)
        if configs is None:
            return self._random_unmeasured(rng, is_open)
        candidates = [(c, b) for c in configs for b in self.batch_sizes if is_open(c, b)]
        if not candidates:
            return None
        rng.shuffle(candidates)
        if proposed is not None:
            candidates.sort(key=lambda cb: _distance(cb[0], cb[1], proposed))
        config, batch = candidates[0]
        return self._fixed(config, batch, "nearest unmeasured")

    def _random_unmeasured(self, rng: random.Random, is_open: Callable[[Config, int], bool]) -> Proposal | None:
        for _ in range(RANDOM_TRIES):
            config = self.space.sample(_RandomSuggester(rng))
            batch = rng.choice(self.batch_sizes)
            if is_open(config, batch):
                return self._fixed(config, batch, "random unmeasured")
        return None

    def _fixed(self, config: Config, batch: int, origin: str) -> Proposal:
        params = self.space.params(config) | ({BATCH_PARAM: batch} if self.searches_batch else {})
        return Proposal(config, batch, params, origin=origin)


def _open(config: Config, batch: int, measured: set[Identity], wrong: Collection[Model],
          space: SearchSpace | None = None, short: Collection[Model] = ()) -> bool:
    """Whether a configuration may be proposed: it has not run, its model gave no wrong answers, and
    it sets no remedy its model does not need."""
    if (config.identity(), batch) in measured:
        return False
    if wrong and quality_records.model_of(config, batch) in wrong:
        return False
    return space is None or not remedy_unneeded(space, config, batch, short)


def remedy_unneeded(space: SearchSpace, config: Config, batch: int, short: Collection[Model]) -> bool:
    """Whether `config` sets a remedy knob (`Knob.remedy`) off its default for a model that, with
    every remedy at its default, has not fallen short on quality (`short`: `quality_records.
    short_on_quality`). A space whose remedy knob does not offer its default (a pin: --set
    int8_fallback=4) is taken at its word."""
    values = config.as_dict()
    remedies = {name: value for name, value in values.items() if KNOBS[name].remedy and value != KNOBS[name].default}
    if not remedies:
        return False
    for name in remedies:
        offered = space.get(name)
        if offered is None or KNOBS[name].default not in (offered.choices or (offered.low,)):
            return False
    plain = Config.from_mapping({name: value for name, value in values.items() if name not in remedies})
    return quality_records.model_of(plain, batch) not in short


@lru_cache(maxsize=4)
def _listed(space: SearchSpace) -> tuple[Config, ...] | None:
    configs = space.configurations()
    return None if configs is None else tuple(configs)


def _distance(config: Config, batch: int, proposed: Proposal) -> int:
    """Knobs (and the batch size) whose values differ; a knob set on one side only counts once."""
    mine, theirs = config.as_dict(), proposed.config.as_dict()
    return sum(mine.get(k) != theirs.get(k) for k in mine.keys() | theirs.keys()) + (batch != proposed.batch)


def _in_memory_copy(directions: Sequence[optuna.study.StudyDirection], trials: Sequence[FrozenTrial],
                    sampler: optuna.samplers.BaseSampler, space: SearchSpace) -> optuna.Study:
    """The finished trials (parameters, values, intermediate values: what samplers read) in a study
    held in memory, with `sampler`."""
    with storage.quiet_optuna():
        probe = optuna.create_study(directions=directions, sampler=sampler)
        probe.add_trials([_slim(t, space) for t in trials
                          if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)])
    return probe


def _slim(trial: FrozenTrial, space: SearchSpace) -> FrozenTrial:
    params, distributions = _as_sampled(trial, space)
    return optuna.trial.create_trial(
        state=trial.state, values=trial.values if trial.state == TrialState.COMPLETE else None,
        params=params, distributions=distributions, intermediate_values=trial.intermediate_values,
        system_attrs={k: v for k, v in trial.system_attrs.items() if k == "constraints"})


def _as_sampled(trial: FrozenTrial, space: SearchSpace) -> tuple[dict[str, Any], dict[str, BaseDistribution]]:
    """A trial's parameters as a sampled trial of `space` would hold them. The baseline and the
    recipes set few knobs; the rest run at their defaults. Shown to the sampler with only the knobs
    they set, they do not count for any group of knobs they leave out, and TPE's best trials (the
    recipes, often) would say nothing about threads, instances or the allocator: a latency search
    on 2 cores then spent most of its trials on one-thread instances (benchmarks/RESULTS.md, "Which sampler").
    As it was recorded when the space does not offer what runs (a space narrowed by hand)."""
    try:
        full = space.as_run(config_of_params(trial.params))
    except ConfigError:
        full = None
    if full is None:
        return trial.params, trial.distributions
    recorder = _Recorder(full)
    space.sample(recorder)
    batch = {k: v for k, v in trial.params.items() if k == BATCH_PARAM}
    return recorder.params | batch, recorder.distributions | {k: trial.distributions[k] for k in batch}


class _Recorder:
    """Answers a space's questions with a configuration's values, recording what a sampled trial
    records: each parameter and its distribution."""

    def __init__(self, config: Config) -> None:
        self.values = config.as_dict()
        self.params: dict[str, Any] = {}
        self.distributions: dict[str, BaseDistribution] = {}

    def suggest_categorical(self, name: str, choices: Sequence[KnobValue]) -> KnobValue:
        value = value_text(self.values[knob_of_param(name)])
        self.params[name], self.distributions[name] = value, CategoricalDistribution(list(choices))
        return value

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        value = int(self.values[name])
        self.params[name], self.distributions[name] = value, IntDistribution(low, high, log=log, step=step)
        return value


class _Preferring:
    """Answers a space's questions with a configuration's values where the space offers them, else
    with the knob's default (or its first choice, its low end): the valid configuration nearest to
    one that may set knobs its other values make inapplicable."""

    def __init__(self, values: Mapping[str, KnobValue]) -> None:
        self.values = values

    def suggest_categorical(self, name: str, choices: Sequence[KnobValue]) -> KnobValue:
        knob = knob_of_param(name)
        for value in (self.values.get(knob), KNOBS[knob].default):
            if value is not None and value_text(value) in choices:
                return value_text(value)
        return choices[0]

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        value = self.values.get(name, KNOBS[name].default)
        return int(value) if isinstance(value, int) and low <= value <= high else low


class _RandomSuggester:
    """Uniform draws, for spaces too large to list."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def suggest_categorical(self, name: str, choices: Sequence[KnobValue]) -> KnobValue:
        return self.rng.choice(list(choices))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return self.rng.randrange(low, high + 1, step)
