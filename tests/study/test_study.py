"""The study layer with a fake runner: baseline first, what trials record, failures, resume."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

from autotune.base import processes
from autotune.base.errors import RunFailed
from autotune.child.settings import MeasureSettings
from autotune.cli import live
from autotune.config import space
from autotune.config.space import SpaceError
from autotune.host.libs import Libraries
from autotune.host.machine import Machine
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import Measurement, ReplicatePolicy
from autotune.measure.results import InstanceResult, RunResult
from autotune.search import loop, opening
from autotune.study import holders, records, storage
from tests.conftest import lscpu
from tests.support.studies import SPACE, fake_result, fake_runner, request, search


def abandon(study: optuna.Study) -> list[int]:
    """The stale trials failed now, from a fresh read of the study."""
    return holders.abandon_stale_trials(study, study.get_trials(deepcopy=False))


def test_baseline_is_trial_zero_and_every_trial_records_its_run(tmp_path: Path, here: Machine) -> None:
    result = search(tmp_path, here, trials=8)
    trials = result.get_trials()
    assert records.finished(result) == records.distinct_configs(result) == 8  # each crash's rerun not one more
    zero = trials[0]
    assert zero.user_attrs["baseline"] is True and zero.params == {} and zero.user_attrs["config"] == "defaults"
    assert zero.values == [100.0]
    assert zero.user_attrs["plan"]["instances"][0]["env"] == {}
    for t in trials:
        if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs:
            assert {"latency_p50_ms", "latency_p90_ms", "throughput_ips", "peak_rss_mb", "speedup_latency",
                    "speedup_throughput", "plan", "instances"} <= set(t.user_attrs)
            assert t.user_attrs["speedup_latency"] == pytest.approx(100.0 / t.values[0], rel=1e-3)
        if t.state == TrialState.FAIL:
            assert t.user_attrs["fail_reason"] == "instance 0: crashed with SIGSEGV"
            assert t.user_attrs["stderr_tail"] == "segfault in oneDNN\n"
    attrs = result.user_attrs
    assert attrs["model"] == "resnet18" and attrs["objective"] == "latency"
    assert attrs["host"]["physical_cores"] == 8 and attrs["space"]["knobs"]


def test_trials_n_measures_n_distinct_configurations_and_a_crashs_rerun_says_what_it_retries(
        tmp_path: Path, here: Machine) -> None:
    """--trials 3 once gave "3 trials, 2 distinct configurations": a crash (KILLED) is run once
    more, and that rerun took a trial of its own. Seeded: unseeded, a search may propose all four
    crashing configurations once each and reach its 8 trials with no rerun at all (CI drew one)."""
    opened = opening.open_search(request(tmp_path, 8, seed=0), here)
    lines: list[str] = []
    progress = live.SearchProgress("latency")
    loop.run_search(opened, here, lambda e: lines.append(progress._line(e)) if e.kind == "done" else None,
                    runner=fake_runner)
    trials = opened.study.get_trials()
    assert records.finished(opened.study) == records.distinct_configs(opened.study) == 8
    reruns = [t for t in trials if "retry_of" in t.user_attrs]
    assert reruns and len(trials) == 8 + len(reruns)
    for rerun in reruns:
        retried = trials[rerun.user_attrs["retry_of"]]
        assert records.fail_cause(retried) == records.KILLED and retried.user_attrs["config"] == rerun.user_attrs[
            "config"]
        assert f"(retry of trial {retried.number})" in lines[rerun.number]
    assert sum("retry of" in line for line in lines) == len(reruns)


def test_study_lives_in_sqlite_under_studies_named_after_the_request(tmp_path: Path, here: Machine) -> None:
    search(tmp_path, here, trials=2, objective="throughput", batch_size=4)
    assert (tmp_path / "studies" / "resnet18-bs4-throughput.db").is_file()


def test_rerun_resumes_and_trials_counts_the_total(tmp_path: Path, here: Machine) -> None:
    first = search(tmp_path, here, trials=3)
    numbers = [t.number for t in first.get_trials()]
    again = search(tmp_path, here, trials=3)
    assert [t.number for t in again.get_trials()] == numbers
    more = search(tmp_path, here, trials=5)
    assert records.finished(more) == records.distinct_configs(more) == 5
    assert sum(bool(t.user_attrs.get("baseline")) for t in more.get_trials()) == 1


def test_running_trials_are_told_apart_by_heartbeat_not_hostname(tmp_path: Path, here: Machine,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "HEARTBEAT_INTERVAL_S", 1)
    monkeypatch.setattr(storage, "GRACE_PERIOD_S", 2)
    opened = opening.open_search(request(tmp_path, 1, replicates=ReplicatePolicy(1, 0)), here)
    dead = storage.ask(opened.study)
    holders.claim_trial(dead, "")  # this host and a live pid (ours): neither tells whether it runs
    with storage.heartbeat(opened.study, dead):
        pass  # one beat, then its autotune was killed
    seen = []

    def slow(plan: LaunchPlan, timeout_s: float) -> RunResult:
        time.sleep(3.5)  # longer than the grace period: only the heartbeat keeps this trial alive
        seen.append(abandon(storage.load(opened.name, opened.storage)))
        return fake_runner(plan, timeout_s)

    loop.run_search(opened, here, lambda event: None, runner=slow)
    assert seen == [[dead.number]]
    trials = opened.study.get_trials()
    assert trials[dead.number].state == TrialState.FAIL
    assert trials[dead.number].user_attrs["fail_reason"] == (
        f"left running by an autotune process (pid {os.getpid()}) that was killed: no heartbeat for over 2s")
    assert trials[1].state == TrialState.COMPLETE and trials[1].user_attrs["baseline"]
    assert trials[2].state == TrialState.WAITING and trials[2].system_attrs["failed_trial"] == dead.number  # retried


def test_a_trial_whose_autotune_was_killed_before_its_first_beat_is_found_stale(
        tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claiming writes the first heartbeat: Optuna tells a stale trial only by its heartbeat, and a
    trial that never beat would stay RUNNING, counted as another worker's for good."""
    monkeypatch.setattr(storage, "GRACE_PERIOD_S", 1)
    opened = opening.open_search(request(tmp_path, 1), here)
    dead = storage.ask(opened.study)
    holders.claim_trial(dead, "")  # then killed, before its heartbeat thread started
    assert abandon(opened.study) == []
    time.sleep(2.2)  # Optuna's heartbeat times have whole seconds
    assert abandon(opened.study) == [dead.number]


def test_the_heartbeat_outlives_a_failed_beat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Optuna reports a failed commit as StorageInternalError; a beater that died of it would leave
    a live worker's trial to be failed, and measured again by another worker."""
    monkeypatch.setattr(storage, "HEARTBEAT_INTERVAL_S", 0.05)
    beats: list[int] = []

    class Flaky:
        def record_heartbeat(self, trial_id: int) -> None:
            beats.append(trial_id)
            if len(beats) == 1:
                raise optuna.exceptions.StorageInternalError("could not commit: server closed the connection")

    with storage.heartbeat(SimpleNamespace(_storage=Flaky()), SimpleNamespace(_trial_id=7)):  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while len(beats) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert beats[:3] == [7, 7, 7]


def test_a_trial_failed_by_another_autotune_while_measured_is_left_to_its_retry(tmp_path: Path,
                                                                                here: Machine) -> None:
    """A worker whose beats did not reach the database for the grace period finds its trial failed
    and retried by another: it says so and goes on (it stopped with an error, its measurement lost)."""
    opened = opening.open_search(request(tmp_path, 3, replicates=ReplicatePolicy(1, 0)), here)
    taken: list[int] = []

    def slow(plan: LaunchPlan, timeout_s: float) -> RunResult:
        other = storage.load(opened.name, opened.storage)
        [running] = other.get_trials(states=(TrialState.RUNNING,))
        if running.number == 1 and not taken:
            taken.append(running.number)
            assert holders._fail_stale(other, running, "killed")  # as another worker's claim does
        return fake_result([90.0, 91.0, 92.0])  # every configuration runs

    events: list[loop.TrialEvent] = []
    assert loop.run_search(opened, here, events.append, runner=slow) == ""
    trials = opened.study.get_trials()
    assert trials[1].state == TrialState.FAIL and records.fail_cause(trials[1]) == records.CUT_SHORT
    assert trials[2].user_attrs["retry_of"] == 1 and trials[2].state == TrialState.COMPLETE
    [said] = [e for e in events if e.kind == "done" and e.number == 1]
    assert said.outcome is not None and said.outcome.reason == (
        "failed by another autotune while this one measured it (no heartbeat from here reached the database for "
        "over 60s); its retry measures it again")


def test_a_running_trial_from_before_heartbeats_is_failed_once_older_than_the_grace_period(
        tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "GRACE_PERIOD_S", 1)
    opened = opening.open_search(request(tmp_path, 1), here)
    legacy = storage.ask(opened.study)
    legacy.set_user_attr("host", "another-container")
    legacy.set_user_attr("pid", 2**22 + 12345)
    assert abandon(opened.study) == []  # too young to tell
    time.sleep(1.2)
    assert abandon(opened.study) == [legacy.number]
    assert opened.study.get_trials()[0].user_attrs["fail_reason"].startswith(
        "left running by an autotune process (pid 4206649) that was killed")


def claimed_by(opened: opening.Search, pid: int, started: float | None, **attrs: object) -> optuna.Trial:
    """A RUNNING trial claimed (and beating) as if by the autotune process `pid` started at `started`."""
    trial = storage.ask(opened.study)
    holders.claim_trial(trial, "")
    trial.set_user_attr("pid", pid)
    trial.set_user_attr("pid_started", started)
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    return trial


def test_a_trial_whose_autotune_on_this_host_is_dead_is_failed_at_once_and_retried(
        tmp_path: Path, here: Machine) -> None:
    """kill -9 of a search, then the same command at once: its trial is not left RUNNING for the
    grace period (60 s), during which the new run would take it for a live one's."""
    opened = opening.open_search(request(tmp_path, 3), here)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = processes.start_time(proc.pid)
    dead = claimed_by(opened, proc.pid, started)
    assert abandon(opened.study) == []  # its process runs
    proc.kill()
    proc.wait()
    assert abandon(opened.study) == [dead.number]
    failed = opened.study.get_trials()[dead.number]
    assert (failed.state, records.fail_cause(failed)) == (TrialState.FAIL, records.CUT_SHORT)
    assert failed.user_attrs["fail_reason"] == (f"left running by an autotune process (pid {proc.pid}) that was "
                                                f"killed: that process no longer runs on this host")
    [retry] = opened.study.get_trials(states=(TrialState.WAITING,))
    assert retry.system_attrs["failed_trial"] == dead.number


def test_a_trial_whose_pid_now_names_another_process_is_failed_at_once(tmp_path: Path, here: Machine) -> None:
    opened = opening.open_search(request(tmp_path, 3), here)
    started = processes.start_time(os.getpid())
    assert started is not None
    reused = claimed_by(opened, os.getpid(), started - 5.0)  # our pid, once another process's
    mine = claimed_by(opened, os.getpid(), started)
    assert abandon(opened.study) == [reused.number]
    assert opened.study.get_trials()[mine.number].state == TrialState.RUNNING


@pytest.mark.parametrize("attrs", [{"host": "another-host"}, {"pid_space": "another-boot/pid:[1]"},
                                   {"pid_space": ""}])
def test_a_dead_pid_of_another_host_or_pid_space_waits_for_the_grace_period(
        tmp_path: Path, here: Machine, attrs: dict[str, object]) -> None:
    """Another host's pids (or another container's, or where the system does not say) tell nothing here."""
    opened = opening.open_search(request(tmp_path, 3), here)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert proc.wait() == 0  # its pid names no process now
    claimed_by(opened, proc.pid, None, **attrs)
    assert abandon(opened.study) == []


def test_a_study_made_for_another_model_is_refused(tmp_path: Path, here: Machine) -> None:
    search(tmp_path, here, trials=1, study="mine")
    with pytest.raises(storage.StudyError, match="study 'mine' was made for model=resnet18, not resnet50"):
        opening.open_search(opening.SearchRequest(model="resnet50", trials=1, space=SPACE, study="mine",
                                              studies_dir=tmp_path / "studies"), here)


def test_allow_mixed_lets_a_smaller_host_in_but_not_one_lacking_a_choice(tmp_path: Path, here: Machine,
                                                                          fake_libs: Libraries) -> None:
    default = space.find("default")  # with the core-bound knobs
    search(tmp_path, here, trials=2, study="mixed", space=default)
    smaller = Machine(lscpu("cloud_vm_gaps"), fake_libs)  # 4 cores, the study's host 8
    opened = opening.open_search(request(tmp_path, 3, study="mixed", allow_mixed=True, space=default), smaller)
    assert opened.space.get("omp_threads").high == 4  # type: ignore[union-attr]
    lacking = Machine(lscpu("cloud_vm_gaps"), replace(fake_libs, paths={**fake_libs.paths, "jemalloc": None}))
    before = storage.load("mixed", storage.storage_url("mixed", None, tmp_path / "studies")).user_attrs
    with pytest.raises(storage.StudyError) as refused:
        opening.open_search(request(tmp_path, 3, study="mixed", allow_mixed=True, space=default), lacking)
    assert str(refused.value) == (
        "study 'mixed' cannot take this host's trials: allocator is default/jemalloc/tcmalloc in the study and "
        "default/tcmalloc on this host (--allow-mixed lets only the thread and instance counts follow a host's "
        "cores); install what this host lacks, or start a study per host class with another --study name")
    assert storage.load("mixed", storage.storage_url("mixed", None, tmp_path / "studies")).user_attrs == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"input_shape": "3x128x128"}, "input_shape=3x224x224, not 3x128x128; use another --study name or the "
                                       "same --input-shape"),
        ({"measure": MeasureSettings(duration_s=5.0)}, "duration_s=2.0, not 5.0; use another --study name or the "
                                                       "same --duration"),
        ({"replicates": ReplicatePolicy(replicates=5)}, "replicates=3, not 5; use another --study name or the "
                                                        "same --replicates"),
        ({"replicates": ReplicatePolicy(timeout_s=60.0)}, "timeout_s=900.0, not 60.0; use another --study name or "
                                                          "the same --timeout"),
        ({"tolerance": 0.01}, "tolerance=the default, not 0.01; use another --study name or the same --tolerance"),
    ],
)
def test_resuming_with_other_measurement_settings_is_refused(tmp_path: Path, here: Machine, change: dict[str, object],
                                                             message: str) -> None:
    search(tmp_path, here, trials=2, study="mine")
    with pytest.raises(storage.StudyError) as refused:
        opening.open_search(request(tmp_path, 3, study="mine", **change), here)
    assert str(refused.value) == f"study 'mine' was measured with {message}"
    assert records.finished(storage.load("mine", f"sqlite:///{tmp_path}/studies/mine.db")) == 2


@pytest.mark.parametrize(("where", "key", "other"), [
    (opening, "torch_versions", {"torch": "9.9.9", "onednn": "3.7.1"}),
    (opening, "fingerprint", {"cpu_model": "Another CPU", "memory_gib": 1}),
])
def test_resuming_on_another_machine_or_torch_is_refused(tmp_path: Path, here: Machine, monkeypatch: pytest.MonkeyPatch,
                                                         where: object, key: str, other: dict[str, object]) -> None:
    search(tmp_path, here, trials=1, study="mine")
    real = getattr(where, key)
    monkeypatch.setattr(where, key, lambda *args: {**real(*args), **other})
    with pytest.raises(storage.StudyError, match=r"^study 'mine' was measured with (torch|cpu_model)=.*, not "
                                                 r"(9\.9\.9|Another CPU); use another --study name \(measurements "
                                                 r"from another machine or torch do not mix\)$"):
        opening.open_search(request(tmp_path, 3, study="mine"), here)


def test_the_study_records_settings_and_each_trial_their_digest(tmp_path: Path, here: Machine) -> None:
    study = search(tmp_path, here, trials=3)
    settings = study.user_attrs["settings"]
    assert settings["input_shape"] == "3x224x224" and settings["duration_s"] == 2.0 and settings["replicates"] == 3
    assert {"torch", "onednn", "cpu_model", "isa", "physical_cores", "memory_gib"} <= set(settings)
    assert "hostname" not in settings
    assert {t.user_attrs["settings_digest"] for t in study.get_trials()} == {study.user_attrs["settings_digest"]}


def test_a_study_from_before_settings_adopts_todays_and_measures_its_trials_again(tmp_path: Path,
                                                                                  here: Machine) -> None:
    made = search(tmp_path / "new", here, trials=1, study="old")
    (tmp_path / "studies").mkdir()
    legacy = optuna.create_study(study_name="old", storage=f"sqlite:///{tmp_path}/studies/old.db")
    for key, value in made.user_attrs.items():
        if not key.startswith("settings"):
            legacy.set_user_attr(key, value)
    for config, latency in (("defaults", 100.0), ("allocator=jemalloc", 50.0)):
        legacy.add_trial(optuna.trial.create_trial(
            value=latency, user_attrs={"config": config, "baseline": config == "defaults", "batch_size": 1,
                                       "latency_p50_ms": latency, "throughput_ips": 1000 / latency}))
    opened = opening.open_search(request(tmp_path, 3, study="old"), here)
    assert opened.notes[-1] == ("study old was made before autotune recorded its measurement settings (input shape, "
                                "timing, replicates, tolerance, torch, this machine); it now records today's, and "
                                "its earlier trials are measured again rather than reused")
    assert opened.study.user_attrs["settings"] == made.user_attrs["settings"]
    assert records.same_config(opened.study, 5, "allocator=jemalloc", 1, opened.settings_digest) is None


def test_a_duplicate_reuses_only_a_trial_measured_under_the_same_settings(tmp_path: Path, here: Machine) -> None:
    space = tmp_path / "jemalloc.yaml"
    space.write_text("knobs:\n  allocator: [jemalloc]\n")
    study = search(tmp_path, here, trials=2, space=space)
    trial = study.get_trials()[1]
    config, digest = trial.user_attrs["config"], trial.user_attrs["settings_digest"]
    assert records.same_config(study, 99, config, 1, digest) == trial
    assert records.same_config(study, 99, config, 1, "another digest") is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"objective": "speed"}, "--objective 'speed' is not allowed; use latency, throughput or both"),
        ({"trials": 0}, "--trials 0 is not allowed; use 1 or more"),
        ({"study": "bad name!"}, "--study 'bad name!' is not a usable name"),
        ({"storage": "studies/x.db"}, "--storage 'studies/x.db' is not a storage URL"),
        ({"model": "resnet5"}, "unknown model 'resnet5'"),
        ({"batch_sizes": (1, 8)}, "a list of batch sizes is searched only with --objective throughput"),
        ({"max_latency_ms": 50.0}, "--max-latency-ms needs --objective throughput and a positive limit"),
        ({"objective": "throughput", "max_latency_ms": -1.0}, "--max-latency-ms needs --objective throughput"),
        ({"max_tpot_ms": 0.0}, "--max-tpot-ms 0 is not allowed; give a positive limit in ms per output token"),
        ({"max_tpot_ms": 20.0}, "--max-tpot-ms bounds the time per output token of text generation; add --task"),
    ],
)
def test_bad_requests_write_nothing(tmp_path: Path, here: Machine, change: dict[str, object],
                                    message: str) -> None:
    fields = {"model": "resnet18", "trials": 2, "space": SPACE, "studies_dir": tmp_path / "studies", **change}
    with pytest.raises(storage.StudyError if "model" not in change else Exception, match=message):
        opening.open_search(opening.SearchRequest(**fields), here)  # type: ignore[arg-type]
    assert not (tmp_path / "studies").exists()


def test_a_bad_space_writes_nothing(tmp_path: Path, here: Machine) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("knobs:\n  omp_runtime: [gnu]\n  kmp_blocktime: [1]\n")
    with pytest.raises(SpaceError):
        opening.open_search(opening.SearchRequest(model="resnet18", trials=2, space=bad,
                                              studies_dir=tmp_path / "studies"), here)
    assert not (tmp_path / "studies").exists()


def test_a_failing_baseline_stops_the_search(tmp_path: Path, here: Machine) -> None:
    def broken(plan: LaunchPlan, timeout_s: float) -> RunResult:
        bad = InstanceResult(0, False, "exited with code 1: out of memory", 1, "")
        return RunResult(False, "instance 0: exited with code 1: out of memory", (bad,), 1.0)

    opened = opening.open_search(request(tmp_path, 3), here)
    with pytest.raises(RunFailed, match=r"the baseline \(PyTorch defaults\) failed: instance 0: exited"):
        loop.run_search(opened, here, lambda e: None, runner=broken)
    assert [t.state for t in opened.study.get_trials()] == [TrialState.FAIL]


def test_ctrl_c_mid_trial_records_it_failed_and_loses_nothing(tmp_path: Path, here: Machine) -> None:
    calls = []

    def interrupted(plan: LaunchPlan, timeout_s: float) -> RunResult:
        calls.append(plan)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return fake_runner(plan, timeout_s)

    opened = opening.open_search(request(tmp_path, 6), here)
    with pytest.raises(KeyboardInterrupt):
        loop.run_search(opened, here, lambda e: None, runner=interrupted)
    states = [t.state for t in opened.study.get_trials()]
    assert TrialState.RUNNING not in states
    assert states[-1] == TrialState.FAIL
    assert opened.study.get_trials()[-1].user_attrs["fail_reason"] == "interrupted by the user (Ctrl-C)"
    resumed = search(tmp_path, here, trials=6)
    reruns = sum("retry_of" in t.user_attrs for t in resumed.get_trials())  # of crashes: no trial either
    assert len(resumed.get_trials()) == 7 + reruns and records.finished(resumed) == 6  # the cut trial took none


def test_a_study_whose_trials_were_all_cut_short_goes_on(tmp_path: Path, here: Machine) -> None:
    """A cut trial measured nothing: counted toward --trials, three stopped searches left a study
    'already holding 3 finished trials' and no baseline, that no search could go on with."""
    def stopped(plan: LaunchPlan, timeout_s: float) -> RunResult:
        raise KeyboardInterrupt

    for _ in range(3):
        opened = opening.open_search(request(tmp_path, 3), here)
        with pytest.raises(KeyboardInterrupt):
            loop.run_search(opened, here, lambda e: None, runner=stopped)
    resumed = search(tmp_path, here, trials=3)
    assert [t.state for t in resumed.get_trials()][:3] == [TrialState.FAIL] * 3
    assert records.finished(resumed) == 3 and records.baseline(resumed) is not None


def test_both_objectives_give_a_pareto_front(tmp_path: Path, here: Machine) -> None:
    result = search(tmp_path, here, trials=6, objective="both")
    front = records.best_trials(result)
    assert front and all(len(t.values) == 2 for t in front)


def failing_mkldnn(*failures: InstanceResult) -> tuple[list[int], loop.PlanRunner]:
    """A runner whose mkldnn runs fail as given, one per call (the last repeats), and counts them."""
    calls: list[int] = []

    def runner(plan: LaunchPlan, timeout_s: float) -> RunResult:
        if not plan.config.get("mkldnn"):
            return fake_runner(plan, timeout_s)
        calls.append(1)
        failed = failures[min(len(calls), len(failures)) - 1]
        if failed.ok:
            return fake_result([90.0, 91.0, 92.0])
        return RunResult(False, f"instance 0: {failed.reason}", (failed,), 1.0)

    return calls, runner


ONLY_MKLDNN = "knobs:\n  mkldnn: [on]\n"
CRASH = InstanceResult(0, False, "crashed with SIGSEGV", -11, "segfault\n")
TIMEOUT = InstanceResult(0, False, "timed out after 5s while measuring", -9, "")
OK = InstanceResult(0, True, "", 0, "")
WRONG = InstanceResult(0, False, "wrong answers: max relative error 0.2 > tolerance 0.001", 3, "")
EXIT = InstanceResult(0, False, "exited with code 1: RuntimeError: no kernel", 1, "")


@pytest.mark.parametrize(("failures", "measured", "reused_from", "cause"), [
    ((CRASH,), 2, 2, "killed"),  # killed twice: the second outcome is reused from then on
    ((TIMEOUT, OK), 2, 2, None),  # a timeout, then a measurement that is reused
    ((WRONG,), 1, 1, "error"),  # wrong answers say something about the configuration: reused at once
    ((EXIT,), 1, 1, "error"),
])
def test_a_failure_by_a_signal_or_timeout_is_measured_once_more_a_deterministic_one_never(
        tmp_path: Path, here: Machine, failures: tuple[InstanceResult, ...], measured: int, reused_from: int,
        cause: str | None) -> None:
    space = tmp_path / "mkldnn.yaml"
    space.write_text(ONLY_MKLDNN)
    calls, runner = failing_mkldnn(*failures)
    opened = opening.open_search(request(tmp_path, 5, space=space, replicates=ReplicatePolicy(1, 0)), here)
    stopped = loop.run_search(opened, here, lambda event: None, runner=runner)
    trials = opened.study.get_trials()
    assert len(calls) == measured
    # The space holds one configuration: once its outcome is settled nothing is left to propose.
    assert len(trials) == 1 + measured and not any(records.is_duplicate(t) for t in trials)
    assert stopped == ("every configuration of the space has run (2 distinct, baseline included); widen the "
                       "space (--space) to search further")
    assert trials[reused_from].user_attrs.get("fail_cause") == cause
    reused = records.same_config(opened.study, 99, "mkldnn=on", 1, opened.settings_digest)
    assert reused is not None and reused.number == reused_from


def test_a_run_stopped_because_another_instance_exited_is_a_deterministic_failure(tmp_path: Path,
                                                                                 here: Machine) -> None:
    stopped = InstanceResult(0, False, "stopped because instance 1 failed", -9, "")
    exited = InstanceResult(1, False, "exited with code 1: out of memory", 1, "")
    opened = opening.open_search(request(tmp_path, 1), here)
    trial = storage.ask(opened.study)
    records.record_failed_run(trial, Measurement((RunResult(False, "instance 0: stopped", (stopped, exited), 1.0),)))
    assert trial.user_attrs["fail_cause"] == "error"


@pytest.mark.parametrize(("reason", "cause"), [
    ("interrupted by the user (Ctrl-C)", "cut_short"),
    ("left running by an autotune process (pid 12) that was killed", "cut_short"),
    ("instance 0: crashed with SIGSEGV", "error"),  # as before causes were recorded: reused
])
def test_a_trial_recorded_before_causes_keeps_its_old_meaning(reason: str, cause: str) -> None:
    trial = optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": reason})
    assert records.fail_cause(trial) == cause
