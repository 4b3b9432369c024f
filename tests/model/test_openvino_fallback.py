"""int8_fallback with backend=openvino: NNCF's quantized nodes, ranked by quantizing without each
(the planted sensitive layer found), kept out of the quantization by NNCF's IgnoredScope, the ranking
kept for every count, and the layers kept recorded in the artifact a later process loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.model import apply, fallback
from autotune.model.backends import openvino
from autotune.model.knobs import ModelKnobs
from tests.conftest import NEEDS_INT8, NEEDS_PEERS
from tests.fixtures.models import tinynets

pytestmark = NEEDS_PEERS
HEAD = "__module.head/aten::linear/MatMul"  # tinynets.Outlier's planted layer, as OpenVINO's conversion names it
BATCHES = [torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(s)) for s in range(4)]


def _knobs(keep: int) -> ModelKnobs:
    return ModelKnobs(backend="openvino", precision="int8", int8_fallback=keep)


def _applied(folder: Path, keep: int) -> dict[str, Any]:
    setup: dict[str, Any] = {}
    apply.apply_deployment(tinynets.outlier(), BATCHES[0], apply.Deployment(_knobs(keep), 2.0, folder),
                           check=True, setup=setup, calibration=BATCHES)
    return setup


def test_each_count_is_its_own_artifact_and_zero_keys_as_before() -> None:
    assert "int8_fallback" not in openvino.OPENVINO.saved_knobs(_knobs(0))
    assert openvino.OPENVINO.saved_knobs(_knobs(2))["int8_fallback"] == 2
    _knobs(2).check()


def test_the_quantized_nodes_are_those_whose_inputs_nncf_changed() -> None:
    import openvino as ov

    model = tinynets.outlier()
    converted = ov.convert_model(model, example_input=BATCHES[0])
    full = openvino._nncf_quantized(model, converted, BATCHES)
    names = openvino.quantized_layers(converted, full)
    assert names == tuple(f"__module.{layer}/aten::linear/MatMul" for layer in ("stem", "wide", "head"))
    assert openvino.quantized_layers(converted, openvino._nncf_quantized(model, converted, BATCHES, (HEAD,))) == \
        names[:2]  # IgnoredScope left it in fp32


@NEEDS_INT8
def test_the_planted_layer_is_kept_the_ranking_read_by_every_count_and_recorded(tmp_path: Path) -> None:
    one = _applied(tmp_path, 1)
    assert one["int8_kept_fp32"] == [HEAD]
    assert one["int8_divergence"] < one["int8_divergence_full"] / 100
    assert not one["int8_ranking"]["reused"] and one["int8_ranking"]["layers"] == 3 and one["int8_ranking_s"] > 0
    ranking = fallback.read_ranking(next(tmp_path.glob("int8ranking-*.json")))
    assert ranking is not None and ranking.order[0] == HEAD and ranking.reverted[HEAD] < ranking.divergence_full / 100
    two = _applied(tmp_path, 2)
    assert two["int8_ranking"]["reused"] and "int8_ranking_s" not in two
    assert two["int8_kept_fp32"] == list(ranking.order[:2]) and two["artifact_file"] != one["artifact_file"]
    hit = _applied(tmp_path, 1)  # a process that only loads the artifact says what it keeps
    assert hit["artifact_hit"] and hit["int8_kept_fp32"] == [HEAD] and hit["int8_ranking"]["reused"]
    assert hit["int8_divergence"] == one["int8_divergence"]
    assert len(list(tmp_path.glob("int8ranking-*.json"))) == 1


def test_a_larger_model_has_its_candidates_chosen_by_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    import openvino as ov

    monkeypatch.setattr(fallback, "REVERTED", 1)
    model = tinynets.outlier()
    converted = ov.convert_model(model, example_input=BATCHES[0])
    ranking = openvino._ranking(model, converted, BATCHES, fallback.outputs(model, BATCHES))
    assert ranking.order[0] == HEAD and list(ranking.reverted) == [HEAD]
    assert set(ranking.proxy) == set(ranking.order) and max(ranking.proxy, key=ranking.proxy.__getitem__) == HEAD
