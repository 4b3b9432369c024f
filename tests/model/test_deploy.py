"""`autotune.apply` in a user's process: configuration from the environment or an env file, the same
conversions the benchmark child applies (the child calls it), numerics, artifacts, errors."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import autotune
from autotune.child import build, worker
from autotune.model import apply, artifacts, batches, convert, cpu, envfile
from autotune.model.knobs import ModelKnobs
from tests.fixtures.models import tinynets
from tests.support import envs

IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
TOKENS = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(3))
# Every model knob on its own, as the default search space can pick it (inductor is in the e2e tests).
KNOBS = [ModelKnobs(backend="torchscript"), ModelKnobs(weight_cache=True), ModelKnobs(mkldnn=True),
         ModelKnobs(mkldnn=True, weight_cache=True), ModelKnobs(memory_format="channels_last"),
         ModelKnobs(precision="bf16"), ModelKnobs(backend="torchscript", precision="bf16",
                                                  memory_format="channels_last")]


def env_of(knobs: ModelKnobs, **extra: str) -> dict[str, str]:
    return {**apply.to_env(knobs), **extra}


def eager(model: Any, batch: Any) -> torch.Tensor:
    with torch.no_grad():
        return batches.call(model, batch)


def test_without_configuration_the_model_comes_back_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in apply.KNOB_VARS.values():
        monkeypatch.delenv(var, raising=False)
    model = tinynets.cnn()
    assert autotune.apply(model, IMAGES) is model


@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: k.describe())
def test_each_knob_from_the_environment_gives_eager_answers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           knobs: ModelKnobs) -> None:
    for var, value in env_of(knobs, AUTOTUNE_ARTIFACTS=str(tmp_path)).items():
        monkeypatch.setenv(var, value)
    reference = eager(tinynets.cnn(), IMAGES)
    applied = autotune.apply(tinynets.cnn(), IMAGES, check=True)
    assert isinstance(applied, autotune.Applied) and applied.knobs == knobs
    output = applied(IMAGES)
    assert output.layout == torch.strided  # mkldnn outputs come back dense
    allowed = convert.TOLERANCE[knobs.precision]
    assert float((output.float() - reference).abs().max()) <= allowed * float(reference.abs().max())
    assert applied.setup["max_rel_err"] <= allowed


def test_an_env_file_path_is_read_without_the_environment(tmp_path: Path) -> None:
    knobs = ModelKnobs(backend="torchscript")
    path = tmp_path / "best.env"
    path.write_text(envs.hand_written(**envs.knob_vars(knobs)))
    applied = autotune.apply(tinynets.cnn(), IMAGES, env_file=path)
    assert applied.knobs == knobs
    assert isinstance(applied.setup["trace_s"], float)


def test_token_ids_and_keyword_inputs_pass_through_unconverted(tmp_path: Path) -> None:
    model = tinynets.encoder()
    for knobs in (ModelKnobs(backend="torchscript"), ModelKnobs(precision="bf16")):
        deployment = apply.Deployment(knobs, artifacts=tmp_path)
        applied = apply.apply_deployment(tinynets.encoder(), TOKENS, deployment, check=True)
        assert applied(TOKENS).shape == eager(model, TOKENS).shape
    applied = apply.apply_deployment(model, {"tokens": TOKENS}, apply.Deployment(ModelKnobs(precision="bf16")),
                                      check=True)
    assert applied(tokens=TOKENS).shape == (2, 8)


def test_check_fails_wrong_answers_beyond_the_tolerance() -> None:
    deployment = apply.Deployment(ModelKnobs(precision="bf16"), tolerance=0.0)
    with pytest.raises(autotune.WrongAnswers, match=r"wrong answers: .* > tolerance 0"):
        apply.apply_deployment(tinynets.cnn(), IMAGES, deployment, check=True)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AUTOTUNE_BACKEND": "tensorrt"}, "AUTOTUNE_BACKEND='tensorrt' in the environment is not one of eager, "
                                           "torchscript, inductor, openvino, onnxruntime, llamacpp; export the env "
                                           "file again"),
        ({"AUTOTUNE_MKLDNN": "maybe"}, "AUTOTUNE_MKLDNN='maybe' in the environment is not one of on, off"),
        ({"AUTOTUNE_BACKEND": "inductor", "AUTOTUNE_MKLDNN": "on"},
         "mkldnn applies only with backend=eager (here backend=inductor); set backend or drop mkldnn"),
        ({"AUTOTUNE_PRECISION": "bf16", "AUTOTUNE_TOLERANCE": "lots"}, "AUTOTUNE_TOLERANCE='lots' in the "
                                                                       "environment is not a number"),
    ],
)
def test_a_bad_configuration_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                message: str) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(autotune.ApplyError) as raised:
        autotune.apply(tinynets.cnn(), IMAGES)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_bf16_is_applied_whatever_the_cpu_flags_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether bf16 runs well is the kernel probe's to say when a search chooses; a CPU flag never refuses it."""
    monkeypatch.setattr(cpu, "cpuinfo", lambda: ("old cpu", frozenset({"avx2"})))
    model = apply.apply_deployment(tinynets.cnn(), IMAGES, apply.Deployment(ModelKnobs(precision="bf16")),
                                    check=False)
    assert model(IMAGES).dtype == torch.bfloat16


def test_a_damaged_env_file_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "x.env"
    path.write_text("export AUTOTUNE_BACKEND=eager\n")
    with pytest.raises(autotune.ApplyError, match="not an autotune env file"):
        autotune.apply(tinynets.cnn(), IMAGES, env_file=path)
    with pytest.raises(autotune.ApplyError, match="cannot read env file"):
        autotune.apply(tinynets.cnn(), IMAGES, env_file=tmp_path / "missing.env")


def test_a_saved_artifact_is_loaded_by_the_next_process_instead_of_traced(tmp_path: Path) -> None:
    deployment = apply.Deployment(ModelKnobs(backend="torchscript"), artifacts=tmp_path)
    first = apply.apply_deployment(tinynets.cnn(), IMAGES, deployment, check=False)
    (described,) = tmp_path.glob("*.pt.json")
    os.utime(described, (1.0, 1.0))
    again = apply.apply_deployment(tinynets.cnn(), IMAGES, deployment, check=False)
    assert first.setup["artifact_hit"] is False and "trace_s" in first.setup
    assert again.setup["artifact_hit"] is True and "trace_s" not in again.setup
    assert len(list(tmp_path.glob("*.pt"))) == 1
    # the load is the artifact's last use, for `autotune cache --older-than`; the class names the model
    assert described.stat().st_mtime > time.time() - 60
    assert json.loads(described.read_text())["model"] == "torch.nn.modules.container.Sequential"


def test_an_inductor_artifact_is_keyed_by_the_thread_count_it_was_compiled_for(tmp_path: Path) -> None:
    """Inductor writes the thread count into its kernels (1 thread: no parallel loops at all), so a
    threads=2 process must never load what a threads=1 process compiled; TorchScript is not keyed."""
    before = torch.get_num_threads()
    paths = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for backend in ("inductor", "torchscript"):
                meta = convert.artifact_meta(ModelKnobs(backend=backend), IMAGES, "w")
                paths[backend, threads] = artifacts.artifact_path(tmp_path, meta, ".x", kind=backend)
    finally:
        torch.set_num_threads(before)
    assert paths["inductor", 1] != paths["inductor", 2]
    assert paths["torchscript", 1] == paths["torchscript", 2]


def test_an_artifact_of_other_weights_is_never_loaded(tmp_path: Path) -> None:
    deployment = apply.Deployment(ModelKnobs(backend="torchscript"), artifacts=tmp_path)
    apply.apply_deployment(tinynets.cnn(), IMAGES, deployment, check=False)
    other = tinynets.cnn()
    with torch.no_grad():
        other[0].weight.mul_(2)
    applied = apply.apply_deployment(other, IMAGES, deployment, check=True)
    assert applied.setup["artifact_hit"] is False
    assert len(list(tmp_path.glob("*.pt"))) == 2


@pytest.mark.parametrize(("field", "value", "said"), [("torch", "2.0.0", "torch 2.0.0 (here"),
                                                      ("isa", ["avx2"], "isa ['avx2'] (here"),
                                                      ("format", "v0", "format v0 (here")])
def test_a_stale_artifact_is_detected_and_rebuilt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, field: str,
                                                  value: object, said: str) -> None:
    deployment = apply.Deployment(ModelKnobs(backend="torchscript"), artifacts=tmp_path)
    apply.apply_deployment(tinynets.cnn(), IMAGES, deployment, check=False)
    [made] = tmp_path.glob("*.pt")
    meta = json.loads(Path(f"{made}.json").read_text())
    stale = made.with_name("torchscript-0000000000000000.pt")  # as if built elsewhere: another key
    made.rename(stale)
    Path(f"{made}.json").unlink()
    Path(f"{stale}.json").write_text(json.dumps({**meta, field: value}))
    for var, setting in env_of(ModelKnobs(backend="torchscript"), AUTOTUNE_ARTIFACTS=str(tmp_path)).items():
        monkeypatch.setenv(var, setting)
    with pytest.warns(apply.ArtifactRebuilt, match=re.escape(f"not loading {stale.name}: it was built for {said}")):
        applied = autotune.apply(tinynets.cnn(), IMAGES)
    assert applied.setup["artifact_hit"] is False
    assert made.exists()


def test_apply_reports_back_to_autotune_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    report = tmp_path / "applied.jsonl"
    monkeypatch.setenv(envfile.REPORT_VAR, str(report))
    for var, value in env_of(ModelKnobs(precision="bf16")).items():
        monkeypatch.setenv(var, value)
    autotune.apply(tinynets.cnn(), IMAGES)
    record = json.loads(report.read_text())
    assert record["knobs"]["precision"] == "bf16"


def test_the_benchmark_child_builds_through_apply(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[apply.Deployment] = []
    real = apply.apply_deployment

    def spy(model: Any, example: Any, chosen: apply.Deployment, **kw: Any) -> Any:
        calls.append(chosen)
        return real(model, example, chosen, **kw)

    monkeypatch.setattr(apply, "apply_deployment", spy)
    monkeypatch.syspath_prepend(str(Path(tinynets.__file__).parent))
    args = worker.parse_args(["--model", "tinynets:cnn", "--item-shape", "3x32x32", "--backend", "torchscript",
                              "--precision", "bf16", "--cache-dir", str(tmp_path), "--result", "unused"])
    setup: dict[str, Any] = {}
    build.build(args, IMAGES, setup)
    assert [c.knobs for c in calls] == [ModelKnobs(backend="torchscript", precision="bf16")]
    assert setup["max_rel_err"] <= convert.TOLERANCE["bf16"]


def test_an_env_file_whose_knob_variables_contradict_its_knob_list_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # an env file exported before AUTOTUNE_BACKEND existed says inductor only in AUTOTUNE_KNOBS
    monkeypatch.setenv("AUTOTUNE_KNOBS", "backend=inductor precision=bf16 omp_threads=2")
    monkeypatch.setenv("AUTOTUNE_MKLDNN", "off")
    with pytest.raises(autotune.ApplyError, match="lists backend=inductor in AUTOTUNE_KNOBS but "
                                                  "AUTOTUNE_BACKEND='eager'; export the env file again"):
        autotune.apply(tinynets.cnn(), IMAGES)


def test_the_applied_model_is_called_like_the_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    class Two(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a * 2 + b

    a, b = torch.randn(2, 4), torch.randn(2, 4)
    for var, value in env_of(ModelKnobs(backend="torchscript")).items():
        monkeypatch.setenv(var, value)
    applied = autotune.apply(Two(), (a, b), check=True)
    assert torch.allclose(applied(a, b), Two()(a, b))
    with pytest.raises(autotune.ApplyError, match=r"the compiled model takes inputs 2x4:float32:contiguous; "
                                                  r"2x4:float32:contiguous, not 3x4"):
        applied(torch.randn(3, 4), torch.randn(3, 4))


def test_apply_leaves_the_users_model_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tinynets.cnn()
    for var, value in env_of(ModelKnobs(mkldnn=True)).items():
        monkeypatch.setenv(var, value)
    autotune.apply(model, IMAGES, check=True)
    assert type(model[0]) is torch.nn.Conv2d and model[0].weight.is_contiguous()


def test_an_unwritable_artifacts_folder_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for var, value in env_of(ModelKnobs(backend="torchscript"), AUTOTUNE_ARTIFACTS=str(blocker / "x")).items():
        monkeypatch.setenv(var, value)
    with pytest.raises(autotune.ApplyError, match=r"cannot save the compiled model into .*/file/x: .*; point "
                                                  r"AUTOTUNE_ARTIFACTS at a writable folder"):
        autotune.apply(tinynets.cnn(), IMAGES)
    assert list(tmp_path.iterdir()) == [blocker]


def test_a_long_error_is_quoted_up_to_its_last_whole_sentence() -> None:
    """Cut at a fixed length, torch's corrupt-file error ended '... transferred incorrectly, o;'."""
    from autotune.model.batches import EXPLAINED, explain

    long = RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory. "
                        + "This is an internal miniz error. " + "If you are seeing this error, " * 20)
    assert explain(long) == ("RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central "
                             "directory. This is an internal miniz error.")
    words = explain(RuntimeError("word " * 200))
    assert words.endswith("word ...") and len(words) <= len("RuntimeError: ") + EXPLAINED + 4
    assert explain(ValueError("short\nsecond line")) == "ValueError: short"
