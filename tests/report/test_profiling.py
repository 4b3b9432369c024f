"""`autotune profile`: op tables, their comparison, and the command against a study of fake children."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune.config.knobs import Config
from autotune.deploy import export
from autotune.host.libs import Libraries
from autotune.host.machine import Machine
from autotune.measure.plan import BenchSpec, InstancePlan, LaunchPlan
from autotune.report import profiling
from autotune.report.profiling import Change, Op, OpTable
from tests.conftest import lscpu
from tests.support.cli import run_cli
from tests.support.plans import FAKE_WORKER
from tests.support.studies import search


def table(*ops: tuple[str, float], wall_ms: float = 10.0) -> OpTable:
    return OpTable(5, wall_ms, tuple(Op(name, ms, ms, 1.0) for name, ms in ops))


def test_the_childs_totals_become_per_call_milliseconds_merged_by_name_largest_first() -> None:
    payload = {"iterations": 4, "wall_ms": 40.0, "ops": [
        {"name": "aten::add", "self_cpu_us": 400.0, "cpu_total_us": 800.0, "calls": 8},
        {"name": "aten::conv2d", "self_cpu_us": 2000.0, "cpu_total_us": 30000.0, "calls": 4},
        {"name": "aten::add", "self_cpu_us": 1600.0, "cpu_total_us": 1600.0, "calls": 4}]}
    parsed = profiling.op_table(payload)
    assert parsed.iterations == 4 and parsed.wall_ms == 10.0
    assert parsed.ops == (Op("aten::add", 0.5, 0.6, 3.0), Op("aten::conv2d", 0.5, 7.5, 1.0))
    assert parsed.self_ms == 1.0 and parsed.outside_ms == 9.0
    assert parsed.share(parsed.ops[0]) == 0.5


def test_changes_rank_both_directions_by_size_count_a_missing_op_as_zero_and_skip_unchanged_ones() -> None:
    before = table(("aten::conv2d", 8.0), ("aten::relu_", 1.0), ("aten::addmm", 0.5))
    after = table(("cpp_fused_relu_0", 1.5), ("aten::conv2d", 3.0), ("aten::addmm", 0.5))
    assert profiling.changes(before, after) == [
        Change("aten::conv2d", 8.0, 3.0), Change("cpp_fused_relu_0", 0.0, 1.5), Change("aten::relu_", 1.0, 0.0)]
    assert [c.delta_ms for c in profiling.changes(before, after, count=2)] == [-5.0, 1.5]


def test_an_empty_table_has_no_share_instead_of_dividing_by_zero() -> None:
    empty = table()
    assert empty.self_ms == 0 and empty.share(Op("x", 0.0, 0.0, 0.0)) == 0.0 and empty.outside_ms == 10.0


def plan(*behaviours: str, config: Config | None = None) -> LaunchPlan:
    instances = tuple(InstancePlan(i, (i,), None, {}, (sys.executable, FAKE_WORKER, b))
                      for i, b in enumerate(behaviours))
    return LaunchPlan(config or Config(), BenchSpec("resnet18", (3, 224, 224)), "none", instances)


def test_only_instance_0_is_told_to_profile() -> None:
    profiled = profiling.profiled_plan(plan("a", "b"), 7, Path("/tmp/x.trace.json"))
    assert profiled.instances[0].command[-4:] == ("--profile", "7", "--trace", "/tmp/x.trace.json")
    assert profiled.instances[1].command == (sys.executable, FAKE_WORKER, "b")


def add(study: optuna.Study, value: float | None, **attrs: object) -> None:
    state = TrialState.COMPLETE if value is not None else TrialState.FAIL
    study.add_trial(create_trial(state=state, value=value, user_attrs=attrs))


@pytest.fixture
def studied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """studies/fake.db: 0 the baseline, 1 the best (2 instances), 2 failed, 3 crashes when profiled,
    4 records few ops (as an AOTInductor package does)."""
    (tmp_path / "studies").mkdir()
    study = optuna.create_study(study_name="fake", storage=f"sqlite:///{tmp_path}/studies/fake.db")
    add(study, 100.0, baseline=True, config="defaults", plan=plan("profile-eager").to_json())
    inductor = Config.from_assignments(["backend=inductor"])
    add(study, 40.0, config="backend=inductor",
        plan=plan("profile-fused", "profile-fused", config=inductor).to_json())
    add(study, None, fail_reason="instance 0: crashed with SIGSEGV")
    add(study, 90.0, config="omp_threads=1", plan=plan("crash-late").to_json())
    add(study, 60.0, config="backend=inductor precision=bf16", plan=plan("profile-hidden").to_json())
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_profile_compares_the_best_trial_with_the_baseline_and_saves_both_traces(
        capsys: pytest.CaptureFixture[str], studied: Path) -> None:
    code, out, err = run_cli(capsys, "profile", "--iterations", "3")
    assert code == 0, err
    folder = studied / "studies" / "profiles" / "fake"
    assert sorted(p.name for p in folder.iterdir()) == ["baseline.trace.json", "profile.json", "trial-1.trace.json"]
    for name in ("baseline", "trial-1"):
        assert json.loads((folder / f"{name}.trace.json").read_text())["traceEvents"]
    assert "baseline: op" in out and "trial 1: op" in out
    assert "aten::mkldnn_convolution" in out and "cpp_fused_relu_0" in out
    assert "trial 1 runs 2 instances: instance 0 was profiled" in out
    assert "outside any recorded op" not in out
    assert "baseline 6.050 ms (0.550 outside any op), trial 1 4.400 ms (0.400 outside any op)" in out
    assert "ui.perfetto.dev" in out and str(Path("studies/profiles/fake/trial-1.trace.json")) in out
    saved = json.loads((folder / "profile.json").read_text())
    assert saved["kind"] == "profile" and saved["iterations"] == 3
    assert saved["changed"][:2] == [
        {"name": "aten::mkldnn_convolution", "before_ms": 4.0, "after_ms": 2.0, "delta_ms": -2.0},
        {"name": "cpp_fused_relu_0", "before_ms": 0.0, "after_ms": 1.5, "delta_ms": 1.5}]


def test_profile_json_of_one_trial_without_the_baseline(capsys: pytest.CaptureFixture[str], studied: Path) -> None:
    code, out, err = run_cli(capsys, "profile", "--trial", "1", "--no-baseline", "--iterations", "2", "--json",
                             "--out", "traces")
    assert code == 0, err
    document = json.loads(out)
    assert document["kind"] == "profile" and document["schema_version"] == 1 and document["changed"] == []
    [only] = document["configurations"]
    assert (only["label"], only["trial"], only["instances"]) == ("trial 1", 1, 2)
    assert only["ops"][0] == {"name": "aten::mkldnn_convolution", "self_ms": 2.0, "share": 0.5, "total_ms": 2.2,
                              "calls": 2.0}
    assert sorted(p.name for p in (studied / "traces").iterdir()) == ["profile.json", "trial-1.trace.json"]


def test_a_child_that_fails_is_exit_1_with_its_reason_and_writes_nothing(
        capsys: pytest.CaptureFixture[str], studied: Path) -> None:
    code, out, err = run_cli(capsys, "profile", "--trial", "3")
    assert "Top" not in out
    assert code == 1
    assert err == "Error: profiling trial 3 (omp_threads=1) failed: instance 0: crashed with SIGABRT\n"
    assert not (studied / "studies" / "profiles").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trial", "99"], "Error: study 'fake' has no trial 99; it has trials 0 to 4"),
        (["--trial", "2"], "Error: trial 2 of 'fake' did not complete (fail: instance 0: crashed with SIGSEGV); "
                           "pick a completed trial"),
        (["best.env", "--trial", "1"],
         "Error: give ENV_FILE or a study's trial (--trial, --study, --storage), not both"),
        (["missing.env"], "Error: cannot read env file missing.env: No such file or directory; give a file made by "
                          "`autotune export`"),
        (["--iterations", "0"], "Error: Invalid value for '--iterations': 0 is not in the range x>=1. "
                                "(see `autotune profile --help`)"),
        (["--out", "studies/fake.db/traces"], "Error: --out 'studies/fake.db/traces' is not a writable folder "
                                              "(Not a directory); choose another"),
        (["--study", "nope"], "Error: no study 'nope' in studies/ (studies there: fake)"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(capsys: pytest.CaptureFixture[str], studied: Path,
                                                         args: list[str], message: str) -> None:
    code, out, err = run_cli(capsys, "profile", *args)
    assert (code, out, err) == (2, "", message + "\n")
    assert sorted(p.name for p in studied.rglob("*")) == ["fake.db", "studies"]


def test_a_study_without_a_baseline_says_to_leave_it_out(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "studies").mkdir()
    study = optuna.create_study(study_name="nobase", storage=f"sqlite:///{tmp_path}/studies/nobase.db")
    add(study, None, fail_reason="instance 0: exited with code 1")
    add(study, 50.0, config="backend=inductor", plan=plan("profile-fused").to_json())
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "profile")
    assert (code, err) == (2, "Error: study 'nobase' has no completed baseline (PyTorch's defaults) to compare "
                              "with; use --no-baseline to profile trial 1 alone\n")


def test_an_env_file_is_profiled_beside_the_defaults_of_its_model(tmp_path: Path, fake_libs: Libraries) -> None:
    here = Machine(lscpu("amd_1s_smt"), fake_libs)
    study = search(tmp_path, here, trials=4, seed=1)  # seeded: a random one may only draw crashing mkldnn=on
    chosen = next(t for t in study.get_trials() if t.user_attrs.get("config") not in (None, "defaults")
                  and t.state == TrialState.COMPLETE)
    path = tmp_path / "fast.env"
    export.write(path, export.render(study, chosen))
    base, mine = profiling.env_file_targets(path, here, with_baseline=True)
    assert (base.label, base.name, base.config, base.plan.config) == ("baseline", "baseline", "defaults", Config())
    assert (mine.label, mine.name, mine.config) == ("fast.env", "fast", chosen.user_attrs["config"])
    assert mine.plan.instances[0].env == chosen.user_attrs["plan"]["instances"][0]["env"]
    assert base.plan.bench == mine.plan.bench
    assert profiling.env_file_targets(path, here, with_baseline=False) == [mine]
    assert profiling.env_file_out(path) == Path("profiles/fast")


def test_a_configuration_whose_time_is_mostly_outside_any_op_says_so(capsys: pytest.CaptureFixture[str],
                                                                     studied: Path) -> None:
    code, out, err = run_cli(capsys, "profile", "--trial", "4", "--iterations", "2")
    assert code == 0, err
    assert "trial 4 4.000 ms (3.900 outside any op)" in out
    assert ("note: trial 4 spent most of its time outside any recorded op: compiled code (an AOTInductor package) "
            "runs its kernels without profiler events") in out
    assert "note: baseline" not in out
