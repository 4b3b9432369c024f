"""`--model hf:...` on the command line: every mistake is one `Error:` line, exit code 2, nothing
written; a plan carries the task and the sequence length to the child."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.support.cli import assert_one_error_line, run_cli


@pytest.mark.parametrize("command", [["plan"], ["bench", "--cache-dir", "cache"], ["search", "--trials", "2"]])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "hf:bret"], "Error: unknown transformers model type 'bret'; did you mean bert"),
        (["--model", "hf:./nothing"], "Error: --model hf:./nothing: no such folder; give a folder written by "
                                      "save_pretrained"),
        (["--model", "hf:."], "Error: --model hf:.: the folder has no config.json; save the model with "
                              "save_pretrained"),
        (["--model", "hf:bert-generation"], "Error: hf:bert-generation (bert-generation) has no "
                                            "sequence-classification head; use --task feature-extraction"),
        (["--model", "hf:bert", "--seq-len", "600"], "Error: --seq-len 600 is above the 512 positions hf:bert "
                                                      "takes (max_position_embeddings); give --seq-len 512 or less"),
        (["--model", "resnet18", "--seq-len", "16"], "Error: --seq-len is for text models (--model hf:NAME)"),
        (["--model", "hf:bert", "--seq-len", "16", "--input-shape", "16"],
         "Error: a transformers model takes --seq-len N (tokens per item), not --input-shape"),
        (["--model", "resnet18", "--task", "feature-extraction"],
         "Error: --task picks the head of a transformers model (--model hf:NAME); resnet18 is not one"),
        (["--model", "hf:bert", "--task", "translation"], "Error: Invalid value for '--task'"),
        (["--model", "hf:bert", "--seq-len", "0"], "Error: Invalid value for '--seq-len'"),
        (["--model", "hf:bert", "--seq-lens", "128,32"],
         "Error: --seq-lens '128,32' is not increasing; give each length once, smallest first, like 32,128,384"),
        (["--model", "hf:bert", "--seq-lens", "32,x"], "Error: --seq-lens '32,x' is not a list of lengths"),
        (["--model", "hf:bert", "--seq-lens", "32,640"],
         "Error: the largest of --seq-lens 640 is above the 512 positions hf:bert takes (max_position_embeddings)"),
        (["--model", "hf:bert", "--seq-lens", "32,64", "--seq-len", "16"],
         "Error: give --seq-len (one length) or --seq-lens (buckets), not both"),
        (["--model", "resnet18", "--seq-lens", "32,64"], "Error: --seq-lens is for text models (--model hf:NAME)"),
        (["--model", "hf:bert", "--seq-len-weights", "1,2"],
         "Error: --seq-len-weights weighs the lengths of --seq-lens; give --seq-lens too"),
        (["--model", "hf:bert", "--seq-lens", "32,64", "--seq-len-weights", "1"],
         "Error: --seq-len-weights gives 1 weights for 2 lengths; give one per length of --seq-lens"),
        (["--model", "hf:bert", "--set", "backend=inductor", "--set", "shapes=dynamic"],
         "Error: shapes=dynamic serves sequence-length buckets with one compiled model; it needs --seq-lens"),
    ],
)
def test_each_mistake_is_one_line_exit_2_and_nothing_written(capsys: pytest.CaptureFixture[str], empty: Path,
                                                            command: list[str], args: list[str],
                                                            message: str) -> None:
    assert_one_error_line(capsys, empty, message, *command, *args)


def test_without_transformers_the_fix_is_named(capsys: pytest.CaptureFixture[str], empty: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    code, _, err = run_cli(capsys, "plan", "--model", "hf:bert")
    assert code == 2
    assert err == ("Error: --model hf:bert needs transformers, which is not installed; "
                   "pip install 'autotune[transformers]'\n")


def test_the_plan_carries_the_task_and_the_length(capsys: pytest.CaptureFixture[str], tiny_bert: Path) -> None:
    code, out, err = run_cli(capsys, "plan", "--model", f"hf:{tiny_bert}", "--seq-len", "16", "--task",
                             "feature-extraction", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["bench"]["model"], data["bench"]["item_shape"], data["bench"]["task"]) == (
        f"hf:{tiny_bert}", [16], "feature-extraction")
    command = data["instances"][0]["command"]
    assert command[command.index("--item-shape") + 1] == "16" and command[-2:] == ["--task", "feature-extraction"]


def test_the_default_task_and_length(capsys: pytest.CaptureFixture[str], tiny_bert: Path) -> None:
    code, out, _ = run_cli(capsys, "plan", "--model", f"hf:{tiny_bert}", "--json")
    assert code == 0
    bench = json.loads(out)["bench"]
    assert (bench["item_shape"], bench["task"]) == ([128], "sequence-classification")


def test_real_tokenized_inputs_are_taken_as_they_are(capsys: pytest.CaptureFixture[str], tiny_bert: Path,
                                                     tmp_path: Path) -> None:
    inputs = tmp_path / "tokens.pt"
    torch.save({"input_ids": torch.randint(0, 1000, (4, 24)), "attention_mask": torch.ones(4, 24, dtype=torch.long)},
               inputs)
    code, out, _ = run_cli(capsys, "plan", "--model", f"hf:{tiny_bert}", "--example-inputs", str(inputs), "--json")
    assert code == 0
    bench = json.loads(out)["bench"]
    assert (bench["item_shape"], bench["example_inputs"], bench["task"]) == ([24], str(inputs),
                                                                             "sequence-classification")
