"""`--task generate` on the command line: each mistake one `Error:` line, exit code 2, nothing
written; a plan carries the prompt length and the new tokens to the child; a search's space holds
the generation knobs and backends alone."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.config import space, space_fit
from autotune.config.knobs import Config
from autotune.config.models import resolve
from autotune.host.machine import this_machine
from autotune.search import opening
from tests.support.cli import assert_one_error_line, run_cli

GENERATE = ["--task", "generate"]


@pytest.mark.parametrize("command", [["plan"], ["bench", "--cache-dir", "cache"], ["search", "--trials", "2"]])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "hf:qwenn", *GENERATE],
         "Error: unknown transformers model type 'qwenn'; did you mean qwen3, qwen2"),
        (["--model", "hf:qwen2", "--model-size", "big", *GENERATE],
         "Error: --model hf:qwen2@big: model size 'big' is not a size; give parameters like 0.5b"),
        (["--model", "resnet18", "--model-size", "0.5b", *GENERATE],
         "Error: --model-size scales an hf:TYPE model"),
        (["--model", "hf:gpt2", *GENERATE, "--prompt-len", "1000"],
         "Error: a prompt of 1000 tokens and 64 new ones need 1064 positions and hf:gpt2 takes 1024 "
         "(max_position_embeddings); give a shorter --prompt-len or fewer --new-tokens"),
        (["--model", "hf:gpt2", *GENERATE, "--new-tokens", "0"], "Error: Invalid value for '--new-tokens'"),
        (["--model", "hf:gpt2", *GENERATE, "--prompt-len", "0"],
         "Error: Invalid value for '--seq-len' / '--prompt-len'"),
        (["--model", "resnet18", *GENERATE], "Error: --task generate needs a causal language model"),
        (["--model", "hf:vit", *GENERATE], "Error: hf:vit (vit) is not a causal language model"),
        (["--model", "hf:gpt2", "--new-tokens", "8"], "Error: --new-tokens is how many tokens --task generate"),
        (["--model", "hf:gpt2", *GENERATE, "--seq-lens", "16,32"],
         "Error: --task generate takes --prompt-len N and --new-tokens N, not --seq-lens"),
        (["--model", "hf:gpt2", *GENERATE, "--set", "mkldnn=on"],
         "Error: --set mkldnn does not apply to --task generate"),
        (["--model", "resnet18", "--set", "kv_cache=static"],
         "Error: --set kv_cache does not apply to a model that is not generating"),
    ],
)
def test_each_mistake_is_one_line_exit_2_and_nothing_written(capsys: pytest.CaptureFixture[str], empty: Path,
                                                            command: list[str], args: list[str],
                                                            message: str) -> None:
    assert_one_error_line(capsys, empty, message, *command, *args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "resnet18", "--max-tpot-ms", "20"],
         "Error: --max-tpot-ms bounds the time per output token of text generation; add --task generate"),
        (["--model", "hf:gpt2", *GENERATE, "--max-tpot-ms", "0"],
         "Error: --max-tpot-ms 0 is not allowed; give a positive limit in ms per output token"),
        (["--model", "hf:gpt2", *GENERATE, "--max-tpot-ms", "inf"],
         "Error: Invalid value for '--max-tpot-ms': 'inf' is not a finite number."),
    ],
)
def test_a_bad_token_limit_is_one_line_exit_2_and_nothing_written(capsys: pytest.CaptureFixture[str], empty: Path,
                                                                 args: list[str], message: str) -> None:
    assert_one_error_line(capsys, empty, message, "search", "--trials", "2", *args)


def test_a_token_limit_names_the_study() -> None:
    model = resolve("hf:qwen2@tiny", task="generate", new_tokens=8)
    request = opening.SearchRequest(model="hf:qwen2@tiny", trials=2, space=space.find("generate"), task="generate",
                                    max_tpot_ms=25.0)
    assert opening.study_name(request, model) == "qwen2_tiny-generate-bs1-latency-tpotmax25ms"


def test_the_plan_carries_the_prompt_and_the_new_tokens(capsys: pytest.CaptureFixture[str], empty: Path) -> None:
    code, out, _ = run_cli(capsys, "plan", "--model", "hf:qwen2", "--model-size", "tiny", *GENERATE, "--prompt-len",
                           "16", "--new-tokens", "8", "--json")
    assert code == 0
    command = json.loads(out)["instances"][0]["command"]
    assert command[command.index("--model") + 1] == "hf:qwen2@tiny"
    assert command[command.index("--item-shape") + 1] == "16x8"
    assert command[command.index("--task") + 1] == "generate"


def test_a_generating_model_is_searched_over_the_generation_knobs_alone() -> None:
    request = opening.SearchRequest(model="hf:qwen2@tiny", trials=2, space=space.find("generate"), task="generate",
                                    new_tokens=4, seq_len=8)
    model, searched = opening.validate(request, this_machine())
    assert model.item_shape == (8, 4) and model.new_tokens == 4
    names = searched.names()
    assert "kv_cache" in names and "attention" in names
    assert not {"mkldnn", "weight_cache", "memory_format", "shapes", "ort_optimization"} & set(names)
    backends = {str(b) for b in searched.get("backend").choices}  # type: ignore[union-attr]
    assert {"eager", "inductor"} <= backends and not {"torchscript", "onnxruntime"} & backends
    precisions = {str(p) for p in searched.get("precision").choices}  # type: ignore[union-attr]
    assert "int4_weight_only" in precisions and "int8" not in precisions


def test_any_other_model_is_searched_without_them() -> None:
    request = opening.SearchRequest(model="resnet18", trials=2, space=space.find("generate"))
    _, searched = opening.validate(request, this_machine())
    assert not {"kv_cache", "attention"} & set(searched.names())
    assert "int4_weight_only" not in {str(p) for p in searched.get("precision").choices}  # type: ignore[union-attr]
    assert "llamacpp" not in {str(b) for b in searched.get("backend").choices}  # type: ignore[union-attr]


def test_the_task_refusals_say_why() -> None:
    generating, other = space_fit.task_refusals(True), space_fit.task_refusals(False)
    assert generating[("torchscript", "fp32")] == "it does not generate text"
    assert generating[("inductor", "int8")].startswith("it generates text with fp32/bf16")
    assert other[("llamacpp", "fp32")] == "it runs --task generate alone"
    assert other[("eager", "int4_weight_only")] == "int4 weights are for --task generate"
    space_fit.check_task_knobs(Config.from_assignments(["kv_cache=static"]), True)


def test_a_size_is_part_of_the_model_and_of_its_study_name() -> None:
    spec = resolve("hf:qwen2@0.5B", task="generate")
    assert spec.name == "hf:qwen2@0.5b" and spec.item_shape == (128, 64)
    request = opening.SearchRequest(model="hf:qwen2@0.5b", trials=2, space=space.find("default"), task="generate")
    assert opening.study_name(request, spec) == "qwen2_0.5b-generate-bs1-latency"


@pytest.mark.parametrize("command", [["plan"], ["bench", "--cache-dir", "cache"], ["search", "--trials", "2"]])
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(b"PK\x03\x04 a zip renamed"), " is not a GGUF file (it does not start with the bytes "
                                                               "GGUF)"),
        (lambda p: None, ": no such file; give the path of a GGUF file"),
        (lambda p: p.mkdir(), " is a folder, not a GGUF file; give the .gguf file itself"),
    ],
    ids=["not gguf", "missing", "folder"],
)
def test_a_gguf_file_that_is_not_one_is_one_line_exit_2_and_nothing_written(
        capsys: pytest.CaptureFixture[str], empty: Path, command: list[str], make: Callable[[Path], object],
        message: str) -> None:
    path = empty.parent / "model.gguf"
    make(path)
    assert_one_error_line(capsys, empty, f"Error: --model {path}{message}", *command, "--model", str(path),
                          *GENERATE)


def test_the_plan_of_a_gguf_file_runs_its_converted_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                           tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(capsys, "plan", "--model", str(tiny_gguf), *GENERATE, "--prompt-len", "16",
                           "--new-tokens", "8", "--json")
    assert code == 0
    command = json.loads(out)["instances"][0]["command"]
    folder = Path(command[command.index("--model") + 1].removeprefix("hf:"))
    assert folder.name == "tiny-llama.f32" and folder.is_relative_to(tmp_path / "studies" / "cache" / "artifacts")
    assert command[command.index("--item-shape") + 1] == "16x8"
