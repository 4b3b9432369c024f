"""Giving up on a hopeless configuration: a trial measured in one warmed process stops after its
k-th window (but the last) when the median so far is more than thresholds.GIVE_UP[k-1] times worse
than the best trial."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.base import thresholds
from autotune.child import worker
from autotune.child.settings import MeasureSettings
from autotune.config.knobs import Config
from autotune.host.machine import Machine, this_machine
from autotune.measure import replicates, requests
from autotune.measure.plan import BenchSpec, InstancePlan, LaunchPlan, worker_command
from autotune.measure.replicates import ReplicatePolicy
from autotune.measure.results import RunResult
from autotune.measure.runner import run_plan
from autotune.search import loop, opening, pruning
from tests.fixtures.models import tinynets
from tests.support.studies import fake_result, request

WARM = ReplicatePolicy(replicates=3, max_extra=0, in_process=True)


def plan_of(instances: int = 1, batch: int = 1) -> LaunchPlan:
    bench = BenchSpec("fake", (1,), batch_size=batch, measure=MeasureSettings(duration_s=2.0, min_iterations=10))
    return LaunchPlan(Config(), bench, "none", tuple(
        InstancePlan(i, (i,), None, {}, worker_command("python", bench, Config())) for i in range(instances)))


def flag(command: tuple[str, ...], name: str) -> str:
    return command[command.index(name) + 1]


def gave_up(latency_ms: float, limit_ms: float, windows: int = 1) -> RunResult:
    result = fake_result([latency_ms] * 10 * windows)
    result.instances[0].metrics.update(gave_up_above_ms=limit_ms, gave_up_windows=windows)  # type: ignore[attr-defined]
    return result


def test_the_warmed_process_carries_a_limit_for_each_window_but_its_last() -> None:
    seen: list[LaunchPlan] = []

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        seen.append(plan)
        return fake_result([20.0] * 30)

    measured = replicates.measure_replicates(plan_of(), WARM, runner, give_up_above_ms=(123.5, 99.25, 50.0))
    assert len(measured.runs) == 3 and not measured.stopped_early  # never crossed: three windows as before
    command = seen[0].instances[0].command
    assert flag(command, "--give-up-above-ms") == "123.5,99.25"  # a stop after the third would save nothing
    assert flag(command, "--give-up-after") == "2.0" and flag(command, "--give-up-iterations") == "10"
    assert flag(command, "--duration") == "6.0" and flag(command, "--min-iterations") == "30"
    two = ReplicatePolicy(replicates=2, max_extra=0, in_process=True)
    replicates.measure_replicates(plan_of(), two, runner, give_up_above_ms=(123.5, 99.25))
    assert flag(seen[1].instances[0].command, "--give-up-above-ms") == "123.5"
    replicates.measure_replicates(plan_of(), WARM, runner)
    assert "--give-up-above-ms" not in seen[2].instances[0].command  # no limit, no flag


@pytest.mark.parametrize("windows", [1, 2])
def test_a_process_that_gave_up_is_one_run_and_a_stopped_trial(windows: int) -> None:
    told: list[tuple[int, bool]] = []

    def after_each(index: int, run: RunResult, more: bool) -> bool:
        told.append((index, more))
        return False

    run = gave_up(500.0, 250.0, windows)
    measured = replicates.measure_replicates(plan_of(), WARM, lambda plan, t: run, after_each,
                                             give_up_above_ms=(250.0, 190.0))
    assert measured.ok and measured.stopped_early and len(measured.runs) == 1
    assert measured.runs[0].gave_up and measured.latency_p50_ms == 500.0
    assert measured.runs[0].parts(3) == measured.runs  # not cut into three windows of equal time
    assert told == [(0, False)]  # its value reported, as a pruned trial's


def test_one_instance_that_gave_up_is_enough_and_the_reason_names_it() -> None:
    """Instances check alone: one above its limit stops, and the run's windows cannot be cut any
    more, so the run gave up; the reason says which instance crossed the limit, since the run's own
    value (the instances' median) may be below it."""
    kept, stopped = fake_result([300.0] * 30).instances[0], gave_up(700.0, 680.0).instances[0]
    run = RunResult(True, "", (kept, replace(stopped, index=1)), 1.0)
    assert run.gave_up and run.parts(3) == (run,)
    assert run.windows(3) == 3 and gave_up(700.0, 680.0, windows=2).windows(3) == 2  # the longest instance's
    limit = pruning.GiveUp((680.0, 510.0), 4, 340.0, "latency_p50_ms")
    assert limit.reason(run) == ("gave up after its first window: instance 1's median latency 700.00 ms is more "
                                 "than 2x trial 4's 340.00 ms")
    later = RunResult(True, "", (kept, replace(gave_up(600.0, 510.0, windows=2).instances[0], index=1)), 1.0)
    assert limit.reason(later) == ("gave up after its second window: instance 1's median latency 600.00 ms is "
                                   "more than 1.5x trial 4's 340.00 ms")
    by_items = pruning.GiveUp((320.0, 240.0), 2, 100.0, "throughput_ips")
    assert by_items.reason(gave_up(400.0, 320.0)) == (
        "gave up after its first window: instance 0's median latency 400.00 ms is above 320.00 ms, too slow for "
        "the instances together to reach 1/2 of trial 2's 100.00 items/s")
    assert by_items.reason(gave_up(300.0, 240.0, windows=2)) == (
        "gave up after its second window: instance 0's median latency 300.00 ms is above 240.00 ms, too slow for "
        "the instances together to reach 1/1.5 of trial 2's 100.00 items/s")


def study_with_best(direction: str, value: float, number_of_trials: int = 1) -> optuna.Study:
    study = optuna.create_study(direction=direction)
    for n in range(number_of_trials):
        study.add_trial(optuna.trial.create_trial(value=value * (1 + n), state=TrialState.COMPLETE))
    return study


def test_the_limit_is_the_best_trials_value_times_the_margin() -> None:
    limit = pruning.give_up(study_with_best("minimize", 40.0, 3), "latency", plan_of())
    assert limit is not None and limit.above_ms == pytest.approx((80.0, 60.0)) and limit.best == 0
    # throughput: 2 instances of batch 8 summing to 1/2 of 100 items/s take 320 ms each per batch, to 1/1.5 240 ms
    limit = pruning.give_up(study_with_best("maximize", 100.0), "throughput", plan_of(instances=2, batch=8))
    assert limit is not None
    assert limit.above_ms == pytest.approx((320.0, 240.0))
    assert pruning.give_up(optuna.create_study(), "latency", plan_of()) is None  # nothing to compare with yet
    two = optuna.create_study(directions=["minimize", "maximize"])
    assert pruning.give_up(two, "both", plan_of()) is None


def honest_runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
    """What the real child does with its limits: 100 ms at defaults, 20 less with jemalloc, 60 more
    with Intel OpenMP, 300 with mkldnn; a process whose median after its k-th window is above the
    k-th limit stops there."""
    config = plan.config
    latency = 300.0 if config.get("mkldnn") else (
        100.0 - 20 * (config.get("allocator") == "jemalloc") + 60 * (config.get("omp_runtime") == "intel"))
    command = plan.instances[0].command
    given = flag(command, "--give-up-above-ms") if "--give-up-above-ms" in command else ""
    limits = [float(v) for v in given.split(",") if v]
    for windows, limit in enumerate(limits, start=1):
        if latency > limit:
            return gave_up(latency, limit, windows)
    return fake_result([latency] * 30)


def test_a_search_gives_up_on_what_is_far_worse_than_its_best(tmp_path: Path, here: Machine) -> None:
    """Each trial stops where the rule says, from the best before it: mkldnn (300 ms) after its
    first window, Intel OpenMP with the default allocator (160 ms: 1.6x 100, 2x 80) after its second."""
    opened = opening.open_search(request(tmp_path, 8, replicates=WARM), here)
    loop.run_search(opened, here, lambda event: None, runner=honest_runner)
    trials = opened.study.get_trials()
    assert {t.state for t in trials} == {TrialState.COMPLETE, TrialState.PRUNED}
    windows_seen = set()
    for t in trials:
        if "duplicate_of" in t.user_attrs:
            continue
        latency = t.intermediate_values[0]
        best = min((b.value for b in trials if b.state == TrialState.COMPLETE and b.number < t.number), default=None)
        margins = enumerate(thresholds.GIVE_UP, start=1)
        windows = next((k for k, margin in margins if best and latency > margin * best), 0)
        assert (t.state == TrialState.PRUNED) == (windows > 0), t.user_attrs["config"]
        if windows:
            windows_seen.add(windows)
            best_number = next(b.number for b in trials if b.value == best)
            assert t.user_attrs["prune_reason"] == (
                f"gave up after its {('first', 'second')[windows - 1]} window: instance 0's median latency "
                f"{latency:.2f} ms is more than {thresholds.GIVE_UP[windows - 1]:g}x trial {best_number}'s "
                f"{best:.2f} ms")
            assert t.user_attrs["replicates"] == 1 and t.intermediate_values == {0: latency}
    assert windows_seen == {1, 2}


def test_fresh_replicates_keep_their_own_pruning_and_get_no_limit(tmp_path: Path, here: Machine) -> None:
    commands: list[tuple[str, ...]] = []

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        commands.append(plan.instances[0].command)
        return honest_runner(plan, timeout_s)

    opened = opening.open_search(request(tmp_path, 6, replicates=ReplicatePolicy(in_process=False)), here)
    loop.run_search(opened, here, lambda event: None, runner=runner)
    assert commands and not any("--give-up-above-ms" in c for c in commands)


def run_child(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, limits_ms: str) -> dict[str, object]:
    monkeypatch.setattr(worker, "die_with_parent", lambda pid: None)  # the test process is no benchmark child
    monkeypatch.syspath_prepend(str(Path(tinynets.__file__).parent))
    result = tmp_path / "result.json"
    code = worker.main(["--model", "tinynets:cnn", "--item-shape", "3x32x32", "--cache-dir", str(tmp_path),
                        "--warmup", "1", "--warmup-time", "0", "--duration", "1.5", "--min-iterations", "30",
                        "--give-up-above-ms", limits_ms, "--give-up-after", "0.3", "--give-up-iterations", "10",
                        "--result", str(result)])
    assert code == 0
    data: dict[str, object] = json.loads(result.read_text())
    return data


def test_the_child_stops_at_a_check_only_when_the_median_is_above_its_limit(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    stopped = run_child(monkeypatch, tmp_path, "1e-6")
    latencies = stopped["latencies_ms"]
    assert isinstance(latencies, list) and len(latencies) >= 10
    assert stopped["gave_up_above_ms"] == 1e-6 and stopped["gave_up_windows"] == 1
    assert 0.3 <= float(stopped["window_s"]) < 1.5  # type: ignore[arg-type]
    later = run_child(monkeypatch, tmp_path, "1e6,1e-6")  # the first check passes, the second stops
    assert later["gave_up_above_ms"] == 1e-6 and later["gave_up_windows"] == 2
    assert len(later["latencies_ms"]) >= 20 and 0.6 <= float(later["window_s"]) < 1.5  # type: ignore[arg-type]
    kept = run_child(monkeypatch, tmp_path, "1e6,1e6")
    assert "gave_up_above_ms" not in kept and float(kept["window_s"]) > 1.4  # type: ignore[arg-type]
    assert statistics.median(kept["latencies_ms"]) < 1e6  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["0", "-1", "nan", "1,0", "fast"])
def test_the_child_refuses_a_limit_that_is_not_positive_milliseconds(text: str) -> None:
    with pytest.raises(SystemExit) as exc:
        worker.parse_args(["--model", "m", "--result", "r.json", "--give-up-above-ms", text])
    assert exc.value.code == 2


@pytest.mark.e2e
def test_a_real_warmed_process_gives_up_at_its_second_check_and_the_parent_keeps_one_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags the parent adds are the ones the real child reads, through the real runner."""
    monkeypatch.chdir(Path(tinynets.__file__).parent)  # where tinynets:cnn imports from
    measure = MeasureSettings(duration_s=0.5, warmup=1, warmup_s=0.0, min_iterations=5)
    bench = requests.BenchRequest(model="tinynets:cnn", config=Config(), input_shape="3x32x32", cache_dir=tmp_path,
                                  measure=measure)
    plan = requests.make_plan(bench, this_machine())
    measured = replicates.measure_replicates(plan, WARM, run_plan, give_up_above_ms=(1e6, 1e-6))
    assert measured.ok, measured.reason
    assert measured.stopped_early and len(measured.runs) == 1 and measured.runs[0].gave_up
    metrics = measured.runs[0].instances[0].metrics
    assert metrics["gave_up_windows"] == 2 and float(metrics["window_s"]) < 3 * 0.5
