"""One suite over every registered backend (as optuna runs one over every sampler): what the rest of
autotune derives from each, and (e2e) convert, guard, save, load and apply through the same path.
Then a toy backend: one module's worth of class and a line in the registry are all it takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.model import apply, backends, convert, knobs
from autotune.model.backends import REGISTRY, Backend, probe
from autotune.model.backends.pytorch import TorchBackend
from autotune.model.knobdefs import PRECISIONS, Knob, KnobValue
from autotune.model.knobs import ModelKnobs
from tests.fixtures.models import tinynets

IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
CALIBRATION = [torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in range(4)]
NAMES = [b.name for b in REGISTRY]


@pytest.mark.parametrize("name", NAMES)
def test_the_knob_table_is_derived_from_the_backend(name: str) -> None:
    backend = backends.get(name)
    assert name in knobs.KNOBS["backend"].choices and backend.summary in knobs.KNOBS["backend"].help
    for knob in backend.knobs:  # its own knobs: in the table, sampled with it (and the others declaring it alike)
        assert knob.only_when[0] == ("backend", (name,)) and knob.model
        (_, sharing), *rest = knobs.KNOBS[knob.name].only_when
        assert name in sharing and tuple(rest) == knob.only_when[1:]
        assert sharing == tuple(b.name for b in REGISTRY if any(k.name == knob.name for k in b.knobs))
    for precision in PRECISIONS[1:]:
        takes = name in dict(knobs.VALUE_CONDITIONS[("precision", precision)])["backend"]
        assert takes == (precision in backend.precisions or precision in backend.generates), precision
    tolerant = dict(knobs.VALUE_CONDITIONS[("allocator", "jemalloc")])["backend"]
    assert (name in tolerant) == backend.preloaded_malloc
    assert (name in knobs.PEER_BACKENDS) == backend.peer


@pytest.mark.parametrize("name", NAMES)
def test_its_recipes_and_probe_kernels_are_its_own(name: str) -> None:
    backend = backends.get(name)
    for _, values in backend.recipes(8):
        assert values.get("backend", "eager") == name
        assert str(values.get("precision", "fp32")) in backend.precisions
    probed = {(k.runtime, k.precision) for k in probe.all_kernels()}
    assert {(backend.runtime, p) for p in backend.precisions} <= probed
    assert backends.of_runtime(backend.runtime).runtime == backend.runtime


@pytest.mark.e2e
# The installed backends that run a forward model (llama.cpp only generates: test_generate_llamacpp.py).
@pytest.mark.parametrize("name", [n for n in NAMES if backends.installed(n) and backends.get(n).precisions])
def test_converted_guarded_saved_loaded_and_applied_the_same_way(tmp_path: Path, name: str) -> None:
    """Every backend through `apply_deployment`, the path the benchmark child and a user's program
    share: the guard passes, a compiled backend saves its artifact once, and the next process loads it."""
    model, chosen = tinynets.cnn(), ModelKnobs(backend=name)  # type: ignore[arg-type]

    def applied() -> tuple[Any, dict[str, Any]]:
        setup: dict[str, Any] = {}
        result = apply.apply_deployment(model, IMAGES, apply.Deployment(chosen, artifacts=tmp_path), check=True,
                                         setup=setup, calibration=CALIBRATION)
        return result, setup

    _, first = applied()
    again, second = applied()
    torch.testing.assert_close(again(IMAGES), model(IMAGES), rtol=1e-3, atol=1e-4)
    assert float(second["max_rel_err"]) < 1e-3
    if chosen.compiled:
        assert (first["artifact_hit"], second["artifact_hit"]) == (False, True)
        saved = Path(second["artifact_file"])
        assert saved.name.startswith(f"{backends.get(name).artifact_kind()}-") and saved.suffix == chosen.runs_in.suffix
        assert all(f.exists() for f in chosen.runs_in.files(saved))
    else:
        assert "artifact_file" not in second


class Pickled(TorchBackend):
    """A toy backend: the module saved whole by torch.save, loaded back by torch.load."""

    name = "pickled"
    summary = "torch.save of the module, loaded back"
    precisions = ("fp32", "bf16")

    def __init__(self) -> None:
        self.knobs = (self.own(Knob("pickle_protocol", "int", "pickle's protocol", low=2, high=5, default=2)),)

    def artifact_kind(self) -> str:
        return self.name

    def build(self, model: Any, example: Any, chosen: ModelKnobs, setup: dict[str, Any], path: Path,
              described: dict[str, Any], quantized: Any) -> Any:
        from autotune.model.artifacts import save_artifact

        save_artifact(path, lambda tmp: torch.save(model, tmp, pickle_protocol=2), described)
        return None

    def load(self, path: Path, chosen: ModelKnobs, example: Any) -> Any:
        return torch.load(path, weights_only=False)

    def recipes(self, cores: int) -> tuple[tuple[str, dict[str, KnobValue]], ...]:
        return (("pickled", {"backend": self.name}),)


def test_a_toy_backend_is_its_class_and_a_registry_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The knob table is built from the registry when autotune is imported; here it is built again
    from the registry with the toy's line, and the rest reads the registry as it runs."""
    toy: Backend = Pickled()
    registry = (*REGISTRY, toy)  # the registry line
    monkeypatch.setattr(backends, "REGISTRY", registry)
    table = knobs._knob_table(registry)
    assert table["backend"].choices[-1] == "pickled" and "pickle_protocol" in table
    assert list(table).index("pickle_protocol") < list(table).index("omp_threads")  # a model knob, before the process's
    conditions = knobs._value_conditions(registry)
    assert "pickled" in dict(conditions[("precision", "bf16")])["backend"]
    assert "pickled" not in dict(conditions[("precision", "int8")])["backend"]
    assert "pickled" in dict(conditions[("allocator", "tcmalloc")])["backend"]
    assert [k for k in probe.all_kernels() if k.runtime == "torch"]  # its runtime's kernels: PyTorch's, probed once
    model = tinynets.cnn()
    setup: dict[str, Any] = {}
    chosen = ModelKnobs(backend="pickled")  # type: ignore[arg-type]
    assert chosen.compiled and not chosen.peer
    forward = convert.prepare(model, IMAGES, chosen, setup, artifacts=tmp_path)
    torch.testing.assert_close(forward(IMAGES), model(IMAGES))
    assert Path(setup["artifact_file"]).name.startswith("pickled-") and setup["artifact_hit"] is False
    again: dict[str, Any] = {}
    convert.prepare(model, IMAGES, chosen, again, artifacts=tmp_path)
    assert again["artifact_hit"] is True
