"""Sequence-length buckets for real: a tiny BERT folder searched at three lengths through the installed
command (shapes=buckets and shapes=dynamic), its winner exported with compiled artifacts, and
examples/serve_text.py serving mixed lengths under `autotune run` with the one `apply` line, loading
those artifacts; the bucketed model answers as eager for lengths inside, between and beyond the buckets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest
import torch
import transformers

import autotune
from autotune.model import apply, buckets
from autotune.model.knobs import ModelKnobs
from tests.conftest import NEEDS_INT8
from tests.support.cli import autotune as autotune_cli
from tests.support.hf import token_batch

pytestmark = [pytest.mark.e2e,  # transformers' own warnings under TorchScript's trace:
              pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning",
                                         "ignore:.*is_gradient_checkpointing:FutureWarning")]

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--duration", "0.2", "--warmup", "1", "--warmup-time", "0", "--min-iterations", "3"]
STUDY = "tiny-bert-sequence-classification-seq8-16-32-bs1-latency"


@pytest.mark.parametrize(("shapes", "packages", "precision"), [
    ("buckets", 3, "fp32"), ("dynamic", 1, "fp32"),  # one model per bucket, or one
    # int8: the artifact and the quantized graph it was compiled from; `apply` calibrates on the study's batches
    pytest.param("dynamic", 2, "int8", marks=NEEDS_INT8)])
def test_search_export_and_serve_mixed_lengths(tmp_path: Path, tiny_bert: Path, shapes: str, packages: int,
                                               precision: str) -> None:
    proc = autotune_cli(tmp_path, "search", "--model", f"hf:{tiny_bert}", "--seq-lens", "8,16,32",
                        "--seq-len-weights", "1,2,1", "--trials", "2", "--space", "quick", "--set", "backend=inductor",
                        "--set", f"shapes={shapes}", "--set", f"precision={precision}", "--set", "instances=1",
                        "--replicates", "1", "--confirm-top", "0",
                        # a tiny random BERT's int8 reaches cosine 0.988, under the default tolerance's 0.99
                        *(["--calibration-batches", "2", "--tolerance", "0.05"] if precision == "int8" else []),
                        *QUICK)
    assert proc.returncode == 0, proc.stderr
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'studies' / STUDY}.db")
    assert study.user_attrs["seq_lens"] == [8, 16, 32] and study.user_attrs["seq_len_weights"] == [0.25, 0.5, 0.25]
    winner = max((t for t in study.get_trials() if t.user_attrs.get("config")), key=lambda t: t.number)
    measured = winner.user_attrs["instances"][0]["buckets"]
    assert sorted(measured, key=int) == ["8", "16", "32"] and all(b["sweeps"] >= 1 for b in measured.values())
    # one model per bucket is timed at the bucket's length; one dynamic model at lengths spread over it
    assert measured["16"]["lengths"] == ([10, 12, 14, 16] if shapes == "dynamic" else [16])
    # a dynamic model is timed after it served every length up to the largest bucket once, as a service has
    setup = winner.user_attrs["instances"][0]["setup"]
    assert setup.get("fill_lengths") == (32 if shapes == "dynamic" else None)

    proc = autotune_cli(tmp_path, "export", "best.env", "--study", STUDY, "--artifacts", "artifacts")
    assert proc.returncode == 0, proc.stderr
    env = (tmp_path / "best.env").read_text()
    assert f"{buckets.SEQ_LENS_VAR}='8,16,32'" in env and "AUTOTUNE_BACKEND='inductor'" in env
    assert f"AUTOTUNE_SHAPES='{shapes}'" in env
    compiled = sorted((tmp_path / "artifacts").glob("*.pt2"))
    assert len(compiled) == packages

    proc = autotune_cli(tmp_path, "run", "best.env", "--", sys.executable, str(ROOT / "examples" / "serve_text.py"),
                        "--model", f"hf:{tiny_bert}", "--lengths", "3-32", "--requests", "30", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    configured = "backend=inductor" + (" precision=int8" if precision == "int8" else "") + \
        (" shapes=dynamic" if shapes == "dynamic" else "")
    assert summary["configuration"] == configured
    assert set(summary["buckets"]) <= {"8", "16", "32"}
    assert sum(b["requests"] for b in summary["buckets"].values()) == 30
    assert all(b["mean_ms"] > 0 for b in summary["buckets"].values())
    assert sorted((tmp_path / "artifacts").glob("*.pt2")) == compiled  # loaded, none compiled again
    assert "warning" not in proc.stderr


@pytest.mark.parametrize("length", [5, 8, 11, 16])  # inside, at and between the buckets 8 and 16
def test_a_bucketed_transformers_model_answers_as_eager(tiny_bert: Path,
                                                        length: int, bucketed_bert: autotune.Applied) -> None:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_bert).eval()
    batch = token_batch(length, seed=length)
    with torch.no_grad():
        want = model(**batch).logits
    torch.testing.assert_close(bucketed_bert(**batch), want, rtol=1e-3, atol=1e-4)


def test_a_longer_input_than_the_largest_bucket_is_one_error(bucketed_bert: autotune.Applied) -> None:
    with pytest.raises(autotune.ApplyError, match=r"an input of 17 tokens is longer than the largest bucket \(16\)"):
        bucketed_bert(**token_batch(17))


@pytest.fixture(scope="module")
def bucketed_bert(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> autotune.Applied:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_bert).eval()
    chosen = apply.Deployment(ModelKnobs(backend="torchscript"), artifacts=tmp_path_factory.mktemp("artifacts"),
                               seq_lens=(8, 16))
    return apply.apply_buckets(apply.hf.wrapped(model), token_batch(12), chosen, check=True)
