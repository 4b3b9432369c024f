"""precision=int8_dynamic and int8_weight_only (torchao on nn.Linear): where they are offered, the
one rule that calls them quantized, their guard, and a real model through `bench` (e2e)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.base.errors import ConfigError
from autotune.config import space, space_fit
from autotune.config.knobs import Config
from autotune.host import capabilities
from autotune.model.backends import REGISTRY
from autotune.model.backends.openvino import OPENVINO
from autotune.model.convert import prepare
from autotune.model.errors import ApplyError
from autotune.model.knobs import ModelKnobs
from tests.conftest import FIXTURES, NEEDS_INT8
from tests.support import probes
from tests.support.cli import AUTOTUNE, QUICK_BENCH, run_cli

NO_VNNI = ("Intel(R) Xeon(R) CPU E5-2690 v4", frozenset({"avx2", "fma", "avx512f"}))
LINEAR_INT8 = ("int8_dynamic", "int8_weight_only")


@pytest.mark.parametrize("precision", LINEAR_INT8)
def test_offered_only_with_eager_and_inductor(precision: str) -> None:
    taking = "/".join(b.name for b in REGISTRY if precision in b.precisions or precision in b.generates)
    wrong = re.escape(f"precision={precision} applies only with backend={taking} (here backend=onnxruntime); "
                      f"set backend or drop precision")
    with pytest.raises(ConfigError, match=f"^{wrong}$"):
        Config.from_assignments(["backend=onnxruntime", f"precision={precision}"])
    with pytest.raises(ApplyError, match=f"^{wrong}$"):
        ModelKnobs(backend="onnxruntime", precision=precision).check()  # type: ignore[arg-type]
    if precision in OPENVINO.generates:  # OpenVINO GenAI's weights: a model that does not generate is refused
        with pytest.raises(ApplyError, match=f"^backend=openvino runs precision={precision} for --task generate "
                                             f"alone; with this model use fp32/bf16/int8$"):
            knobs = ModelKnobs(backend="openvino", precision=precision)  # type: ignore[arg-type]
            prepare(torch.nn.Linear(2, 2), torch.zeros(1, 2), knobs, {})
    with pytest.raises(ApplyError, match=f"^precision={precision} applies only with weight_cache=off"):
        ModelKnobs(precision=precision, weight_cache=True).check()  # type: ignore[arg-type]
    for backend in ("eager", "inductor"):
        assert Config.from_assignments([f"backend={backend}", f"precision={precision}"]).text("precision") == precision


def test_a_wrong_backend_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "bench", "--model", "resnet18", "--set", "backend=openvino",
                             "--set", "precision=int8_dynamic")
    assert (code, out) == (2, "")
    assert err == ("Error: precision=int8_dynamic applies only with backend=eager/inductor (here backend=openvino); "
                   "set backend or drop precision\n")


def test_dynamic_int8_that_disagrees_in_its_probe_is_dropped_and_weight_only_stays() -> None:
    """On an AVX2-limited EPYC torchao's dynamic int8 disagreed with fp32 (relative error 0.363) in the
    probe, its 16-bit sums saturating; weight-only computes in fp32 and agreed."""
    wrong = {"torch:int8_dynamic:matmul": {"rel_error": 0.363}}
    adapted = space_fit.for_probe(space_fit.adapt(space.load(space.find("default")), cores=2, available={}),
                                  capabilities.refusals(probes.probe(wrong), "matmul"))
    assert adapted.get("precision").choices == ("fp32", "bf16", "int8", "int8_weight_only")  # type: ignore[union-attr]
    assert ("precision=int8_dynamic dropped: it disagrees with fp32 in its probe (relative error 0.363 on the same "
            "inputs, at most 0.05 allowed)") in adapted.notes
    ModelKnobs(precision="int8_dynamic").check()  # a chosen configuration is converted as asked


def test_one_rule_says_quantized_and_only_int8_calibrates() -> None:
    assert [ModelKnobs(precision=p).quantized for p in ("fp32", "bf16", "int8", *LINEAR_INT8)] == \
        [False, False, True, True, True]  # type: ignore[arg-type]
    assert all(ModelKnobs(precision=p).converts_in_place for p in LINEAR_INT8)  # type: ignore[arg-type]
    assert not ModelKnobs(backend="inductor", precision="int8").converts_in_place  # PT2E exports a copy


def _batches() -> list[Any]:
    import torch

    return [torch.randn(8, 64, generator=torch.Generator().manual_seed(s)) for s in range(5)]


@pytest.mark.e2e
@NEEDS_INT8
@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("precision", LINEAR_INT8)
def test_quantizes_the_linears_and_records_the_guard(tmp_path: Path, backend: str, precision: str) -> None:
    """A random MLP's logits tie closely on a few inputs, so the test allows 10% changed answers."""
    import torch

    from autotune.model import apply
    from tests.fixtures.models import tinynets

    example, *held_out = _batches()
    chosen = apply.Deployment(ModelKnobs(backend=backend, precision=precision), 0.1, tmp_path)  # type: ignore[arg-type]
    model, setup = tinynets.mlp(), {}  # type: ignore[var-annotated]
    applied = apply.apply_deployment(model, example, chosen, check=True, setup=setup, guard_inputs=held_out)
    assert setup["quantized_linears"] == 2 and setup["guard_items"] == 40 and "calibration" not in setup
    assert setup["top1_agreement"] >= 0.9 and setup["min_cosine"] >= 0.99 and setup["max_rel_err"] < 0.05
    assert ("artifact_file" in setup) == (backend == "inductor") and "aot_fallback" not in setup
    with torch.no_grad():
        assert torch.allclose(applied(held_out[0]), tinynets.mlp()(held_out[0]), rtol=0, atol=0.05)


@pytest.mark.e2e
@NEEDS_INT8
def test_apply_quantizes_a_copy_and_the_guard_judges_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import autotune
    from autotune.model.errors import WrongAnswers
    from tests.fixtures.models import tinynets

    monkeypatch.setenv("AUTOTUNE_PRECISION", "int8_dynamic")
    model, batches = tinynets.mlp(), _batches()
    autotune.apply(model, batches[0])
    assert type(model[0].weight) is torch.nn.Parameter and model[0].weight.dtype == torch.float32
    monkeypatch.setenv("AUTOTUNE_TOLERANCE", "0")  # no int8 keeps every cosine similarity at 1
    with pytest.raises(WrongAnswers, match=r"^wrong answers: int8_dynamic agrees with eager fp32 on the top-1 answer "
                                           r"of [\d.]+% of 40 inputs .*; raise --tolerance to accept it$"):
        autotune.apply(model, batches[0], check=True, calibration=batches[1:])


def test_a_model_without_linear_layers_is_one_line() -> None:
    import torch

    from autotune.model.linear_int8 import quantize_linears

    with pytest.raises(ApplyError, match=r"^precision=int8_weight_only quantizes nn.Linear layers and this model has "
                                         r"none; use precision=int8 \(backend=inductor\) or fp32$"):
        quantize_linears(torch.nn.Sequential(torch.nn.ReLU()), ModelKnobs(precision="int8_weight_only"), {})


@pytest.mark.e2e
@NEEDS_INT8
def test_int8_dynamic_through_bench_compiles_once_then_loads(tmp_path: Path) -> None:
    """A second process loads the first one's AOTInductor package (no torchao needed to run it) and
    reuses its guard figures; no calibration batches are asked for."""
    command = [AUTOTUNE, "bench", "--model", "tinynets:mlp", "--input-shape", "64", "--batch-size", "4",
               *QUICK_BENCH, "--cache-dir", str(tmp_path / "cache"), "--json", "--tolerance", "0.1",
               "--set", "backend=inductor", "--set", "precision=int8_dynamic"]
    setups = []
    for _ in range(2):
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=FIXTURES / "models")
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert data["result"]["ok"] and "--calibration-batches" not in data["plan"]["instances"][0]["command"]
        setups.append(data["result"]["instances"][0]["setup"])
    first, second = setups
    assert not first["artifact_hit"] and first["quantized_linears"] == 2 and first["guard_items"] == 36
    assert second["artifact_hit"] and second["artifact_file"] == first["artifact_file"] and second["guard_reused"]
    assert second["top1_agreement"] == first["top1_agreement"] >= 0.9
