"""Search space files: the format, every bad file's message, adaptation to the machine, sampling."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.config import space, space_fit
from autotune.config.knobs import Config
from autotune.config.space import SpaceError
from autotune.host import capabilities
from tests.conftest import ROOT
from tests.support import probes
from tests.support.spaces import FakeTrial, every

ALL_LIBS = {"libiomp5": True, "libomp": True, "jemalloc": True, "tcmalloc": True}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["default", "quick"])
def test_shipped_spaces_load(name: str) -> None:
    loaded = space.load(space.find(name))
    assert loaded.knobs


def test_builtin_conditions_apply_without_when() -> None:
    loaded = space.load(space.find("default"))
    torch_run = ("backend", ("eager", "torchscript", "inductor"))
    assert loaded.get("kmp_blocktime").when == (torch_run, ("omp_runtime", ("intel",)))  # type: ignore[union-attr]
    assert loaded.get("omp_proc_bind").when == (torch_run, ("omp_runtime", ("gnu", "llvm")))  # type: ignore[union-attr]
    assert loaded.get("omp_runtime").when == (torch_run,)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("knobs:\n  mkldnn: [on\n  allocator: x: y\n", "not valid YAML at line 3"),
        ("knobs:\n  omp_thread: [1, 2]\n", "knobs.omp_thread: unknown knob 'omp_thread'; did you mean omp_threads?"),
        ("knobs:\n  allocator: [default, mimalloc]\n",
         "knobs.allocator.choices: allocator=mimalloc is not allowed; use default, jemalloc, tcmalloc"),
        ("knobs:\n  instances: {low: 3, high: 2}\n", "knobs.instances: low 3 is above high 2"),
        ("knobs:\n  instances: {low: 0, high: 2}\n", "knobs.instances: low/high must be an integer from 1 to 4096"),
        ("knobs:\n  instances: {low: 1}\n", "knobs.instances.high: missing; give an integer or max"),
        ("knobs:\n  instances: {low: 1, high: lots}\n", "knobs.instances.high: 'lots' is not an integer or max"),
        ("knobs:\n  instances: {low: 1, hi: 2}\n",
         "knobs.instances.hi: unknown key; allowed: high, log, low, step, when"),
        ("knobs:\n  allocator: {low: 1, high: 2}\n", "knobs.allocator: takes choices, not low/high"),
        ("knobs:\n  omp_runtime: [gnu]\n  kmp_blocktime:\n    choices: [1]\n    when: {omp_runtme: intel}\n",
         "knobs.kmp_blocktime.when: condition names unknown knob 'omp_runtme'"),
        ("knobs:\n  kmp_blocktime: [0, 1]\n",
         "knobs.kmp_blocktime: can never be sampled: it needs omp_runtime=intel, which the space never picks"),
        ("knobs:\n  omp_runtime: [gnu, intel]\n  omp_proc_bind:\n    choices: [close]\n"
         "    when: {omp_runtime: intel}\n",
         "knobs.omp_proc_bind.when.omp_runtime: omp_proc_bind applies only with omp_runtime=gnu/llvm"),
        ("knobs: {}\n", "expected a mapping `knobs:` with at least one knob"),
        ("knobs:\n  omp_threads: [1, 2]\n", "knobs.omp_threads: give low/high (they are fitted to the cores)"),
        ("knobs:\n  dataloader_workers: {low: 0, high: 4, log: true}\n", "log: true needs step 1 and low 1"),
        ("knob:\n  mkldnn: [on]\n", "expected a mapping `knobs:` with at least one knob"),
        ("knobs:\n  mkldnn: [on]\nextra: 1\n", "unknown top-level key 'extra'"),
    ],
)
def test_every_bad_file_names_file_key_and_what_is_allowed(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpaceError) as info:
        space.load(path)
    assert str(info.value).startswith(f"{path}: "), str(info.value)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unreadable_and_unknown_spaces(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match="cannot read search space .*missing.yaml: No such file"):
        space.load(tmp_path / "missing.yaml")
    with pytest.raises(SpaceError, match="no search space 'nope'; give a .yaml path or one of: default, generate, "
                                         "quick, seed"):
        space.find("nope")


def test_shipped_spaces_are_found_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From a checkout the shipped spaces are the repository's search_spaces/ (a wheel's are inside
    the package: tests/e2e/test_wheel.py), whatever the current folder."""
    monkeypatch.chdir(tmp_path)
    repository = ROOT / "search_spaces"
    assert space.shipped_spaces().resolve() == repository
    assert space.find("quick").resolve() == repository / "quick.yaml"
    with pytest.raises(SpaceError, match="no search space 'nope'; give a .yaml path or one of: default, generate, "
                                         "quick, seed$"):
        space.find("nope")


def test_spaces_in_the_current_folder_come_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "search_spaces").mkdir()
    (tmp_path / "search_spaces" / "quick.yaml").write_text("knobs:\n  mkldnn: [on]\n")
    (tmp_path / "search_spaces" / "mine.yaml").write_text("knobs:\n  mkldnn: [off]\n")
    assert space.find("quick") == Path("search_spaces/quick.yaml")
    assert space.load(space.find("quick")).names() == ("mkldnn",)
    assert space.find("default").resolve() == space.shipped_spaces().resolve() / "default.yaml"
    with pytest.raises(SpaceError, match="one of: default, generate, mine, quick, seed$"):
        space.find("nope")


def test_adapt_drops_missing_libraries_and_caps_ranges() -> None:
    loaded = space.load(space.find("default"))
    adapted = space_fit.adapt(loaded, cores=2, available={**ALL_LIBS, "libomp": False, "tcmalloc": False})
    assert adapted.get("omp_runtime").choices == ("gnu", "intel")  # type: ignore[union-attr]
    assert adapted.get("allocator").choices == ("default", "jemalloc")  # type: ignore[union-attr]
    assert adapted.get("instances").high == 2  # type: ignore[union-attr]
    assert adapted.notes == ("omp_runtime=llvm dropped: libomp is not installed (apt-get install libomp5)",
                             "allocator=tcmalloc dropped: tcmalloc is not installed "
                             "(apt-get install libtcmalloc-minimal4)")


def test_bf16_slow_in_pytorch_stays_only_for_the_runtime_that_runs_it_well() -> None:
    """An AVX2 CPU emulates bf16 in PyTorch (32x slower than fp32 in its probe) while OpenVINO runs it."""
    slow = {f"torch:bf16:{op}": {"gops": {"1": 3.1, "2": 6.2}} for op in ("conv", "matmul")}
    adapted = space_fit.for_probe(space_fit.adapt(space.load(space.find("default")), cores=2, available=ALL_LIBS),
                                  capabilities.refusals(probes.probe(slow), "conv"))
    assert adapted.get("precision").choices == (  # type: ignore[union-attr]
        "fp32", "bf16", "int8", "int8_dynamic", "int8_weight_only")
    assert adapted.notes[-1] == ("precision=bf16 only with backend=openvino: with eager/torchscript/inductor, it "
                                 "measured 32.3x slower than fp32 in its probe (conv)")
    small = space.SearchSpace("small", (adapted.get("backend"), adapted.get("precision")))  # type: ignore[arg-type]
    assert {c.describe() for c in every(small)} >= {"backend=openvino precision=bf16"}
    assert not [c for c in every(small) if c.get("precision") == "bf16"
                and c.get("backend") != "openvino"]
    assert "value_when" in adapted.to_json()["knobs"]["precision"]  # a study records it: another host differs


def test_a_host_of_another_class_may_cap_only_the_core_bound_knobs_at_its_cores() -> None:
    loaded = space.load(space.find("default"))
    small, big = (space_fit.adapt(loaded, cores, ALL_LIBS).to_json() for cores in (2, 48))
    assert space_fit.recorded_differs(big, small) == "instances is 1..48 in the study and 1..2 on this host"
    assert space_fit.recorded_differs(big, small, cores_may_differ=True) == ""
    assert space_fit.recorded_differs(small, small) == ""
    no_tcmalloc = space_fit.adapt(loaded, 48, {**ALL_LIBS, "tcmalloc": False}).to_json()
    assert space_fit.recorded_differs(big, no_tcmalloc, cores_may_differ=True) == (
        "allocator is default/jemalloc/tcmalloc in the study and default/jemalloc on this host")


def test_adapt_refuses_what_no_install_can_provide(tmp_path: Path) -> None:
    path = write(tmp_path, "knobs:\n  instances: {low: 4, high: max}\n")
    with pytest.raises(SpaceError, match=r"knobs.instances.low: 4 is above the 2 usable physical cores"):
        space_fit.adapt(space.load(path), cores=2, available=ALL_LIBS)
    only = write(tmp_path, "knobs:\n  allocator: [jemalloc]\n")
    with pytest.raises(SpaceError, match="knobs.allocator: no choice is available on this machine"):
        space_fit.adapt(space.load(only), cores=2, available={**ALL_LIBS, "jemalloc": False})


def test_sampling_respects_conditions_and_the_core_budget() -> None:
    available = {**ALL_LIBS, "bf16": True, "openvino": False, "onnxruntime": False}  # inductor is the last backend
    adapted = space_fit.adapt(space.load(space.find("default")), cores=8, available=available)
    trial = FakeTrial()
    config = adapted.sample(trial)
    assert config.get("omp_runtime") == "llvm"
    assert "kmp_blocktime" not in trial.asked and "omp_proc_bind" in trial.asked
    assert config.get("backend") == "inductor"  # so no mkldnn and no weight_cache: eager-only knobs
    assert "mkldnn" not in trial.asked and "weight_cache" not in trial.asked
    assert config.get("memory_format") == "channels_last" and config.get("precision") == "int8_weight_only"
    assert trial.asked["instances"] == (1, 8)
    assert trial.asked["omp_threads"] == (1, 1)  # 8 instances leave one core each
    assert int(config.get("omp_threads")) * int(config.get("instances")) <= 8  # type: ignore[arg-type]


def test_every_optuna_sample_is_a_valid_configuration() -> None:
    adapted = space_fit.adapt(space.load(space.find("default")), cores=4, available={**ALL_LIBS, "bf16": True})
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(200):
        trial = study.ask()
        config = adapted.sample(trial)  # Config.from_mapping validates conditions
        assert int(config.get("omp_threads") or 1) * int(config.get("instances") or 1) <= 4
        study.tell(trial, 1.0)


def test_a_pinned_knob_is_what_its_dependants_conditions_see(tmp_path: Path) -> None:
    """int8_fallback alone, with backend=inductor precision=int8 pinned by `--set`, samples; without
    the pins it never could (benchmarks/quality.py's digits search is such a space)."""
    path = write(tmp_path, "knobs:\n  int8_fallback: [0, 1, 2, 4, 8]\n")
    with pytest.raises(SpaceError, match="knobs.int8_fallback: can never be sampled: it needs backend=inductor"):
        space.load(path)
    pinned = space.load(path, Config.from_assignments(["backend=inductor", "precision=int8"]))
    assert pinned.names() == ("int8_fallback",)
    with pytest.raises(SpaceError, match="it needs precision=int8"):
        space.load(path, Config.from_assignments(["backend=inductor"]))


def test_a_pin_never_makes_a_knob_the_space_offers_unsamplable() -> None:
    """`--set backend=openvino` on the default space: mkldnn (eager only) just does not apply."""
    pinned = space.load(space.find("default"), Config.from_assignments(["backend=openvino"]))
    assert "mkldnn" in pinned.names()
