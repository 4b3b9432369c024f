"""The measurement protocol, deterministic: replicates of fake runs, more of them while the spread
is too wide, a failed one ending the measurement, a warmed process cut into windows, and what flags
a measurement noisy."""

from __future__ import annotations

from autotune.config.knobs import Config
from autotune.measure import replicates
from autotune.measure.plan import BenchSpec, InstancePlan, LaunchPlan, worker_command
from autotune.measure.results import RunResult
from tests.support.studies import fake_result, run_with

PLAN = LaunchPlan(Config(), BenchSpec("fake", (1,)), "none", ())


def runs_of(*sample_lists: list[float]) -> replicates.PlanRunner:
    queue = [fake_result(s) for s in sample_lists]

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        return queue.pop(0)

    return runner


def test_a_quiet_configuration_takes_the_planned_replicates() -> None:
    quiet = [20.0, 20.1, 20.2, 19.9, 20.0]
    measured = replicates.measure_replicates(PLAN, replicates.ReplicatePolicy(replicates=3),
                                             runs_of(quiet, quiet, quiet, quiet))
    assert len(measured.runs) == 3
    summary = measured.summary()
    assert summary["noisy"] is False and summary["replicates"] == 3 and summary["samples"] == 15
    assert summary["latency_ci_ms"][0] <= summary["latency_p50_ms"] <= summary["latency_ci_ms"][1]


def test_before_a_floor_is_known_a_wide_configuration_takes_extra_replicates_and_is_not_flagged() -> None:
    calm = [20.0, 20.1, 20.2, 19.9, 20.0]
    spell = [60.0, 80.0, 70.0, 90.0, 75.0]
    measured = replicates.measure_replicates(PLAN, replicates.ReplicatePolicy(replicates=2, max_extra=2),
                                runs_of(calm, spell, spell, calm, calm))
    assert len(measured.runs) == 4  # 2 planned + 2 extra while IQR/median stayed above 25%
    assert measured.summary()["noisy"] is False  # no floor: a spread alone says nothing of a disturbance
    off = [27.0] * 5
    settled = replicates.measure_replicates(PLAN, replicates.ReplicatePolicy(replicates=3, max_extra=2),
                               runs_of(calm, calm, off, calm, calm))
    assert len(settled.runs) == 4  # one extra replicate brought the spread under 25%


def test_a_window_wider_than_this_hosts_floor_is_flagged_and_takes_an_extra_replicate() -> None:
    calm = [20.0, 20.1, 20.2, 19.9, 20.0]
    spell = [60.0, 80.0, 70.0, 90.0, 75.0]  # its own IQR/median: 10 / 75 = 13%
    measured = replicates.measure_replicates(PLAN, replicates.ReplicatePolicy(replicates=2, max_extra=1),
                                             runs_of(calm, spell, calm), floor=0.05)
    assert len(measured.runs) == 3  # the one extra the policy allows
    summary = measured.summary()
    assert summary["noisy"] is True and summary["disturbed"] is False and summary["spread_floor"] == 0.05
    assert summary["noisy_reason"] == "IQR/median 13% > this host's floor 5%"
    wide_here = replicates.measure_replicates(PLAN, replicates.ReplicatePolicy(replicates=2, max_extra=1),
                                              runs_of(calm, spell, calm), floor=0.20)
    assert len(wide_here.runs) == 2 and not wide_here.noisy  # this host's windows spread that much anyway


def test_two_instances_are_two_distributions_not_one_wide_one() -> None:
    """Two one-thread instances at 20 and 30 ms: the pooled samples spread 40%, each instance none."""
    from dataclasses import replace

    one, two = fake_result([20.0, 20.1, 19.9, 20.0]), fake_result([30.0, 30.1, 29.9, 30.0])
    both = RunResult(True, "", (one.instances[0], replace(two.instances[0], index=1)), 1.0)
    measured = replicates.Measurement((both,), floor=0.05)
    assert measured.spread > 0.3 and measured.window_spread < 0.01 and not measured.noisy
    assert replicates.undisturbed_spreads(measured) == [measured.window_spread]


def test_a_disturbed_window_takes_no_extra_replicate_and_joins_no_floor() -> None:
    calm = [20.0, 20.1, 20.2, 19.9, 20.0]
    spell = run_with([60.0, 80.0, 70.0, 90.0, 75.0], 0.6)
    queue = [fake_result(calm), spell]
    measured = replicates.measure_replicates(PLAN, replicates.ReplicatePolicy(replicates=2, max_extra=2),
                                             lambda plan, timeout: queue.pop(0), floor=0.05)
    assert len(measured.runs) == 2 and measured.disturbed
    assert replicates.undisturbed_spreads(measured) == [replicates.run_spread(measured.runs[0])]  # the calm one


def test_hypervisor_steal_flags_the_measurement_disturbed() -> None:
    from dataclasses import replace

    stolen = replace(run_with([10.0] * 5, 0.0), noise={"other_cpu_share": 0.0, "steal_share": 0.4})
    measured = replicates.Measurement((stolen,))
    assert measured.disturbed and measured.summary()["steal_share_max"] == 0.4
    assert measured.noisy_reason == "the hypervisor took 40% of the CPUs (steal) > 25%"


def test_a_warm_processes_setup_counts_once_however_many_windows_it_is_cut_into() -> None:
    run = fake_result([20.0] * 30)
    run.instances[0].metrics["setup"] = {"build_s": 2.5, "compile_s": 10.0, "warmup_s": 1.5,  # type: ignore[index]
                                         "weight_bytes": 1000}
    measured = replicates.Measurement(run.parts(3))
    assert len(measured.runs) == 3
    assert measured.setup_seconds() == {"build_s": 12.5, "warmup_s": 1.5}
    fresh = fake_result([20.0] * 5)
    fresh.instances[0].metrics["setup"] = {"build_s": 10.0, "warmup_s": 1.0}  # type: ignore[index]
    assert replicates.Measurement((*run.parts(3), fresh)).setup_seconds() == {"build_s": 22.5, "warmup_s": 2.5}


def test_a_failed_replicate_stops_the_measurement() -> None:
    from autotune.measure.results import InstanceResult

    crash = RunResult(False, "instance 0: crashed with SIGSEGV", (InstanceResult(0, False, "crashed", -11, ""),), 1)
    calm = [20.0] * 5

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        return crash if runner.calls else fake_result(calm)  # type: ignore[attr-defined]

    runner.calls = 0  # type: ignore[attr-defined]

    def counted(plan: LaunchPlan, timeout_s: float) -> RunResult:
        result = runner(plan, timeout_s)
        runner.calls += 1  # type: ignore[attr-defined]
        return result

    measured = replicates.measure_replicates(PLAN, replicates.ReplicatePolicy(replicates=3), counted)
    assert not measured.ok and measured.reason == "instance 0: crashed with SIGSEGV"
    assert len(measured.runs) == 2


def test_in_process_replicates_are_one_stretched_process_cut_into_windows() -> None:
    seen: list[LaunchPlan] = []
    told: list[tuple[int, bool]] = []

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        seen.append(plan)
        return fake_result([20.0] * 30)

    def after_each(index: int, run: RunResult, more: bool) -> bool:
        told.append((index, more))
        return True  # would prune: but the windows already ran

    bench = BenchSpec("fake", (1,))
    instance = InstancePlan(0, (0,), None, {}, worker_command("python", bench, Config()))
    one = LaunchPlan(Config(), bench, "none", (instance,))
    policy = replicates.ReplicatePolicy(replicates=3, max_extra=0, in_process=True)
    measured = replicates.measure_replicates(one, policy, runner, after_each)
    assert len(seen) == 1 and len(measured.runs) == 3 and not measured.stopped_early
    [plan] = seen
    base = PLAN.bench.measure
    assert plan.bench.measure.duration_s == 3 * base.duration_s
    assert plan.bench.measure.min_iterations == 3 * base.min_iterations
    command = plan.instances[0].command
    assert command[command.index("--duration") + 1] == str(3 * base.duration_s)
    assert command[command.index("--min-iterations") + 1] == str(3 * base.min_iterations)
    assert told == [(0, False), (1, False), (2, False)]


def test_other_processes_busy_on_the_cpus_flag_the_measurement_noisy() -> None:
    steady = [10.0, 10.1, 10.0, 9.9, 10.0]
    quiet = replicates.Measurement((run_with(steady, 0.1), run_with(steady, 0.2)))
    assert not quiet.noisy and quiet.summary()["noisy_reason"] == ""
    busy = replicates.Measurement((run_with(steady, 0.1), run_with(steady, 0.88)))
    summary = busy.summary()
    assert summary["noisy"] is True and summary["other_cpu_share_max"] == 0.88
    assert summary["noisy_reason"] == "other processes used 88% of the CPUs > 25%"


def test_a_child_starved_of_cpu_time_flags_the_measurement_noisy() -> None:
    """run_with's child used 1.0 CPU-s in a 2 s window on one thread: 50%, just enough; given two
    threads (the runtime report's torch_threads) it got 25% of their time, a neighbour's doing."""
    steady = [10.0, 10.1, 10.0, 9.9, 10.0]
    alone = replicates.Measurement((run_with(steady, 0.0),))
    assert alone.own_cpu_share == 0.5 and not alone.noisy
    starved = run_with(steady, 0.0)
    starved.instances[0].metrics["runtime"] = {"torch_threads": 2}  # type: ignore[index]
    measured = replicates.Measurement((run_with(steady, 0.0), starved))
    assert measured.own_cpu_share == 0.25
    assert measured.noisy_reason == "the child got 25% of its threads' CPU time < 50%"


def test_both_reasons_are_recorded() -> None:
    spread = replicates.Measurement((run_with([10.0, 20.0, 30.0, 40.0], 0.9),), floor=0.10)
    assert spread.noisy_reason == "IQR/median 60% > this host's floor 10%; other processes used 90% of the CPUs > 25%"
