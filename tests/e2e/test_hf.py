"""hf: models for real: a tiny BERT folder benchmarked and searched through the installed command,
and `hf:bert` (BERT-base, random weights, nothing downloaded) built as the child builds it."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState
from torch.utils.data import default_collate

from autotune.child import inputs, sources, worker
from tests.support.cli import autotune

pytestmark = pytest.mark.e2e

QUICK = ["--duration", "0.2", "--warmup", "1", "--warmup-time", "0", "--min-iterations", "3"]


def test_bench_a_saved_folder_compiled_by_inductor(tmp_path: Path, tiny_bert: Path) -> None:
    proc = autotune(tmp_path, "bench", *QUICK, "--json", "--model", f"hf:{tiny_bert}", "--seq-len", "16",
                    "--set", "backend=inductor", "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["plan"]["bench"]["item_shape"] == [16]
    setup = data["result"]["instances"][0]["setup"]
    assert setup["model"] == f"hf:{tiny_bert}" and setup["output_dtype"] == "float32"
    assert Path(setup["artifact_file"]).exists() and setup["max_rel_err"] <= setup["tolerance"]


def test_search_a_saved_folder(tmp_path: Path, tiny_bert: Path) -> None:
    proc = autotune(tmp_path, "search", "--model", f"hf:{tiny_bert}", "--seq-len", "16", "--trials", "2",
                    "--space", "quick", "--replicates", "1", "--confirm-top", "0", *QUICK,
                    "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    name = "tiny-bert-sequence-classification-bs1-latency"
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'studies' / name}.db")
    assert study.user_attrs["task"] == "sequence-classification"
    assert any(t.state == TrialState.COMPLETE for t in study.get_trials())


def test_a_model_type_is_built_with_its_default_configuration() -> None:
    args = worker.parse_args(["--model", "hf:bert", "--item-shape", "8", "--result", "unused"])
    model = sources.load_model(args.model, "", args.task)
    assert sum(p.numel() for p in model.parameters()) > 100_000_000  # BERT-base
    batch = default_collate([inputs.dataset_of(args)[0]])
    with torch.no_grad():
        output = model(**batch)
    assert output.shape == (1, 2) and int(batch["input_ids"].max()) < 30522
    again = sources.load_model(args.model, "", args.task)  # seeded: every process builds the same weights
    assert torch.equal(next(iter(again.state_dict().values())), next(iter(model.state_dict().values())))
