"""What a search measures next: recipes after the baseline, distinct configurations only, the
nearest unmeasured one when the sampler repeats itself, a stop when the space is exhausted, and
what every study records about its cost. Fake runner, no processes."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config import recipes, space, space_fit
from autotune.config.knobs import Config
from autotune.host.machine import Machine
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import ReplicatePolicy
from autotune.measure.results import RunResult
from autotune.search import compile_skip, fleet, loop, opening, proposals
from autotune.study import holders, records, references
from tests.conftest import lscpu
from tests.support import probes
from tests.support.samplers import Stubborn
from tests.support.spaces import every
from tests.support.studies import DEFAULT, SPACE, fake_result, fake_runner, ok_runner, request

COMPILE_INT8 = {"backend": "inductor", "memory_format": "channels_last", "precision": "int8"}


def run(tmp_path: Path, here: Machine, trials: int, **kw: Any) -> tuple[opening.Search, str]:
    runner = kw.pop("runner", fake_runner)
    opened = opening.open_search(request(tmp_path, trials, **kw), here)
    stopped = loop.run_search(opened, here, lambda event: None, runner=runner)
    return opened, stopped


def test_configurations_lists_exactly_what_sampling_can_return(here: Machine) -> None:
    adapted = space_fit.adapt(space.load(DEFAULT), 2, {})
    listed = adapted.configurations()
    assert listed is not None and len(listed) == len(set(listed))

    class Random:
        rng = random.Random(0)

        def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
            return self.rng.choice(list(choices))

        def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
            return self.rng.randrange(low, high + 1, step)

    drawn = {adapted.sample(Random()) for _ in range(3000)}
    assert drawn <= set(listed)
    small = space_fit.adapt(space.load(SPACE), 8, {})
    assert len(every(small)) == 8  # 2 x 2 x 2, no conditions
    assert adapted.configurations(limit=100) is None  # too many to list
    assert space_fit.adapt(space.load(DEFAULT), 8, {}).configurations() is None


def test_n_trials_are_n_distinct_configurations(tmp_path: Path, here: Machine) -> None:
    opened, stopped = run(tmp_path, here, 7, space=SPACE, runner=ok_runner)
    configs = [(t.user_attrs["config"], t.user_attrs["batch_size"]) for t in opened.study.get_trials()]
    assert len(configs) == 7 and len(set(configs)) == 7 and stopped == ""
    assert not any(records.is_duplicate(t) for t in opened.study.get_trials())


def test_an_exhausted_space_stops_the_search_and_says_so(tmp_path: Path, here: Machine) -> None:
    opened, stopped = run(tmp_path, here, 20, space=SPACE, runner=ok_runner)
    # the baseline and the 8 configurations of the space but one: mkldnn=off omp_runtime=gnu
    # allocator=default launches the baseline's very command
    assert len(opened.study.get_trials()) == 8
    assert stopped == ("every configuration of the space has run (8 distinct, baseline included); widen the space "
                       "(--space) to search further")


def test_a_repeated_proposal_is_replaced_by_the_nearest_configuration_not_measured(here: Machine) -> None:
    small = space_fit.adapt(space.load(SPACE), 8, {})
    study = optuna.create_study()
    stubborn = Stubborn({"mkldnn": "off", "omp_runtime": "gnu", "allocator": "jemalloc"})
    proposer = proposals.Proposer(small, (1,), lambda seed: stubborn, seed=0)
    measured = {("allocator=jemalloc", 1)}  # what mkldnn=off omp_runtime=gnu allocator=jemalloc launches
    proposal = proposer.next(study, [], measured)
    assert proposal is not None and proposal.origin == "nearest unmeasured"
    assert proposal.identity not in measured
    # one knob away from what the sampler wanted, as what each launches
    assert proposal.identity[0] in {"mkldnn=on allocator=jemalloc", "omp_runtime=intel allocator=jemalloc",
                                    "defaults"}
    assert proposal.params == small.params(proposal.config)
    everything = {(c.identity(), 1) for c in every(small)}
    assert proposer.next(study, [], everything) is None


def test_recipes_run_right_after_the_baseline_and_are_named(tmp_path: Path, here: Machine,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    opened, _ = run(tmp_path, here, 6, space=DEFAULT, runner=ok_runner)
    trials = opened.study.get_trials()
    assert opened.proposer is not None
    names = [r.name for r in opened.proposer.recipes]
    assert names[:3] == ["seed", "pytorch-launcher", "compile+channels_last"]
    assert [t.user_attrs.get("recipe") for t in trials] == [None, *names, None][:6]
    seed = trials[1]
    assert seed.user_attrs["config"] == ("mkldnn=on weight_cache=on omp_threads=8 omp_runtime=intel "
                                         "kmp_affinity=compact kmp_blocktime=1 allocator=jemalloc instances=1")
    assert seed.params == {"mkldnn": "on", "weight_cache": "on", "omp_threads": 8, "omp_runtime": "intel",
                           "kmp_affinity": "compact", "kmp_blocktime": "1", "allocator": "jemalloc", "instances": 1}
    compiled = trials[3]
    assert compiled.user_attrs["config"] == "backend=inductor memory_format=channels_last"  # nothing else set
    assert {t.user_attrs.get("proposed_by") for t in trials[1:]} >= {"recipe"}


def test_throughput_adds_one_instance_per_node_and_bf16_only_where_supported() -> None:
    two_sockets = lscpu("xeon_2s_ht")
    names = [r.name for r in recipes.recipes(two_sockets, "throughput", probes.refusing(bf16=True, int8=True))]
    assert names == ["seed", "pytorch-launcher", "compile+channels_last", "seed, one instance per node",
                     "pytorch-launcher, one instance per node", "compile+channels_last, one instance per node"]
    per_node = recipes.recipes(two_sockets, "throughput", probes.refusing(int8=True))[-1]
    cores = len(two_sockets.usable_cores)
    assert per_node.config.get("instances") == 2 and per_node.config.get("omp_threads") == cores // 2
    latency = recipes.recipes(two_sockets, "latency", probes.refusing(int8=True))
    assert [r.name for r in latency][-1] == "compile+bf16+channels_last"


def test_recipes_the_space_cannot_express_are_left_out_with_one_note(tmp_path: Path, here: Machine) -> None:
    opened = opening.open_search(request(tmp_path, 2, space=SPACE), here)
    assert opened.proposer is not None and opened.proposer.recipes == ()
    [note] = [n for n in opened.notes if n.startswith("recipes not run")]
    assert note.startswith(f"recipes not run, since {SPACE} does not offer a knob value they set: seed "
                           "(weight_cache=on), pytorch-launcher (omp_threads=8)")


def test_a_trial_enqueued_through_optuna_is_run_as_enqueued(tmp_path: Path, here: Machine) -> None:
    """Also after TPE's startup, with parameters left to the sampler: the study's own sampler then
    samples the rest, never having seen the in-memory copies proposals are asked on."""
    opened, _ = run(tmp_path, here, 10, space=DEFAULT, runner=ok_runner)
    opened.study.enqueue_trial({"backend": "eager", "mkldnn": "on", "omp_runtime": "intel", "allocator": "default"})
    again = opening.open_search(request(tmp_path, 12, space=DEFAULT), here)
    loop.run_search(again, here, lambda event: None, runner=ok_runner)
    enqueued = again.study.get_trials()[10]
    assert enqueued.user_attrs["proposed_by"] == "enqueued"
    assert {"backend=eager", "mkldnn=on", "omp_runtime=intel", "allocator=default"} <= set(
        enqueued.user_attrs["config"].split())
    assert again.study.get_trials()[11].user_attrs["proposed_by"] in (  # five precisions x two layouts to cover
        "sampler", "nearest unmeasured", "coverage: a precision and layout at the best's threads")


def test_the_baseline_never_takes_a_trial_enqueued_before_it(tmp_path: Path, here: Machine) -> None:
    """Optuna's ask takes the oldest enqueued trial: the baseline took a user's configuration (or a
    dead worker's retry) and measured the defaults in its place."""
    made = opening.open_search(request(tmp_path, 1, space=DEFAULT), here)
    made.study.enqueue_trial({"backend": "eager", "mkldnn": "on", "omp_runtime": "intel", "allocator": "default"})
    opened, _ = run(tmp_path, here, 2, space=DEFAULT, runner=ok_runner)
    enqueued, baseline = opened.study.get_trials()  # numbered as made: the enqueued one first
    assert baseline.user_attrs["baseline"] and baseline.params == {} and "fixed_params" not in baseline.system_attrs
    assert enqueued.user_attrs["proposed_by"] == "enqueued" and enqueued.params["mkldnn"] == "on"
    assert enqueued.datetime_start > baseline.datetime_start  # run after the baseline, as its speedup needs


def test_the_baseline_takes_the_retry_of_a_dead_workers_baseline_and_nothing_else(tmp_path: Path,
                                                                                   here: Machine) -> None:
    opened = opening.open_search(request(tmp_path, 3, space=DEFAULT), here)
    dead = fleet.claim(opened.worker())
    assert isinstance(dead, fleet.Claimed) and dead.proposal == "baseline"
    opened.study.enqueue_trial({"mkldnn": "on"})  # a user's, waiting before the retry
    assert holders._fail_stale(opened.study, opened.study._storage.get_trial(dead.trial._trial_id), "killed")
    again = fleet.claim(opened.worker())
    assert isinstance(again, fleet.Claimed) and again.proposal == "baseline"
    retried = opened.study._storage.get_trial(again.trial._trial_id)
    assert retried.user_attrs["retry_of"] == dead.trial.number and retried.params == {}
    [user] = opened.study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert user.system_attrs["fixed_params"] == {"mkldnn": "on"}


def test_every_study_records_what_its_searches_cost(tmp_path: Path, here: Machine) -> None:
    """No extra replicate (max_extra=0): the fake windows' spreads differ by hundredths of a percent,
    and this host's floor, learned from them, takes one a hair wider for a wide one."""
    planned = ReplicatePolicy(max_extra=0)
    opened, _ = run(tmp_path, here, 3, space=SPACE, runner=ok_runner, replicates=planned)
    first = opened.study.user_attrs["accounting"]
    assert first["trials"] == 3 and first["distinct_configurations"] == 3 and first["sessions"] == 1
    assert first["timed_s"] == pytest.approx(3 * 3 * 1.0)  # 3 trials x 3 replicates x a 1 s window
    assert first["efficiency"] == pytest.approx(first["timed_s"] / first["wall_s"], rel=0.05)
    assert first["trials_per_hour"] == pytest.approx(3 / first["wall_s"] * 3600, rel=0.05)
    again, _ = run(tmp_path, here, 4, space=SPACE, runner=ok_runner, replicates=planned)
    second = again.study.user_attrs["accounting"]
    assert second["sessions"] == 2 and second["trials"] == 4 and second["wall_s"] >= first["wall_s"]
    assert second["timed_s"] == pytest.approx(4 * 3 * 1.0)
    idle, _ = run(tmp_path, here, 4, space=SPACE, runner=ok_runner, replicates=planned)  # nothing to add
    assert idle.study.user_attrs["accounting"] == second


def test_a_retried_ask_does_not_enqueue_its_proposal_twice(tmp_path: Path, here: Machine) -> None:
    opened, _ = run(tmp_path, here, 1, space=SPACE, runner=ok_runner)
    assert opened.proposer is not None
    proposal = opened.proposer.next(opened.study, opened.study.get_trials(), set())
    assert proposal is not None
    opened.study.enqueue_trial(proposal.params)  # as if the database locked right after enqueueing
    trial = fleet.ask(opened.worker(), proposal)
    assert trial.params == {} and opened.study._storage.get_trial(trial._trial_id).system_attrs[
        "fixed_params"] == proposal.params
    assert opened.study.get_trials(states=(optuna.trial.TrialState.WAITING,)) == []


def test_the_space_says_what_it_lacks_and_the_params_that_sample_a_config() -> None:
    small = space_fit.adapt(space.load(SPACE), 8, {})
    assert small.lacks(Config.from_mapping({"mkldnn": True, "allocator": "jemalloc"})) == ""
    assert small.lacks(Config.from_mapping({"allocator": "tcmalloc"})) == "allocator=tcmalloc"
    assert small.lacks(Config.from_mapping({"backend": "inductor"})) == "backend=inductor"
    config = Config.from_mapping({"mkldnn": False, "omp_runtime": "intel", "allocator": "default"})
    assert small.params(config) == {"mkldnn": "off", "omp_runtime": "intel", "allocator": "default"}


def test_warm_or_fresh_replicates_are_a_recorded_setting_a_resume_must_keep(tmp_path: Path, here: Machine) -> None:
    from autotune.measure.replicates import ReplicatePolicy
    from autotune.study.storage import StudyError

    run(tmp_path, here, 2, space=SPACE, runner=ok_runner, replicates=ReplicatePolicy(in_process=True))
    with pytest.raises(StudyError, match=r"^study 'resnet18-bs1-latency' was measured with warm_replicates=True, "
                                         r"not False; use another --study name or the same "
                                         r"--warm-replicates/--fresh-replicates$"):
        opening.open_search(request(tmp_path, 3, space=SPACE, replicates=ReplicatePolicy(in_process=False)), here)


def test_the_winner_is_compared_with_the_best_recipe(tmp_path: Path, here: Machine) -> None:
    from autotune.deploy import export

    opened, _ = run(tmp_path, here, 7, space=DEFAULT, runner=ok_runner)
    study = opened.study
    recipe = references.best_recipe(study, "speedup_latency")
    assert recipe is not None and recipe.user_attrs["recipe"] == "seed"  # sets the most knobs: fastest here
    other = next(t for t in study.get_trials() if t.number > 0 and not t.user_attrs.get("recipe"))
    ratio = other.user_attrs["speedup_latency"] / recipe.user_attrs["speedup_latency"]
    assert export.versus_recipes(study, other) == (
        f"best expert recipe: trial {recipe.number} (seed), latency {recipe.user_attrs['speedup_latency']:.2f}x; "
        f"trial {other.number} is {ratio:.2f}x that (search measurements; the confirmation tests the winner "
        f"against this recipe in paired rounds)")
    assert export.versus_recipes(study, recipe).startswith("this is the best expert recipe the study ran (seed, ")
    assert f"# {export.versus_recipes(study, other)}" in export.render(study, other)


class FinishesWhileRead:
    """The study as one worker sees it while another's trial `number` finishes: right after the
    `after`-th read of the trials (every read position is tried by the test)."""

    def __init__(self, study: optuna.Study, number: int, after: int) -> None:
        self._study, self._number, self._reads_left = study, number, after

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def get_trials(self, *args: Any, **kwargs: Any) -> list[optuna.trial.FrozenTrial]:
        trials = self._study.get_trials(*args, **kwargs)
        self._reads_left -= 1
        if self._reads_left == 0:
            self._study.tell(self._number, 50.0)
        return trials


def test_a_configuration_that_finishes_while_the_next_is_chosen_is_not_proposed_again(
        tmp_path: Path, here: Machine) -> None:
    """Running, it is in flight; finished, it is measured: read in two snapshots, a trial that
    finished between them was neither, and another worker measured it again (a fleet race)."""
    for after in range(1, 10):
        run(tmp_path / str(after), here, 1, space=DEFAULT, runner=ok_runner)  # the baseline
        opened = opening.open_search(request(tmp_path / str(after), 5, space=DEFAULT), here)
        claimed = fleet.claim(opened.worker())
        assert isinstance(claimed, fleet.Claimed) and isinstance(claimed.proposal, proposals.Proposal)
        assert claimed.proposal.recipe == "seed"
        watched = dataclasses.replace(opened.worker(), study=FinishesWhileRead(opened.study, claimed.trial.number,
                                                                                after))
        second = fleet.claim(watched)
        assert isinstance(second, fleet.Claimed) and isinstance(second.proposal, proposals.Proposal), after
        assert second.proposal.recipe == "pytorch-launcher", after


def test_a_trial_that_finishes_while_trials_are_counted_counts_once(tmp_path: Path, here: Machine) -> None:
    """On a server, finished and other workers' running trials make --trials: counted from two reads,
    a trial finishing between them counted twice (or in neither), and a worker stopped with a trial
    of --trials left to run."""
    for after in range(1, 4):
        run(tmp_path / str(after), here, 1, space=DEFAULT, runner=ok_runner)
        opened = opening.open_search(request(tmp_path / str(after), 3, space=DEFAULT), here)
        claimed = fleet.claim(opened.worker())
        assert isinstance(claimed, fleet.Claimed)
        watched = dataclasses.replace(opened.worker(), storage="postgresql://fleet/study",
                                      study=FinishesWhileRead(opened.study, claimed.trial.number, after))
        assert isinstance(fleet.claim(watched), fleet.Claimed), after  # the baseline and the seed recipe: 2 of 3


def test_a_claim_reads_the_study_once_and_its_ask_once_more(tmp_path: Path, here: Machine,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read fetches every unfinished trial from the server again: in a large fleet that was
    most of the time a claim holds the study's lock (docs/fleets.md, "Scaling"). One read serves every
    choice (stale trials, --trials, baseline, enqueued, proposal, the sampler's copy); the ask
    reads what waits again, since a retry after a lock must see what it enqueued."""
    run(tmp_path, here, 1, space=DEFAULT, runner=ok_runner)  # the baseline
    opened = opening.open_search(request(tmp_path, 5, space=DEFAULT), here)
    backend = opened.study._storage
    reads: list[tuple[Any, ...]] = []
    read = backend.get_all_trials

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs.get("states") or args[2:3])
        return read(*args, **kwargs)

    monkeypatch.setattr(backend, "get_all_trials", counted)
    claimed = fleet.claim(opened.worker())
    assert isinstance(claimed, fleet.Claimed) and isinstance(claimed.proposal, proposals.Proposal)
    assert len(reads) == 3, reads  # the claim's, the ask's check of what waits, and Optuna's ask taking it


def test_a_recipe_as_run_sets_every_knob_of_the_space_at_what_runs() -> None:
    bucketed = space_fit.adapt(space.load(DEFAULT), 2, {"bf16": True, "int8": True})
    adapted = space_fit.for_buckets(bucketed, bucketed=False)  # an image model's space: no `shapes`
    baseline = adapted.as_run(Config())
    assert baseline is not None and baseline.describe() == (
        "backend=eager mkldnn=off memory_format=contiguous precision=fp32 omp_threads=2 omp_runtime=gnu "
        "omp_proc_bind=false allocator=default instances=1 dataloader_workers=0")
    compiled = adapted.as_run(Config.from_mapping(COMPILE_INT8))
    assert compiled is not None and compiled.describe() == (
        "backend=inductor memory_format=channels_last precision=int8 int8_fallback=0 omp_threads=2 omp_runtime=gnu "
        "omp_proc_bind=false allocator=default instances=1 dataloader_workers=0")  # every layer int8, as it ran
    with_buckets = bucketed.as_run(Config.from_mapping(COMPILE_INT8))  # --seq-lens: one model per length
    assert with_buckets is not None and with_buckets.get("shapes") == "buckets"
    two = adapted.as_run(Config.from_mapping({"instances": 2}))
    assert two is not None and two.get("omp_threads") == 1  # all the cores an instance has
    small = space_fit.adapt(space.load(SPACE), 8, {})
    assert all(small.as_run(c) == c for c in every(small))  # a sampled one: as it was
    # what runs unset is not offered: the space says nothing of where the configuration lies
    assert space_fit.pin(small, Config.from_mapping({"allocator": "jemalloc"}), {}).as_run(Config()) is None
    assert adapted.as_run(Config.from_mapping({"omp_runtime": "intel"})) is None  # KMP_AFFINITY unset: not offered


def _told(study: optuna.Study, adapted: space.SearchSpace, config: Config, value: float, recipe: bool) -> None:
    study.enqueue_trial(adapted.params(config))
    trial = study.ask()
    adapted.sample(trial, only=config if recipe else None)
    if recipe:
        study.tell(trial, value)
    else:  # given up after its first window, as most sampled trials of a search are
        trial.report(value, 0)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)


def test_the_sampler_sees_the_recipes_threads_and_follows_the_best_ones() -> None:
    """The search at eb0ec4e (benchmarks/RESULTS.md, "Which sampler"): the recipes that won set no threads; TPE saw
    them without those knobs, its best trials said nothing about threads, and the trials it had
    seen lose (the seed's, the launcher's: 2 threads) pushed it to one-thread instances: 34 of 50."""
    adapted = space_fit.adapt(space.load(DEFAULT), 2, {"bf16": True, "int8": True})
    adapted = space_fit.for_probe(adapted, {}, space_fit.task_refusals(False))  # as a search of a CNN sees it
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    _told(study, adapted, Config(), 117.0, recipe=True)
    for recipe, value in zip(recipes.recipes(lscpu("amd_1s_smt"), "latency"),
                             (111.0, 109.0, 87.6, 53.8, 27.7), strict=True):
        on_two_cores = Config.from_mapping(recipe.config.as_dict() | (
            {"omp_threads": 2} if recipe.config.is_set("omp_threads") else {}))
        assert adapted.as_run(on_two_cores) is not None
        _told(study, adapted, on_two_cores, value, recipe=True)
    draw = random.Random(2)
    for _ in range(8):  # one-thread instances, worse than the compiled recipes
        config = adapted.sample(proposals._RandomSuggester(draw))
        config = Config.from_mapping(config.as_dict() | {"instances": 2, "omp_threads": 1})
        _told(study, adapted, config, 150.0, recipe=False)
    trials = study.get_trials()
    threads = []
    for seed in range(20):
        proposer = proposals.Proposer(adapted, (1,), opening.sampler, seed=seed)
        proposal = proposer.next(study, trials, set())
        assert proposal is not None
        threads.append(proposal.config.get("omp_threads"))
    assert threads.count(2) >= 14, threads  # 19 here; the recipes seen with their own knobs only: 0


def test_a_configuration_that_launches_what_the_baseline_does_is_the_baseline(tmp_path: Path, here: Machine) -> None:
    """`allocator=default` alone launches the baseline's very command and environment: it is never
    measured as a configuration of its own (once it read 1.55x 'faster' than the baseline), so a
    space of allocator default or jemalloc holds two configurations, not three."""
    only = tmp_path / "allocator.yaml"
    only.write_text("knobs:\n  allocator:\n    choices: [default, jemalloc]\n")
    opened, stopped = run(tmp_path, here, 5, space=only, runner=ok_runner)
    configs = [t.user_attrs["config"] for t in opened.study.get_trials()]
    assert configs == ["defaults", "allocator=jemalloc"], configs
    assert "every configuration" in stopped and records.distinct_configs(opened.study) == 2


PRECISION_LATENCY = {"fp32": 0.9, "bf16": 0.5, "int8": 0.4, "int8_dynamic": 0.45, "int8_weight_only": 0.95}


def test_every_precision_and_layout_compiles_at_the_best_trials_threads(tmp_path: Path, here: Machine,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Coverage (compile_skip.uncovered): whatever the sampler draws, each precision x layout the space
    offers runs with inductor at the thread count of the best trial, after the recipes."""

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        config = plan.config
        latency = 100.0 * (PRECISION_LATENCY[str(config.get("precision") or "fp32")]
                           if config.get("backend") == "inductor" else 1.0)
        return fake_result([latency * (1 + abs(int(config.get("omp_threads") or 8) - 6) * 0.05)] * 30)

    opened = opening.open_search(request(tmp_path, 16, space=DEFAULT, replicates=ReplicatePolicy(in_process=True),
                                         seed=1), here)
    loop.run_search(opened, here, lambda event: None, runner=runner)
    trials = opened.study.get_trials()
    best = min((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: float(t.values[0]))
    threads = compile_skip.compile_key(opened.space, space.config_of_params(best.params))
    assert threads is not None
    ran = {compile_skip.compile_key(opened.space, space.config_of_params(t.params)) for t in trials}
    offered = opened.space.get("precision").choices  # type: ignore[union-attr]
    assert "int8_dynamic" not in offered  # a CNN: its work is not in Linear layers (space_fit.for_model)
    assert {(p, m, threads[2], "buckets") for p in offered for m in ("contiguous", "channels_last")} <= ran
    covering = [t for t in trials if str(t.user_attrs.get("proposed_by", "")).startswith("coverage")]
    assert covering and min(t.number for t in covering) > max(t.number for t in trials if t.user_attrs.get("recipe"))


def test_peer_recipes_run_first_where_their_runtime_is_installed_and_a_missing_one_is_a_note(
        tmp_path: Path, here: Machine, peer_runtimes: dict[str, bool]) -> None:
    peer_runtimes["onnxruntime"] = True
    opened = opening.open_search(request(tmp_path, 2, space=DEFAULT), here)
    assert opened.proposer is not None
    assert [r.name for r in opened.proposer.recipes][:2] == ["ONNX Runtime defaults", "seed"]
    assert any(n.startswith("backend=openvino dropped: OpenVINO is not installed; install it with pip install "
                            "'autotune[openvino]'") for n in opened.notes)
    backend = opened.space.get("backend")
    assert backend is not None and backend.choices == ("eager", "torchscript", "inductor", "onnxruntime")
