"""precision=int8: where it is offered, its condition (backend=inductor), its guard, its failures,
and a real quantized model through `bench` (e2e)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.base.errors import ConfigError
from autotune.config import space, space_fit
from autotune.config.knobs import Config
from autotune.host import machine
from autotune.host.capabilities import Probe
from autotune.measure import requests
from autotune.model import cpu
from autotune.model.errors import ApplyError, failed_op
from autotune.model.knobs import ModelKnobs
from autotune.search import opening
from tests.conftest import FIXTURES, NEEDS_INT8
from tests.support import probes
from tests.support.cli import QUICK_BENCH, run_cli
from tests.support.spaces import FakeTrial, every

XEON = FIXTURES / "lscpu" / "xeon_2s_ht.txt"
NO_VNNI = ("AMD EPYC 7B13", frozenset({"avx2", "fma"}))  # a Zen 3: AVX2, no AVX-512, no VNNI


def search_space(monkeypatch: pytest.MonkeyPatch, probe: Probe,
                 flags: tuple[str, frozenset[str]] = NO_VNNI) -> space.SearchSpace:
    monkeypatch.setattr(cpu, "cpuinfo", lambda: flags)
    # a model whose work is in Linear layers, so int8_dynamic and int8_weight_only are offered too
    request = opening.SearchRequest(model="vit_b_16", trials=2, space=space.find("default"))
    return opening.validate(request, machine.described_machine(XEON), probe)[1]


def test_int8_is_offered_on_a_cpu_without_vnni_whose_probe_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CPU flag decides: a Zen 3 without VNNI whose probe runs int8 well gets every int8."""
    adapted = search_space(monkeypatch, probes.everything_runs())
    assert adapted.get("precision").choices == (  # type: ignore[union-attr]
        "fp32", "bf16", "int8", "int8_dynamic", "int8_weight_only")
    assert not [n for n in adapted.notes if "precision" in n]
    ModelKnobs(backend="inductor", precision="int8").check()
    ModelKnobs(precision="int8_dynamic").check()
    requests.make_plan(requests.BenchRequest("resnet18", Config.from_assignments(
        ["backend=inductor", "precision=int8"])), machine.this_machine())


def test_a_precision_whose_probe_fails_is_dropped_with_the_probe_message(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = {**probes.failing("torch:int8:conv", "RuntimeError: could not create a primitive"),
              **probes.failing("torch:int8:matmul", "RuntimeError: could not create a primitive")}
    adapted = search_space(monkeypatch, probes.probe(failed))
    assert "int8" in adapted.get("precision").choices  # type: ignore[union-attr]  # OpenVINO's and ONNX Runtime's run
    assert ("precision=int8 only with backend=openvino/onnxruntime: with inductor, its probe failed: RuntimeError: "
            "could not create a primitive") in adapted.notes
    small = space.SearchSpace("small", (adapted.get("backend"), adapted.get("precision")))  # type: ignore[arg-type]
    assert "backend=inductor precision=int8" not in {c.describe() for c in every(small)}
    everywhere = {f"{r}:int8:{op}": probes.failing("", "RuntimeError: no int8")[""]
                  for r in ("torch", "openvino", "onnxruntime") for op in ("conv", "matmul")}
    adapted = search_space(monkeypatch, probes.probe(everywhere))
    assert "int8" not in adapted.get("precision").choices  # type: ignore[union-attr]
    assert ("precision=int8 dropped: PyTorch: its probe failed: RuntimeError: no int8; OpenVINO: its probe failed: "
            "RuntimeError: no int8; ONNX Runtime: its probe failed: RuntimeError: no int8") in adapted.notes


def test_a_precision_measured_3x_slower_than_fp32_is_dropped_with_the_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    slow = {"torch:int8_dynamic:matmul": {"gops": {"1": 33.0, "2": 66.0}}}
    adapted = search_space(monkeypatch, probes.probe(slow))
    assert "int8_dynamic" not in adapted.get("precision").choices  # type: ignore[union-attr]
    assert "precision=int8_dynamic dropped: it measured 3.0x slower than fp32 in its probe (matmul)" in adapted.notes
    # `bench` measures it all the same, and says why a search does not offer it
    note = requests.check_runs_here(requests.BenchRequest("vit_b_16", Config.from_assignments(
        ["precision=int8_dynamic"])), probes.probe(slow))
    assert note == ("precision=int8_dynamic with backend=eager: it measured 3.0x slower than fp32 in its probe "
                    "(matmul), so a search does not offer it")


def test_bench_refuses_a_precision_its_probe_could_not_run_in_one_line() -> None:
    failed = probes.probe(probes.failing("torch:int8:conv", "RuntimeError: could not create a primitive"))
    with pytest.raises(ConfigError, match=r"^precision=int8 cannot run here with backend=inductor: its probe failed: "
                                          r"RuntimeError: could not create a primitive; use precision=fp32 \(or "
                                          r"`autotune doctor --probe` to measure this CPU again\)$"):
        requests.check_runs_here(requests.BenchRequest("resnet18", Config.from_assignments(
            ["backend=inductor", "precision=int8"])), failed)


def test_int8_is_offered_only_with_a_backend_that_quantizes(monkeypatch: pytest.MonkeyPatch) -> None:
    adapted = search_space(monkeypatch, probes.probe(probes.failing("torch:bf16:matmul", "RuntimeError: no")))
    assert adapted.get("precision").choices == ("fp32", "bf16", "int8", "int8_dynamic", "int8_weight_only")  # type: ignore[union-attr]
    small = space.SearchSpace("small", (adapted.get("backend"), adapted.get("precision")))  # type: ignore[arg-type]
    assert {c.describe() for c in every(small)} == {
        "backend=eager precision=fp32", "backend=torchscript precision=fp32",
        "backend=inductor precision=fp32", "backend=inductor precision=int8", "backend=openvino precision=fp32",
        "backend=openvino precision=int8", "backend=openvino precision=bf16", "backend=onnxruntime precision=fp32",
        "backend=onnxruntime precision=int8", "backend=eager precision=int8_dynamic",
        "backend=eager precision=int8_weight_only", "backend=inductor precision=int8_dynamic",
        "backend=inductor precision=int8_weight_only"}


def test_precision_is_its_own_optuna_parameter_where_int8_is_not_offered() -> None:
    """Optuna refuses other choices under one parameter name across trials."""
    adapted = space_fit.adapt(space.load(space.find("default")), cores=2, available={})
    eager = FakeTrial()
    adapted.sample(_Fixed(eager, backend="eager"))
    eager_param = "precision (fp32/bf16/int8_dynamic/int8_weight_only)"
    assert eager.asked[eager_param] == ["fp32", "bf16", "int8_dynamic", "int8_weight_only"]
    assert "precision" not in eager.asked
    inductor = FakeTrial()
    assert adapted.sample(_Fixed(inductor, backend="inductor")).get("precision") == "int8_weight_only"
    assert inductor.asked["precision"] == ["fp32", "bf16", "int8", "int8_dynamic", "int8_weight_only"]
    config = Config.from_assignments(["backend=eager", "precision=bf16"])
    assert adapted.params(config) == {"backend": "eager", eager_param: "bf16"}


class _Fixed:
    """A trial that answers `backend` as told, mkldnn off, and the rest as FakeTrial does."""

    def __init__(self, inner: FakeTrial, backend: str) -> None:
        self.inner, self.told = inner, {"backend": backend, "mkldnn": "off"}

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self.told[name] if name in self.told else self.inner.suggest_categorical(name, choices)

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return self.inner.suggest_int(name, low, high, step=step, log=log)


def test_int8_needs_a_backend_that_quantizes() -> None:
    with pytest.raises(ConfigError, match=r"^precision=int8 applies only with backend=inductor/openvino/onnxruntime "
                                          r"\(here backend=eager\); set backend or drop precision$"):
        Config.from_assignments(["precision=int8"])
    assert Config.from_assignments(["backend=inductor", "precision=int8"]).describe() == \
        "backend=inductor precision=int8"


def test_a_bad_calibration_flag_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "bench", "--model", "resnet18", "--calibration-batches", "0")
    assert code == 2
    assert err == ("Error: Invalid value for '--calibration-batches': 0 is not in the range x>=1. "
                   "(see `autotune bench --help`)\n")


def test_a_quantizer_failure_names_the_operator() -> None:
    def _annotate_conv2d_binary_unary() -> None:
        raise ValueError("Input partition has more than one output node")

    try:
        _annotate_conv2d_binary_unary()
    except ValueError as exc:
        assert failed_op(exc) == "aten.conv2d (the quantizer's _annotate_conv2d_binary_unary)"
    assert failed_op(RuntimeError("no kernel for aten::max_pool3d")) == "aten.max_pool3d"


@pytest.mark.e2e
def test_a_model_torch_export_cannot_capture_fails_naming_the_line() -> None:
    import torch

    from autotune.model import quantize
    from tests.fixtures.models import tinynets

    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(ApplyError, match=r"^precision=int8: torch.export could not capture the model at "
                                         r"`return y if y.sum\(\) > 0 else -y` \(tinynets.py:\d+, in forward\)"):
        quantize.quantized_export(tinynets.branchy(), x, [x], {})


@pytest.mark.e2e
@NEEDS_INT8
def test_the_guard_fails_a_broken_quantization(tmp_path: Path) -> None:
    """Calibrated on inputs 10^4 times too small, the scales clip every real activation: the
    compiled int8 model runs, and the guard calls its answers wrong; calibrated on the inputs
    themselves, it passes and records its figures."""
    import torch

    from autotune.model import apply
    from autotune.model.errors import WrongAnswers
    from tests.fixtures.models import tinynets

    images = [torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    chosen = apply.Deployment(ModelKnobs(backend="inductor", precision="int8"), None, tmp_path)
    setup: dict[str, Any] = {}
    apply.apply_deployment(tinynets.cnn(), images[0], chosen, check=True, setup=setup, calibration=images)
    assert setup["top1_agreement"] >= 0.99 and setup["min_cosine"] >= 0.99 and setup["guard_items"] == 40
    broken = [x * 1e-4 for x in images]
    with pytest.raises(WrongAnswers, match=r"^wrong answers: int8 agrees with eager fp32 on the top-1 answer of "):
        apply.apply_deployment(tinynets.cnn(), images[0], chosen, check=True, calibration=broken,
                                guard_inputs=images)


@pytest.mark.e2e
@NEEDS_INT8
def test_int8_through_bench_quantizes_once_then_loads(tmp_path: Path) -> None:
    autotune = str(Path(sys.executable).with_name("autotune"))
    folder = FIXTURES / "models"
    command = [autotune, "bench", "--model", "tinynets:cnn", "--input-shape", "3x32x32", "--batch-size", "4",
               *QUICK_BENCH, "--cache-dir", str(tmp_path / "cache"), "--json", "--calibration-batches", "2",
               "--set", "backend=inductor", "--set", "precision=int8"]
    setups = []
    for _ in range(2):
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=folder)
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert data["result"]["ok"] and data["result"]["throughput_ips"] > 0
        assert "--calibration-batches" in data["plan"]["instances"][0]["command"]
        setups.append(data["result"]["instances"][0]["setup"])
    first, second = setups
    assert not first["artifact_hit"] and first["quantize_s"] > 0
    assert first["top1_agreement"] >= 0.99 and first["guard_items"] == 36  # the example + 8 batches of 4
    assert second["artifact_hit"] and "quantize_s" not in second
    assert second["artifact_file"] == first["artifact_file"]
    assert "guard_reused" not in first and second["guard_reused"]
    assert second["min_cosine"] == first["min_cosine"] and second["guard_items"] == 36


@pytest.mark.e2e
@NEEDS_INT8
def test_another_thread_count_compiles_from_the_saved_quantized_graph(tmp_path: Path) -> None:
    """int8's quantized graph does not depend on the thread count: the first compile saves it, and
    each other thread count's artifact is compiled from it without quantizing again, with the
    model or knowing only its fingerprint and eager outputs (as the benchmark child knows a
    torchvision model); the guard still judges every one of them."""
    import torch

    from autotune.model import apply
    from autotune.model.artifacts import fingerprint
    from tests.fixtures.models import tinynets

    images = [torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    chosen = apply.Deployment(ModelKnobs(backend="inductor", precision="int8"), None, tmp_path)
    model = tinynets.cnn().eval()
    known = apply.eager_outputs(model, apply.checked_batches(images[0], chosen, images))
    threads = torch.get_num_threads()
    setups: list[dict[str, Any]] = [{}, {}, {}]
    try:
        torch.set_num_threads(1)
        assert apply.apply_saved(images[0], chosen, fingerprint(model), known, setup={}, calibration=images) is None
        apply.apply_deployment(model, images[0], chosen, check=True, setup=setups[0], calibration=images)
        torch.set_num_threads(2)
        apply.apply_deployment(model, images[0], chosen, check=True, setup=setups[1], calibration=images)
        torch.set_num_threads(3)
        applied = apply.apply_saved(images[0], chosen, fingerprint(model), known, setup=setups[2],
                                     calibration=images)
    finally:
        torch.set_num_threads(threads)
    first, *later = setups
    assert first["quantize_s"] > 0 and "quantized_graph_load_s" not in first
    for setup in later:
        assert "quantize_s" not in setup and setup["quantized_graph_load_s"] > 0
        assert not setup["artifact_hit"] and setup["compile_s"] > 0 and setup["top1_agreement"] >= 0.99
    assert len({s["artifact_file"] for s in setups}) == 3 and len(list(tmp_path.glob("int8graph-*.pt2"))) == 1
    assert applied is not None and applied(images[1]).shape == (8, 10)


@pytest.mark.e2e
@NEEDS_INT8
def test_apply_without_calibration_loads_the_artifact_the_study_calibrated(tmp_path: Path) -> None:
    """The study's child calibrates on batches of its own and leaves them beside the artifact: a
    program applying the same model without batches of its own calibrates on those, so it loads the
    artifact that was measured instead of quantizing and compiling another on its example. A model
    with other weights, or a damaged file, calibrates on its example as before."""
    import torch

    from autotune.model import apply
    from tests.fixtures.models import tinynets

    images = [torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    chosen = apply.Deployment(ModelKnobs(backend="inductor", precision="int8"), None, tmp_path)

    def applied(model: Any, example: Any, calibration: list[Any]) -> dict[str, Any]:
        setup: dict[str, Any] = {}
        apply.apply_deployment(model, example, chosen, check=True, setup=setup, calibration=calibration)
        return setup

    study = applied(tinynets.cnn(), images[0], images[1:])
    saved = sorted(tmp_path.glob("int8calibration-*.pt"))
    assert study["calibration"] == "given" and len(saved) == 1
    served = applied(tinynets.cnn(), images[3], [])
    assert served["calibration"] == f"saved: {saved[0].name}"
    assert served["artifact_hit"] and served["artifact_file"] == study["artifact_file"]
    assert "quantize_s" not in served and served["top1_agreement"] >= 0.99
    assert applied(tinynets.cnn(), images[3], images[:2])["calibration"] == "given"  # the caller's own win
    assert sorted(tmp_path.glob("int8calibration-*.pt")) == saved  # and do not replace the study's

    other = tinynets.cnn()
    with torch.no_grad():
        other[0].weight.mul_(1.5)
    retrained = applied(other, images[3], [])
    assert retrained["calibration"] == "the example" and not retrained["artifact_hit"]
    saved[0].write_bytes(b"not a tensor file")
    damaged = applied(tinynets.cnn(), images[3], [])
    assert damaged["calibration"] == "the example" and not damaged["artifact_hit"]
    described = json.loads(Path(f"{saved[0]}.json").read_text())
    assert described["batches"] == 3 and described["calibration"] == \
        json.loads(Path(f"{study['artifact_file']}.json").read_text())["calibration"]


@pytest.mark.e2e
@NEEDS_INT8
def test_the_int8_guard_is_reused_only_for_the_same_answer_and_judged_again(tmp_path: Path) -> None:
    """The guard's figures are kept in the artifact's description: a later process loading the
    same artifact for the same inputs reuses them when its answer on the example is the guarded
    one, judging them against its own tolerance; a record whose answer differs is measured again."""
    import torch

    from autotune.model import apply
    from autotune.model.errors import WrongAnswers
    from tests.fixtures.models import tinynets

    images = [torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    chosen = apply.Deployment(ModelKnobs(backend="inductor", precision="int8"), None, tmp_path)

    def applied() -> dict[str, Any]:
        setup: dict[str, Any] = {}
        apply.apply_deployment(tinynets.cnn(), images[0], chosen, check=True, setup=setup, calibration=images)
        return setup

    first, second = applied(), applied()
    assert "guard_reused" not in first and second["guard_reused"] and second["artifact_hit"]
    assert {k: second[k] for k in ("top1_agreement", "min_cosine", "guard_items")} == \
        {k: first[k] for k in ("top1_agreement", "min_cosine", "guard_items")}
    described = Path(f"{first['artifact_file']}.json")
    meta = json.loads(described.read_text())
    (key,) = meta["guarded"]
    record = meta["guarded"][key]
    described.write_text(json.dumps(meta | {"guarded": {key: record | {"top1_agreement": 0.5}}}))
    with pytest.raises(WrongAnswers, match="top-1 answer of 50.0% of 32 inputs"):
        applied()
    moved = [record["output_digest"][0] + 1.0, record["output_digest"][1]]
    described.write_text(json.dumps(meta | {"guarded": {key: record | {"top1_agreement": 0.5,
                                                                        "output_digest": moved}}}))
    third = applied()
    assert "guard_reused" not in third and third["top1_agreement"] == first["top1_agreement"]
    assert json.loads(described.read_text())["guarded"][key]["output_digest"] == record["output_digest"]


def test_aotinductor_compiles_under_no_grad_whatever_the_callers_grad_mode(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With grad enabled, freezing keeps the weights as they are and int8's weight packing never
    happens: an int8 resnext101 compiled from its saved graph outside no_grad ran 5.7x slower in a
    search. Every compile goes through one function, which switches grad off itself."""
    import torch
    import torch._inductor

    from autotune.model.backends import inductor

    seen: list[bool] = []
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package",
                        lambda exported, package_path, inductor_configs: seen.append(torch.is_grad_enabled()))
    with torch.enable_grad():
        inductor._aot_compile(object(), tmp_path / "a.pt2")
        assert torch.is_grad_enabled()
    assert seen == [False]


@pytest.mark.parametrize(("said", "expected"), [
    ("CppCompileError: C++ compile error\n/usr/bin/ld: final link failed: No space left on device",
     "AOTInductor could not compile the model: no space left on the disk of its build folder ({folder}) or of "
     "TMPDIR; free space there and run again"),
    ("CppCompileError: C++ compile error\nx.cpp:1: error: 'y' was not declared",
     "AOTInductor could not compile the model (RuntimeError: CppCompileError: C++ compile error); check that a C++ "
     "compiler is installed, or use backend=torchscript"),
])
def test_a_compile_that_ran_out_of_disk_says_so_not_that_the_compiler_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, said: str, expected: str) -> None:
    import torch._inductor

    from autotune.model.backends import inductor

    def fail(exported: object, package_path: str, inductor_configs: object) -> None:
        raise RuntimeError(said)

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", fail)
    with pytest.raises(ApplyError) as caught:
        inductor._aot_compile(object(), tmp_path / "a.pt2")
    assert str(caught.value) == expected.format(folder=tmp_path)
