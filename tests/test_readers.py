"""Every file autotune keeps and reads back, fed random JSON values (hypothesis): each reader gives
what it read, or refuses it with the user-facing error its command prints as one `Error:` line
(exit 2), or, for a cache, takes it for missing with a one-line note. Never another exception (an
internal error, exit 3), and what it gives can be used without one."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.base.errors import AutotuneError
from autotune.deploy import cache, cache_prune, export
from autotune.host import capabilities
from autotune.measure.objectives import Limits
from autotune.model import apply, artifacts, envfile
from autotune.model.artifacts import ARTIFACT_FORMAT
from autotune.model.errors import ApplyError
from autotune.study import records, storage
from autotune.study.kept import restore_kept
from tests.support import probes

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4), max_leaves=12)
HERE = cache.Here(torch="2.14.1", isa=("avx2",))


@contextmanager
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


def damaged(whole: dict[str, Any], key: str, value: Any, where: int) -> Any:
    """`whole` with one field (or, `where` < 0, the document itself) replaced by a random value: a file
    near enough to a real one to reach past its first check."""
    if where < 0:
        return value
    return whole | {key: value}


def mutated(document: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.builds(damaged, st.just(document), st.sampled_from(sorted(document)), JSON, st.integers(-1, 3))


def _kernel_fields() -> dict[str, Any]:
    return probes.kernel("torch", "int8", "conv")


PROBE = {"threads": [1, 2], "kernels": [probes.kernel("torch", "fp32", "conv"), _kernel_fields()],
         "bandwidth": {"1": {"copy_gbs": 5.0, "triad_gbs": 6.0}}, "measured_at": "now", "probe_s": 1.0, "key": {}}


@EXAMPLES
@given(st.one_of(JSON, mutated(PROBE), st.builds(lambda k, v: PROBE | {"kernels": [_kernel_fields() | {k: v}]},
                                                 st.sampled_from(sorted(_kernel_fields())), JSON)))
def test_a_kept_probe_is_used_or_probed_again_with_a_note(kept: Any) -> None:
    with folder() as tmp:
        path = tmp / "probe.json"
        path.write_text(json.dumps(kept))
        notes: list[str] = []
        probe = capabilities.read(path, notes.append)
        if probe is None:
            assert len(notes) == 1 and "\n" not in notes[0] and "probing again" in notes[0]
            return
        assert notes == []
        capabilities.refusals(probe, "conv")
        json.dumps(probe.to_json()) and json.dumps(probe.summary(2))


DESCRIPTION = {"format": ARTIFACT_FORMAT, "knobs": {"backend": "inductor"}, "inputs": ["1x3:float32:contiguous"],
               "torch": HERE.torch, "isa": list(HERE.isa), "weights": "w", "model": "m", "threads": 2,
               "guarded": {"k": {"min_cosine": 0.99}}}


@EXAMPLES
@given(st.one_of(JSON, mutated(DESCRIPTION)))
def test_an_artifact_description_is_read_or_taken_for_none(described: Any) -> None:
    with folder() as tmp:
        artifact = tmp / "artifacts" / "inductor-a.pt2"
        artifact.parent.mkdir()
        artifact.write_bytes(b"x")
        Path(f"{artifact}.json").write_text(json.dumps(described))
        (entry,) = cache.scan(tmp, HERE)
        json.dumps(entry.to_json())
        assert cache_prune.to_prune([entry], 0.0, 0.0, False) in ([], [entry])
        try:
            artifacts.description(artifact)
        except artifacts.DescriptionError:
            assert entry.unusable.startswith("its description inductor-a.pt2.json cannot be used (")
        artifacts.remember_guard(artifact, "j", {"min_cosine": 0.9})
        artifacts.guard_record(artifact, "k")


RANKING = {"format": ARTIFACT_FORMAT, "knobs": {"backend": "inductor", "precision": "int8"},
           "inputs": ["1x64:float32:contiguous"], "torch": HERE.torch, "isa": list(HERE.isa), "weights": "w",
           "calibration": "c", "model": "m", "order": ["head", "stem"], "divergence_full": 0.5,
           "reverted": {"head": 0.0, "stem": 0.4}, "ranking_s": 0.2, "proxy": {}, "layers": 2}
FALLBACK = {"int8_kept_fp32": ["head"], "int8_divergence": 0.001, "int8_divergence_full": 0.5,
            "int8_ranking": {"layers": 2, "reverted": 2, "took_s": 0.2, "reused": False}}


@EXAMPLES
@given(st.one_of(JSON, mutated(RANKING)), st.one_of(JSON, mutated(FALLBACK)))
def test_an_int8_layer_ranking_and_the_layers_an_artifact_keeps_are_read_or_taken_for_none(kept: Any,
                                                                                           record: Any) -> None:
    from autotune.cli import display
    from autotune.model import fallback

    with folder() as tmp:
        path = tmp / "artifacts" / "int8ranking-a.json"
        path.parent.mkdir()
        path.write_text(json.dumps(kept))
        (entry,) = cache.scan(tmp, HERE)
        json.dumps(entry.to_json())
        ranking = fallback.read_ranking(path)
        if ranking is not None:
            assert ranking.order == tuple(kept["order"]) and json.dumps(ranking.summary(True))
        artifact = tmp / "artifacts" / "inductor-a.pt2"
        artifact.write_bytes(b"x")
        Path(f"{artifact}.json").write_text(json.dumps(DESCRIPTION | {"int8_fallback": record}))
        setup: dict[str, Any] = {}
        if fallback.recall(artifact, setup):
            display.fallback_text(setup)
        else:
            assert setup == {}


KEPT = {"trial": 0, "state": "COMPLETE", "values": [10.0], "reason": "", "cause": "",
        "summary": {"latency_p50_ms": 10.0, "latency_p90_ms": 11.0}, records.WRONG_ANSWERS: False}


@EXAMPLES
@given(st.one_of(JSON, mutated(KEPT)))
def test_a_measurement_kept_beside_a_study_is_recorded_or_refused(kept: Any) -> None:
    with folder() as tmp, storage.quiet_optuna():
        study = optuna.create_study()
        study.ask()
        path = tmp / "s.trial-0.unsaved.json"
        path.write_text(json.dumps(kept))
        try:
            number = restore_kept(study, path, Limits(latency_p90_ms=20.0))
        except AutotuneError as exc:
            assert str(exc).startswith(f"the measurement kept in {path} ") and "\n" not in str(exc)
            assert study.trials[0].state == optuna.trial.TrialState.RUNNING and path.exists()  # nothing half-done
            return
        assert number in (0, None)


WHOLE = envfile.render("test", [], ["AUTOTUNE_PRECISION"], {"OMP_NUM_THREADS": "2"},
                       {envfile.MODEL_VAR: "resnet18", envfile.BATCH_SIZE_VAR: "1", "AUTOTUNE_BACKEND": "eager",
                        envfile.BINDING_VAR: "none", envfile.INSTANCE_CPUS_VAR: "", envfile.INSTANCE_NODES_VAR: ""},
                       [])
VARIABLES = sorted(envfile.parse(WHOLE).env)


def _with_value(name: str, value: Any, twice: bool) -> str:
    """The whole file with one variable's value replaced by a JSON value's text (or any text), quoted as
    a shell would read it; `twice`: set again after."""
    text = value if isinstance(value, str) else json.dumps(value)
    line = f"export {name}='" + text.replace("'", "'\"'\"'") + "'"
    lines = [line if ln.startswith(f"export {name}=") else ln for ln in WHOLE.splitlines()]
    if twice:
        lines.insert(lines.index(line) + 1, line)
    return "\n".join(lines) + "\n"


@EXAMPLES
@given(st.one_of(st.builds(_with_value, st.sampled_from(VARIABLES), JSON | st.text(), st.booleans()),
                 st.text().map(lambda t: WHOLE + t), st.text()))
def test_an_env_file_is_read_or_refused_in_one_line(text: str) -> None:
    with folder() as tmp:
        path = tmp / "best.env"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            read = export.read(path)
        except AutotuneError as exc:
            assert "\n" not in str(exc) and str(exc)
        else:
            assert not any(envfile.has_control(k + v) for k, v in read.env.items())
        try:
            apply.load_env_file(path)
        except ApplyError as exc:
            assert "\n" not in str(exc)
