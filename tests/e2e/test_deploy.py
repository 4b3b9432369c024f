"""Deploying what was measured, for real: the child's answers equal `autotune.apply`'s in a user's
process, export compiles artifacts that apply loads, `autotune run` notices a program that never
applied the knobs, and examples/serve.py serves under an env file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import autotune
from autotune.model import apply, envfile
from autotune.model.knobs import ModelKnobs
from tests.conftest import NEEDS_BF16, ROOT
from tests.fixtures.models import tinynets
from tests.support import envs
from tests.support.cli import AUTOTUNE

pytestmark = pytest.mark.e2e

TINY = Path(tinynets.__file__)
QUICK = ["--duration", "0.2", "--warmup", "1", "--warmup-time", "0", "--min-iterations", "3"]
BATCH = 2


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tinynets.py beside saved inputs: images for the cnn, token ids for the encoder."""
    folder = tmp_path_factory.mktemp("deploy")
    shutil.copy(TINY, folder / "tinynets.py")
    generator = torch.Generator().manual_seed(5)
    torch.save(torch.randn(6, 3, 32, 32, generator=generator), folder / "images.pt")
    torch.save(torch.randint(0, 500, (6, 16), generator=generator), folder / "tokens.pt")
    return folder


def autotune_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUTOTUNE, *args], cwd=cwd, capture_output=True, text=True, timeout=900)


def child_setup(cwd: Path, model: str, inputs: str, *knobs: str) -> dict[str, Any]:
    proc = autotune_cli(cwd, "bench", *QUICK, "--json", "--model", model, "--example-inputs", inputs,
                        "--batch-size", str(BATCH), *(a for k in knobs for a in ("--set", k)))
    assert proc.returncode == 0, proc.stderr
    instance = json.loads(proc.stdout)["result"]["instances"][0]
    return dict(instance["setup"], runtime=instance["runtime"])


@pytest.mark.parametrize(("knob", "knobs"), [
    ("backend=torchscript", ModelKnobs(backend="torchscript")),
    ("backend=inductor", ModelKnobs(backend="inductor")),
    ("memory_format=channels_last", ModelKnobs(memory_format="channels_last")),
    pytest.param("precision=bf16", ModelKnobs(precision="bf16"), marks=NEEDS_BF16),
    ("mkldnn=on", ModelKnobs(mkldnn=True)),
    ("weight_cache=on", ModelKnobs(weight_cache=True)),
])
def test_apply_answers_what_the_child_measured(here: Path, tmp_path: Path, knob: str, knobs: ModelKnobs) -> None:
    measured = child_setup(here, "tinynets:cnn", "images.pt", knob)
    example = torch.load(here / "images.pt")[:BATCH]
    applied = apply.apply_deployment(tinynets.cnn(), example, apply.Deployment(knobs, artifacts=tmp_path),
                                      check=False)
    assert applied.setup["output_dtype"] == measured["output_dtype"]
    assert applied.setup["output_digest"] == pytest.approx(measured["output_digest"], rel=1e-4, abs=1e-4)


def test_a_token_id_model_goes_through_bench_and_apply(here: Path, tmp_path: Path) -> None:
    measured = child_setup(here, "tinynets:encoder", "tokens.pt", "backend=torchscript")
    assert measured["max_rel_err"] <= 1e-3
    tokens = torch.load(here / "tokens.pt")[:BATCH]
    assert tokens.dtype == torch.int64
    deployment = apply.Deployment(ModelKnobs(backend="torchscript"), artifacts=tmp_path)
    applied = apply.apply_deployment(tinynets.encoder(), tokens, deployment, check=True)
    assert applied.setup["output_digest"] == pytest.approx(measured["output_digest"], rel=1e-4, abs=1e-4)


def test_export_compiles_artifacts_that_apply_loads(here: Path, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  backend: [torchscript]\n")
    # a factory is imported from the working folder
    shutil.copy(here / "tinynets.py", tmp_path / "tinynets.py")
    found = autotune_cli(tmp_path, "search", "--model", "tinynets:cnn", "--input-shape", "3x32x32", "--trials",
                         "2", "--space", str(space), "--replicates", "1", "--confirm-top", "0", *QUICK)
    assert found.returncode == 0, found.stderr
    exported = autotune_cli(tmp_path, "export", "best.env", "--trial", "1", "--artifacts", "compiled")
    assert exported.returncode == 0, exported.stderr
    assert list((tmp_path / "compiled").glob("torchscript-*.pt"))
    env = envfile.parse((tmp_path / "best.env").read_text()).env
    assert env["AUTOTUNE_BACKEND"] == "torchscript"
    assert env[envfile.ARTIFACTS_VAR] == str((tmp_path / "compiled").resolve())
    program = ("import torch, autotune, tinynets; torch.manual_seed(0)\n"
               "m = autotune.apply(tinynets.cnn(), torch.randn(1, 3, 32, 32), env_file='best.env')\n"
               "print(m.setup['artifact_hit'], 'trace_s' in m.setup)\n")
    loaded = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert loaded.stdout.split() == ["True", "False"], loaded.stderr
    refused = autotune_cli(tmp_path, "export", "other.env", "--trial", "1", "--artifacts", "best.env/inside")
    assert refused.returncode == 2 and not (tmp_path / "other.env").exists()
    assert refused.stderr.startswith("Error: --artifacts 'best.env/inside' is not a writable folder (Not a "
                                     "directory); choose another") and refused.stderr.count("\n") == 1


@pytest.mark.parametrize("preloaded", [("allocator=jemalloc",), ("allocator=tcmalloc",),
                                       ("omp_runtime=intel", "allocator=jemalloc")])
def test_export_builds_artifacts_for_a_configuration_that_preloads_libraries(
        here: Path, tmp_path: Path, preloaded: tuple[str, ...]) -> None:
    """The artifacts are built in a child launched as the configuration says (LD_PRELOAD included),
    and the runner's check that every preloaded library was really used holds there too."""
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  backend: [torchscript]\n")
    shutil.copy(here / "tinynets.py", tmp_path / "tinynets.py")
    pins = [arg for knob in preloaded for arg in ("--set", knob)]
    found = autotune_cli(tmp_path, "search", "--model", "tinynets:cnn", "--input-shape", "3x32x32", "--trials",
                         "2", "--space", str(space), "--replicates", "1", "--confirm-top", "0", *QUICK, *pins)
    assert found.returncode == 0, found.stderr
    exported = autotune_cli(tmp_path, "export", "best.env", "--trial", "1", "--artifacts", "compiled")
    assert exported.returncode == 0, exported.stderr
    assert list((tmp_path / "compiled").glob("torchscript-*.pt"))
    env = envfile.parse((tmp_path / "best.env").read_text()).env
    assert all(env[envfile.knob_var(knob.partition("=")[0])] == knob.partition("=")[2] for knob in preloaded)
    libraries = {"allocator=jemalloc": "libjemalloc", "allocator=tcmalloc": "libtcmalloc",
                 "omp_runtime=intel": "libiomp5"}
    assert all(libraries[knob] in env["LD_PRELOAD"] for knob in preloaded)


def _env_file(path: Path, knobs: ModelKnobs) -> Path:
    path.write_text(envs.hand_written(**envs.knob_vars(knobs)))
    return path


@NEEDS_BF16
def test_run_warns_when_the_program_never_applies_the_knobs(tmp_path: Path) -> None:
    env = _env_file(tmp_path / "best.env", ModelKnobs(backend="torchscript", precision="bf16"))
    ignored = autotune_cli(tmp_path, "run", str(env), "--", sys.executable, "-c", "print('served')")
    assert ignored.returncode == 0 and ignored.stdout == "served\n"
    assert ignored.stderr.strip().splitlines() == [
        "warning: the program never called autotune.apply(model, example_inputs), so backend=torchscript "
        "precision=bf16 were not applied there; see docs/deploying.md, 'Using the result in your program'"]
    program = "import torch, torchvision, autotune; autotune.apply(torch.nn.Linear(4, 2), torch.randn(1, 4))"
    applied = autotune_cli(tmp_path, "run", str(env), "--", sys.executable, "-c", program)
    assert applied.returncode == 0 and "warning" not in applied.stderr, applied.stderr


def test_serve_example_runs_under_an_env_file(tmp_path: Path) -> None:
    env = _env_file(tmp_path / "best.env", ModelKnobs(backend="torchscript"))
    proc = autotune_cli(tmp_path, "run", str(env), "--", sys.executable, str(ROOT / "examples" / "serve.py"),
                        "--model", "resnet18", "--image-size", "64", "--requests", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["configuration"] == "backend=torchscript" and summary["requests"] == 3
    assert "warning" not in proc.stderr


def test_an_inductor_artifact_is_compiled_once_and_checks_its_inputs(tmp_path: Path) -> None:
    deployment = apply.Deployment(ModelKnobs(backend="inductor", precision="bf16"), artifacts=tmp_path)
    example = torch.randn(BATCH, 3, 32, 32)
    first = apply.apply_deployment(tinynets.cnn(), example, deployment, check=True)
    again = apply.apply_deployment(tinynets.cnn(), example, deployment, check=False)
    assert first.setup["artifact_hit"] is False and first.setup["compile_s"] > 0
    assert again.setup["artifact_hit"] is True and "compile_s" not in again.setup
    assert len(list(tmp_path.glob("inductor-*.pt2"))) == 1
    assert again(example).dtype == torch.bfloat16
    with pytest.raises(autotune.ApplyError, match=r"the compiled model takes inputs 2x3x32x32:float32:.*, not "
                                                  r"1x3x32x32:float32"):
        again(torch.randn(1, 3, 32, 32))


def test_an_inductor_artifact_takes_keyword_inputs_in_any_order(tmp_path: Path) -> None:
    """The AOTInductor package is loaded through torch's loader directly (model.backends.inductor.Package),
    which puts keyword inputs in the order they were exported in."""

    class TwoInputs(torch.nn.Module):
        def forward(self, image: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"scaled": image * scale, "sum": image.sum(dim=(1, 2, 3)) - scale.sum()}

    image, scale = torch.randn(BATCH, 3, 8, 8), torch.rand(BATCH, 1, 1, 1) + 1
    deployment = apply.Deployment(ModelKnobs(backend="inductor"), artifacts=tmp_path)
    apply.apply_deployment(TwoInputs(), {"image": image, "scale": scale}, deployment, check=True)
    loaded = apply.apply_deployment(TwoInputs(), {"scale": scale, "image": image}, deployment, check=True)
    assert loaded.setup["artifact_hit"] is True
    output = loaded(scale=scale, image=image)
    assert set(output) == {"scaled", "sum"} and torch.allclose(output["scaled"], image * scale)


class Branchy(torch.nn.Module):
    """Data-dependent control flow: torch.export cannot capture it, torch.compile can."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if float(x.sum()) > 0 else x - 1


def test_a_model_export_cannot_capture_falls_back_to_torch_compile(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    for var, value in {**apply.to_env(ModelKnobs(backend="inductor")), "AUTOTUNE_ARTIFACTS": str(tmp_path)}.items():
        monkeypatch.setenv(var, value)
    example = torch.ones(2, 4)
    with pytest.warns(apply.CompileFallback, match="torch.export failed .*; torch.compile: compiled in this "
                                                     "process, not saved"):
        applied = autotune.apply(Branchy(), example, check=True)
    assert torch.equal(applied(example), example * 2)
    assert not list(tmp_path.glob("*.pt2"))
