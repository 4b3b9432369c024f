"""Quality on the user's data, for real: a classifier's accuracy and a causal LM's perplexity judged
by real children beside fp32 eager; fp32's perplexity is transformers' own loss; a search records
each trial's quality and its limit, and its confirmation re-checks the winner on its own part."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch

from tests.conftest import NEEDS_INT8
from tests.fixtures.models import tinynets
from tests.support.browser import chromium, drawn
from tests.support.cli import AUTOTUNE
from tests.support.hf import LICENCE, save_tiny_llama_with_tokenizer

pytestmark = pytest.mark.e2e

QUICK = ["--duration", "0.2", "--warmup", "1", "--warmup-time", "0", "--min-iterations", "3"]


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tinynets.py beside labelled data for its mlp (labels: its own answers, a tenth changed), a
    causal LM with its tokenizer, and texts."""
    folder = tmp_path_factory.mktemp("quality")
    shutil.copy(tinynets.__file__, folder / "tinynets.py")
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randn(300, 64, generator=generator)
    labels = tinynets.mlp()(inputs).argmax(-1)
    changed = torch.rand(300, generator=generator) < 0.1
    labels[changed] = torch.randint(0, 10, (int(changed.sum()),), generator=generator)
    torch.save({"inputs": inputs, "labels": labels}, folder / "labelled.pt")
    torch.save({"inputs": inputs, "labels": labels + 10}, folder / "beyond.pt")
    save_tiny_llama_with_tokenizer(folder / "lm", LICENCE.read_text())
    (folder / "metrics.py").write_text(METRICS)
    (folder / "short.txt").write_text("Too short for a window.")
    return folder


METRICS = """
def agreement_with_label(model, batches):
    right = total = 0
    for inputs, labels in batches:
        right += int((model(inputs).argmax(-1) == labels).sum())
        total += len(labels)
    return right / total


def raises(model, batches):
    raise RuntimeError("no metric today")


def not_a_number(model, batches):
    return float("nan")
"""


def autotune_cli(cwd: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUTOTUNE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def bench(cwd: Path, *args: str) -> dict[str, Any]:
    proc = autotune_cli(cwd, "bench", *QUICK, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_a_classifiers_accuracy_on_held_out_items_beside_fp32(here: Path) -> None:
    data = bench(here, "--model", "tinynets:mlp", "--input-shape", "64", "--eval-data", "labelled.pt")
    found = data["quality"]
    assert found["kind"] == "accuracy" and found["split"] == "search" and found["items"] == 120  # (300 - 60) / 2
    assert found["value"] == found["reference_value"] and found["drop"] == 0  # the defaults are fp32 eager
    assert 80 < found["value"] < 97 and found["interval"][0] < found["value"] < found["interval"][1]


@NEEDS_INT8
def test_int8_calibrates_on_the_data_and_its_drop_is_measured(here: Path) -> None:
    data = bench(here, "--model", "tinynets:mlp", "--input-shape", "64", "--eval-data", "labelled.pt",
                 "--set", "backend=inductor", "--set", "precision=int8")
    found = data["quality"]
    assert found["reference_value"] > 80 and found["top1_agreement"] > 0.9
    low, high = found["drop_interval"]
    assert low <= found["drop"] <= high and abs(found["drop"]) < 5


def test_a_metric_of_the_users_own_judges_beside_fp32(here: Path) -> None:
    data = bench(here, "--model", "tinynets:mlp", "--input-shape", "64", "--eval-data", "labelled.pt",
                 "--eval", "metrics:agreement_with_label", "--eval-direction", "higher", "--batch-size", "8")
    found = data["quality"]
    assert found["kind"] == "custom" and found["metric"] == "metrics:agreement_with_label"
    assert found["items"] == 15 and found["value"] == found["reference_value"] and found["drop"] == 0  # 120 items
    assert 0.8 < found["value"] < 0.97 and found["interval"] is None


def test_a_causal_lms_fp32_perplexity_is_transformers_own_loss(here: Path) -> None:
    import transformers

    data = bench(here, "--model", f"hf:{here / 'lm'}", "--task", "generate", "--prompt-len", "16", "--new-tokens",
                 "4", "--eval-data", str(LICENCE), "--set", "precision=int8_weight_only")
    found = data["quality"]
    assert found["kind"] == "perplexity" and found["window_tokens"] == 256  # the tiny model's positions
    model = transformers.AutoModelForCausalLM.from_pretrained(here / "lm").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(here / "lm")
    ids = torch.tensor(tokenizer(LICENCE.read_text(), add_special_tokens=False)["input_ids"])
    windows = [ids[start:start + 256] for start in range(0, len(ids) - 255, 256)][0::2]
    losses = []
    for window in windows:
        labels = window.clone()
        labels[:129] = -100
        with torch.no_grad():
            losses.append(float(model(input_ids=window[None], labels=labels[None]).loss))
    assert found["windows"] == len(windows)
    assert found["reference_value"] == pytest.approx(math.exp(sum(losses) / len(losses)), rel=1e-3)
    assert found["kl_mean"] >= 0 and 0 < found["same_top"] <= 1 and found["kl_p99"] <= found["kl_max"]


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "tinynets:mlp", "--input-shape", "64", "--eval-data", "beyond.pt"],
     r"Error: --eval-data {here}/beyond\.pt: label 1\d is outside the model's 10 classes"),
    (["--model", "hf:{here}/lm", "--task", "generate", "--eval-data", "short.txt"],
     r"Error: --eval-data {here}/short\.txt is \d+ tokens long, shorter than two windows of 256 "),
    (["--model", "tinynets:mlp", "--input-shape", "64", "--eval", "metrics:raises", "--eval-direction", "higher"],
     r"Error: --eval metrics:raises raised RuntimeError: no metric today; fix the metric function"),
    (["--model", "tinynets:mlp", "--input-shape", "64", "--eval", "metrics:not_a_number", "--eval-direction", "lower"],
     r"Error: --eval metrics:not_a_number returned nan, not a finite number"),
    (["--model", "tinynets:mlp", "--input-shape", "64", "--eval", "metrics:absent", "--eval-direction", "lower"],
     r"Error: --eval metrics:absent cannot be imported \(AttributeError"),
    (["--model", "hf:llama", "--model-size", "tiny", "--task", "generate", "--eval-data", str(LICENCE)],
     r"Error: --eval-data: hf:llama@tiny is built from a configuration and has no tokenizer"),
])
def test_data_the_model_cannot_take_is_one_line_exit_2(here: Path, args: list[str], message: str) -> None:
    proc = autotune_cli(here, "bench", *QUICK, "--cache-dir", str(here / "bad-cache"),
                        *(a.format(here=here) for a in args))
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert re.match(message.format(here=here), proc.stderr) and len(proc.stderr.strip().splitlines()) == 1, \
        proc.stderr


def test_a_search_records_quality_and_its_limit_and_the_confirmation_rechecks(here: Path) -> None:
    proc = autotune_cli(here, "search", "--model", "tinynets:mlp", "--input-shape", "64", "--eval-data",
                        "labelled.pt", "--max-quality-drop", "0", "--trials", "3", "--space", "quick",
                        "--replicates", "1", "--confirm-top", "1", "--confirm-rounds", "5", *QUICK, "--json")
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert body["study"].endswith("-qdropmax0") and body["speed_vs_quality"]
    study = optuna.load_study(study_name=body["study"], storage=f"sqlite:///{here}/studies/{body['study']}.db")
    completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert completed and all(t.user_attrs["quality"]["split"] == "search" for t in completed)
    for t in completed:
        over = t.user_attrs["constraint_quality_drop_over_limit"]
        assert over == pytest.approx(t.user_attrs["quality"]["drop"], abs=1e-4)
        assert t.user_attrs["feasible"] == (over <= 0)
    verdict = study.user_attrs["confirmation"]
    if verdict["recommended_trial"] != verdict["baseline_trial"] or "quality" in verdict:
        assert verdict["quality"]["split"] == "confirm"
    exported = autotune_cli(here, "export", "fast.env", "--study", body["study"], "--max-quality-drop", "100")
    assert exported.returncode == 0, exported.stderr
    assert "# quality on --eval-data (the search's held-out part): accuracy " in (here / "fast.env").read_text()
    made = autotune_cli(here, "report", "-o", "report.html", "--study", body["study"])
    assert made.returncode == 0, made.stderr
    dom = chromium(here / "profile", "--dump-dom", (here / "report.html").as_uri())
    assert dom.returncode == 0 and drawn(dom.stdout, "quality"), dom.stderr[-2000:]
