"""OpenVINO and ONNX Runtime in the search space: their knobs sampled only with their backend (and the
OpenMP knobs only with PyTorch's), a backend whose runtime is not installed dropped with a note,
pins narrowing through conditions on conditional knobs, and their recipes first where installed."""

from __future__ import annotations

import optuna
import pytest

from autotune.base.errors import ConfigError
from autotune.config import recipes, space, space_fit
from autotune.config.knobs import Config
from autotune.config.space import SAMPLE_ORDER, SHRINKS_WITH, SpaceError
from autotune.model.knobs import KNOBS, PEER_BACKENDS, VALUE_CONDITIONS
from tests.conftest import lscpu
from tests.support import probes

DEFAULT = space.find("default")
EVERYTHING = {"bf16": True, "int8": True}  # libraries and runtimes: present unless said otherwise


def adapted(cores: int = 4, **available: bool) -> space.SearchSpace:
    return space_fit.adapt(space.load(DEFAULT), cores, {**EVERYTHING, **available})


def pins(*assignments: str) -> Config:
    return Config.from_assignments(assignments)


def test_every_knob_is_sampled_after_the_knobs_its_conditions_read() -> None:
    assert sorted(SAMPLE_ORDER) == sorted(KNOBS)
    for name in SAMPLE_ORDER:
        read = {other for other, _ in KNOBS[name].only_when} | {SHRINKS_WITH.get(name, name)}
        read |= {other for (knob, _), condition in VALUE_CONDITIONS.items() if knob == name for other, _ in condition}
        assert all(SAMPLE_ORDER.index(other) <= SAMPLE_ORDER.index(name) for other in read), name
    assert SAMPLE_ORDER.index("backend") < SAMPLE_ORDER.index("omp_runtime") < SAMPLE_ORDER.index("kmp_affinity")


def test_each_runtime_s_knobs_are_sampled_with_its_backend_only() -> None:
    """Conditions on conditional knobs: kmp_* need omp_runtime=intel, which needs a PyTorch backend;
    ort_inter_threads needs ort_execution=parallel, which needs backend=onnxruntime."""
    fitted = adapted()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen, seen_allocators = set(), set()
    for _ in range(400):
        trial = study.ask()
        config = fitted.sample(trial)  # Config.from_mapping checks every condition
        values, backend = config.as_dict(), config.get("backend")
        seen.add((backend, config.get("precision"), config.get("ort_execution")))
        assert ("omp_runtime" in values) == (backend not in PEER_BACKENDS)  # and so kmp_*, omp_proc_bind
        assert ("memory_format" in values) == (backend not in PEER_BACKENDS and not values.get("mkldnn"))
        assert {"ov_hint", "ov_streams", "ov_pinning"} <= set(values) if backend == "openvino" else (
            not any(k.startswith("ov_") for k in values))
        assert ("ort_inter_threads" in values) == (backend == "onnxruntime" and values["ort_execution"] == "parallel")
        if backend == "openvino":
            assert 0 <= int(values["ov_streams"]) <= int(values["omp_threads"])  # type: ignore[call-overload]
        if backend == "onnxruntime":
            assert values["precision"] in ("fp32", "int8")  # no bf16 in ONNX Runtime
        if backend == "openvino":  # its runtime crashed under every preloaded malloc
            assert values.get("allocator", "default") == "default"
        seen_allocators.add((backend == "openvino", values.get("allocator", "default")))
        study.tell(trial, 1.0)
    assert {("openvino", "bf16", "sequential"), ("onnxruntime", "int8", "parallel")} <= {
        (b, p, "sequential" if b == "openvino" else e) for b, p, e in seen}
    assert {(False, "jemalloc"), (False, "tcmalloc"), (True, "default")} <= seen_allocators


def test_a_backend_whose_runtime_is_not_installed_is_dropped_with_a_note() -> None:
    fitted = adapted(openvino=False)
    assert fitted.get("backend").choices == ("eager", "torchscript", "inductor", "onnxruntime")  # type: ignore[union-attr]
    assert fitted.notes == ("backend=openvino dropped: OpenVINO is not installed; install it with pip install "
                            "'autotune[openvino]' (or: pip install openvino nncf) (to generate text: pip install "
                            "'autotune[openvino-genai]' (or: pip install openvino-genai openvino nncf))",)
    assert fitted.lacks(Config.from_mapping({"backend": "openvino"})) == "backend=openvino"
    with pytest.raises(SpaceError, match=r"^--set backend=openvino cannot run here: OpenVINO is not installed; "
                                         r"install it with pip install 'autotune\[openvino\]'.*; drop that --set$"):
        space_fit.pin(fitted, pins("backend=openvino"), {**EVERYTHING, "openvino": False})


def test_what_the_machine_offers_comes_from_the_runtimes_found(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.model import backends

    monkeypatch.setattr(backends, "missing", lambda backend, generates=False: ("onnxscript",)
                        if backend == "onnxruntime" else ("openvino_genai",) if generates and backend == "openvino"
                        else ())
    assert space_fit.runtimes_installed() == {"openvino": True, "onnxruntime": False, "llamacpp": True}
    assert space_fit.runtimes_installed(generates=True) == {"openvino": False, "onnxruntime": False, "llamacpp": True}


@pytest.mark.parametrize(("pinned", "narrowed"), [
    (["omp_runtime=intel"], {"backend": ("eager", "torchscript", "inductor")}),
    (["omp_proc_bind=close"], {"backend": ("eager", "torchscript", "inductor"), "omp_runtime": ("gnu", "llvm")}),
    (["omp_runtime=intel", "kmp_affinity=compact"], {"backend": ("eager", "torchscript", "inductor")}),
    (["backend=onnxruntime", "ort_inter_threads=2", "ort_execution=parallel"], {}),
    (["backend=openvino", "ov_streams=2", "omp_threads=2"], {}),
])
def test_pins_hold_in_every_sample_and_narrow_the_knobs_their_conditions_read(
        pinned: list[str], narrowed: dict[str, tuple[str, ...]]) -> None:
    space_pinned = space_fit.pin(adapted(), pins(*pinned), EVERYTHING)
    for name, choices in narrowed.items():
        assert space_pinned.get(name).choices == choices  # type: ignore[union-attr]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(30):
        config = space_pinned.sample(study.ask())
        assert all(config.text(name) == value for name, _, value in (p.partition("=") for p in pinned))


def test_a_knob_of_one_runtime_with_another_backend_breaks_its_condition() -> None:
    with pytest.raises(ConfigError, match=r"^ov_hint applies only with backend=openvino \(here backend=inductor\)"):
        pins("ov_hint=throughput", "backend=inductor")
    with pytest.raises(ConfigError, match=r"^omp_runtime applies only with backend=eager/torchscript/inductor"):
        pins("omp_runtime=intel", "backend=openvino")
    with pytest.raises(ConfigError, match=r"^allocator=jemalloc applies only with backend=eager/torchscript/inductor/"
                                          r"onnxruntime/llamacpp \(here backend=openvino\)"):
        pins("allocator=jemalloc", "backend=openvino")
    fitted = space_fit.pin(adapted(), pins("backend=onnxruntime"), EVERYTHING)
    with pytest.raises(SpaceError, match="--set omp_runtime=intel needs backend=eager/torchscript/inductor, which "
                                         "the search space"):
        space_fit.pin(fitted, pins("omp_runtime=intel"), EVERYTHING)


def test_a_peer_recipe_as_run_sets_its_runtime_s_knobs_at_their_defaults_and_no_openmp() -> None:
    full = adapted(cores=2).as_run(Config.from_mapping({"backend": "openvino"}))
    assert full is not None and full.describe() == (
        "backend=openvino precision=fp32 ov_hint=latency ov_streams=0 ov_pinning=on omp_threads=2 allocator=default "
        "instances=1 dataloader_workers=0")
    full = adapted(cores=2).as_run(Config.from_mapping({"backend": "onnxruntime"}))
    assert full is not None and "ort_optimization=all ort_execution=sequential" in full.describe()
    assert "ort_inter_threads" not in full.describe() and "omp_runtime" not in full.describe()


@pytest.mark.parametrize(("objective", "bf16", "int8", "installed", "expected"), [
    ("latency", False, True, {"openvino": True, "onnxruntime": True},
     ["OpenVINO defaults (LATENCY hint)", "OpenVINO int8 (NNCF)", "ONNX Runtime defaults", "seed"]),
    ("latency", True, True, {"openvino": True, "onnxruntime": True},
     ["OpenVINO defaults (LATENCY hint)", "OpenVINO bf16", "OpenVINO int8 (NNCF)", "ONNX Runtime defaults", "seed"]),
    ("latency", False, False, {"openvino": True, "onnxruntime": False}, ["OpenVINO defaults (LATENCY hint)", "seed"]),
    ("latency", True, True, None, ["seed"]),
    ("throughput", True, False, {"onnxruntime": True},
     ["ONNX Runtime defaults", "ONNX Runtime defaults, one instance per node", "seed"]),
    ("throughput", True, False, {"openvino": True},
     ["OpenVINO defaults (LATENCY hint)", "OpenVINO bf16", "OpenVINO defaults (LATENCY hint), one instance per node",
      "OpenVINO bf16, one instance per node", "seed"]),
])
def test_peer_recipes_come_first_where_their_runtime_is_installed(
        objective: str, bf16: bool, int8: bool, installed: dict[str, bool] | None, expected: list[str]) -> None:
    found = recipes.recipes(lscpu("xeon_2s_ht"), objective, probes.refusing(bf16=not bf16, int8=not int8), installed)
    assert [r.name for r in found][:len(expected)] == expected
    assert [r.peer for r in found][:len(expected)] == [True] * (len(expected) - 1) + [False]
    by_name = {r.name: r.config.describe() for r in found}
    assert by_name.get("OpenVINO int8 (NNCF)", "backend=openvino precision=int8") == "backend=openvino precision=int8"
    assert by_name.get("OpenVINO bf16", "backend=openvino precision=bf16") == "backend=openvino precision=bf16"
    if objective == "throughput" and bf16 and (installed or {}).get("openvino"):
        assert by_name["OpenVINO bf16, one instance per node"] == (
            "backend=openvino precision=bf16 omp_threads=4 instances=2")
    if objective == "throughput" and (installed or {}).get("onnxruntime"):
        assert by_name["ONNX Runtime defaults, one instance per node"] == (
            "backend=onnxruntime omp_threads=4 instances=2")


def test_peer_recipes_run_where_the_space_offers_them() -> None:
    found = recipes.recipes(lscpu("xeon_2s_ht"), "latency", probes.refusing(bf16=True),
                            {"openvino": True, "onnxruntime": True})
    kept, _ = recipes.fitting(found, adapted())
    assert [r.name for r in kept][:3] == ["OpenVINO defaults (LATENCY hint)", "OpenVINO int8 (NNCF)",
                                          "ONNX Runtime defaults"]
    no_int8 = space_fit.for_probe(adapted(), probes.refusing(int8=True))  # a CPU whose probe refused every int8
    kept, note = recipes.fitting(found, no_int8)
    assert "OpenVINO int8 (NNCF) (precision=int8)" in note
    bf16 = recipes.recipes(lscpu("xeon_2s_ht"), "latency", probes.refusing(int8=True), {"openvino": True})
    assert "OpenVINO bf16" in [r.name for r in recipes.fitting(bf16, adapted())[0]]
    no_bf16 = space_fit.for_probe(adapted(), probes.refusing(bf16=True))
    kept, note = recipes.fitting(bf16, no_bf16)  # a space another CPU's probe fitted
    assert "OpenVINO bf16" not in [r.name for r in kept] and "OpenVINO bf16 (precision=bf16)" in note
    kept, note = recipes.fitting(found, space_fit.adapt(space.load(space.find("quick")), 4, EVERYTHING))
    assert not any(r.peer for r in kept) and "ONNX Runtime defaults (backend=onnxruntime)" in note
