"""int8_fallback: the knob (its conditions, its key, the env file), the ranking that chooses the layers
kept in fp32 (a planted sensitive layer found, the ranking kept and read back, the proxy of a larger
model), and a real bench whose accuracy drop shrinks with the layer kept (e2e)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.base.errors import ConfigError
from autotune.cli import display
from autotune.config.knobs import Config
from autotune.model import apply, fallback
from autotune.model.errors import ApplyError
from autotune.model.knobs import ModelKnobs
from tests.conftest import FIXTURES, NEEDS_INT8, NEEDS_PEERS
from tests.support.cli import QUICK_BENCH, assert_one_error_line

INT8 = {"backend": "inductor", "precision": "int8"}


def test_the_knob_parses_travels_in_the_env_file_and_is_keyed_only_where_it_keeps_a_layer() -> None:
    config = Config.from_assignments(["backend=inductor", "precision=int8", "int8_fallback=2"])
    assert config.describe() == "backend=inductor precision=int8 int8_fallback=2"
    knobs = ModelKnobs(**INT8, int8_fallback=2)  # type: ignore[arg-type]
    knobs.check()
    env = apply.to_env(knobs)
    assert env["AUTOTUNE_INT8_FALLBACK"] == "2" and apply.knobs_from_env(env) == knobs
    assert knobs.runs_in.saved_knobs(knobs)["int8_fallback"] == 2
    unkept = ModelKnobs(**INT8)  # type: ignore[arg-type]
    assert "int8_fallback" not in unkept.runs_in.saved_knobs(unkept)  # the keys artifacts had before the knob
    with pytest.raises(ConfigError, match=r"^int8_fallback=-1 is not allowed; use an integer from 0 to 4096$"):
        Config.from_assignments(["backend=inductor", "precision=int8", "int8_fallback=-1"])


@pytest.mark.parametrize(("sets", "message"), [
    (["precision=fp32"], "int8_fallback applies only with backend=inductor/openvino (here backend=eager)"),
    (["backend=inductor"], "int8_fallback applies only with precision=int8 (here precision=fp32)"),
    (["backend=onnxruntime", "precision=int8"],
     "int8_fallback applies only with backend=inductor/openvino (here backend=onnxruntime)"),
    (["backend=inductor", "precision=int8_dynamic"],
     "int8_fallback applies only with precision=int8 (here precision=int8_dynamic)"),
])
def test_where_it_cannot_apply_it_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, sets: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    flags = [arg for assignment in [*sets, "int8_fallback=1"] for arg in ("--set", assignment)]
    assert_one_error_line(capsys, tmp_path, f"Error: {message}; set ", "bench", "--model", "resnet18", *flags)
    env = {f"AUTOTUNE_{name.upper()}": value for name, value in (a.split("=") for a in [*sets, "int8_fallback=1"])}
    with pytest.raises(ApplyError, match=re.escape(message)):  # what `autotune.apply` says of such an env file
        apply.knobs_from_env(env).check()


def test_the_artifact_and_graph_are_keyed_by_the_count_and_the_ranking_is_not(tmp_path: Path) -> None:
    import torch

    from autotune.model.artifacts import artifact_path
    from autotune.model.backends.inductor import graph_path
    from autotune.model.convert import artifact_meta

    example = torch.zeros(2, 64)
    metas = {k: artifact_meta(ModelKnobs(**INT8, int8_fallback=k), example, "w", "cal")  # type: ignore[arg-type]
             for k in (0, 1, 2)}
    assert len({artifact_path(tmp_path, meta, ".pt2", "inductor") for meta in metas.values()}) == 3
    assert len({graph_path(tmp_path, meta) for meta in metas.values()}) == 3
    assert len({fallback.ranking_path(tmp_path, meta) for meta in metas.values()}) == 1


def _outlier_and_batches() -> tuple[Any, list[Any]]:
    import torch

    from tests.fixtures.models import tinynets

    generator = torch.Generator().manual_seed(0)
    return tinynets.outlier(), [torch.randn(8, 1, 8, 8, generator=generator) for _ in range(4)]


def test_the_ranking_finds_the_planted_layer_and_is_kept_for_every_count(tmp_path: Path) -> None:
    """`head` reads a feature a thousand times larger than the rest (tinynets.Outlier): quantizing
    without it alone brings the output back to fp32's, so it ranks first and k=1 keeps it; the
    ranking is kept beside the artifacts and the next quantization (another count) reads it."""
    from autotune.model import quantize

    model, batches = _outlier_and_batches()
    described = {"knobs": {**INT8, "int8_fallback": 1}, "calibration": quantize.digest(batches)}
    first: dict[str, Any] = {}
    quantize.quantized_export(model, batches[0], batches, first, keep_fp32=1, folder=tmp_path, described=described)
    assert first["int8_kept_fp32"] == ["head"]
    assert first["int8_divergence"] < first["int8_divergence_full"] / 100
    assert first["int8_ranking_s"] > 0 and first["int8_ranking"] == {
        "layers": 3, "reverted": 3, "took_s": first["int8_ranking_s"], "candidates_by": "every layer", "reused": False}
    kept = fallback.read_ranking(fallback.ranking_path(tmp_path, described))
    assert kept is not None and kept.order[0] == "head" and set(kept.order) == {"stem", "wide", "head"}
    assert kept.reverted["head"] < kept.reverted["stem"] and kept.reverted["head"] < kept.reverted["wide"]
    second: dict[str, Any] = {}
    two = described | {"knobs": {**INT8, "int8_fallback": 2}}
    quantize.quantized_export(model, batches[0], batches, second, keep_fp32=2, folder=tmp_path, described=two)
    assert "int8_ranking_s" not in second and second["int8_ranking"]["reused"]
    assert second["int8_kept_fp32"] == list(kept.order[:2])
    unkept: dict[str, Any] = {}
    quantize.quantized_export(model, batches[0], batches, unkept)
    assert not any(key.startswith("int8_") for key in unkept)  # k=0 costs nothing more


def test_a_larger_model_reverts_only_the_candidates_its_proxy_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """With more layers than `REVERTED`, each layer's own rounding error picks the candidates: the
    planted layer is one, and only they are quantized without."""
    import torch

    from autotune.model import quantize

    monkeypatch.setattr(fallback, "REVERTED", 1)
    model, batches = _outlier_and_batches()
    setup: dict[str, Any] = {}
    quantize.quantized_export(model, batches[0], batches, setup, keep_fp32=1)
    assert setup["int8_kept_fp32"] == ["head"]
    assert setup["int8_ranking"]["reverted"] == 1 and setup["int8_ranking"]["candidates_by"] == "proxy"
    proxy = fallback.proxy_errors(model, batches, ("stem", "wide", "head"), reduce_range=False)
    assert max(proxy, key=proxy.__getitem__) == "head" and proxy["head"] > 10 * proxy["stem"]
    captured = torch.export.export(model, (batches[0],), strict=True).module()
    assert fallback.layers(captured) == ("stem", "wide", "head")


def test_what_bench_says_of_the_layers_kept() -> None:
    said = display.fallback_text({"int8_kept_fp32": ["head"], "int8_divergence_full": 0.00715,
                                  "int8_divergence": 3.29e-07, "int8_ranking": {
                                      "layers": 3, "reverted": 3, "took_s": 1.4, "reused": False}})
    assert said == ("int8_fallback: kept in fp32 head; KL divergence from fp32 on the calibration batches 0.00715 "
                    "with every layer int8, 3.29e-07 with these kept; 3 layers, 3 reverted one by one, ranked here "
                    "(ranking took 1.4 s)")


@pytest.mark.e2e
@NEEDS_INT8
@pytest.mark.parametrize(("backend", "head"), [
    ("inductor", "head"), pytest.param("openvino", "__module.head/aten::linear/MatMul", marks=NEEDS_PEERS)])
def test_bench_keeps_the_planted_layer_and_the_accuracy_drop_shrinks(tmp_path: Path, backend: str, head: str) -> None:
    """The real thing: labels are fp32's answers on the user's data, int8 of every layer (PT2E's, or
    NNCF's for OpenVINO) loses many of them, int8_fallback=1 keeps `head` in fp32 (ranked on the data's
    calibration part) and wins them back; each count is an artifact of its own."""
    import torch

    from tests.fixtures.models import tinynets

    inputs = torch.randn(300, 1, 8, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        labels = tinynets.outlier()(inputs).argmax(dim=1)
    torch.save({"inputs": inputs, "labels": labels}, tmp_path / "data.pt")
    autotune = str(Path(sys.executable).with_name("autotune"))
    found = {}
    for k in (0, 1):
        command = [autotune, "bench", "--model", "tinynets:outlier", "--input-shape", "1x8x8", *QUICK_BENCH,
                   "--cache-dir", str(tmp_path / "cache"), "--json", "--eval-data", str(tmp_path / "data.pt"),
                   "--tolerance", "2", "--set", f"backend={backend}", "--set", "precision=int8",
                   "--set", f"int8_fallback={k}"]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=FIXTURES / "models")
        assert proc.returncode == 0, proc.stderr
        found[k] = json.loads(proc.stdout)
    setups = {k: data["result"]["instances"][0]["setup"] for k, data in found.items()}
    drops = {k: data["quality"]["drop"] for k, data in found.items()}
    assert "int8_kept_fp32" not in setups[0] and setups[1]["int8_kept_fp32"] == [head]
    assert setups[1]["int8_divergence"] < setups[1]["int8_divergence_full"]
    assert setups[0]["artifact_file"] != setups[1]["artifact_file"]
    assert drops[0] > 20 and drops[1] < drops[0] / 4, drops
    assert len(list((tmp_path / "cache" / "artifacts").glob("int8ranking-*.json"))) == 1


@pytest.mark.e2e
@NEEDS_INT8
def test_a_process_that_loads_the_artifact_says_what_it_keeps(tmp_path: Path) -> None:
    """The layers kept are in the artifact's description: a later process that loads it (a hit, or
    another thread count compiled from the saved graph) records them and the ranking as read."""
    import torch

    model, batches = _outlier_and_batches()
    chosen = apply.Deployment(ModelKnobs(**INT8, int8_fallback=1), 2.0, tmp_path)  # type: ignore[arg-type]
    setups: list[dict[str, Any]] = [{}, {}, {}]
    threads = torch.get_num_threads()
    try:
        for setup, count in zip(setups, (1, 1, 2), strict=True):
            torch.set_num_threads(count)
            apply.apply_deployment(model, batches[0], chosen, check=True, setup=setup, calibration=batches)
    finally:
        torch.set_num_threads(threads)
    first, hit, other = setups
    assert not first["artifact_hit"] and hit["artifact_hit"] and "quantized_graph_load_s" in other
    for setup in setups:
        assert setup["int8_kept_fp32"] == ["head"] and setup["top1_agreement"] == 1.0
        assert setup["int8_divergence"] == first["int8_divergence"]
    assert not first["int8_ranking"]["reused"] and hit["int8_ranking"]["reused"] and other["int8_ranking"]["reused"]
    assert "int8_ranking_s" not in hit and "int8_ranking_s" not in other


class _Told:
    """A trial answering the knobs in `told` as told (by knob name, whatever choices Optuna's parameter is
    named after), the rest as FakeTrial does (recording what it was asked)."""

    def __init__(self, told: dict[str, str]) -> None:
        from tests.support.spaces import FakeTrial

        self.inner, self.told = FakeTrial(), told

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.inner.asked[name] = list(choices)
        return self.told.get(name.split(" (")[0], choices[-1])  # `precision (fp32/...)`: named after its choices

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return self.inner.suggest_int(name, low, high, step=step, log=log)


@pytest.mark.parametrize("backend", ["inductor", "openvino"])
def test_the_default_space_samples_it_with_int8_that_keeps_layers_only(backend: str) -> None:
    from autotune.config import space, space_fit

    adapted = space_fit.adapt(space.load(space.find("default")), cores=2, available={})
    int8 = _Told({"backend": backend, "mkldnn": "off", "precision": "int8"})
    assert adapted.sample(int8).get("int8_fallback") == 8
    assert int8.inner.asked["int8_fallback"] == ["0", "1", "2", "4", "8"]  # as Optuna keeps choices
    for told in ({"backend": backend, "precision": "bf16"}, {"backend": "onnxruntime", "precision": "int8"}):
        other = _Told({"mkldnn": "off", **told})
        assert not adapted.sample(other).is_set("int8_fallback") and "int8_fallback" not in other.inner.asked
