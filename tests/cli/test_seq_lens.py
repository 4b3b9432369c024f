"""`--seq-lens` on the command line: a bucket list that is not one is one `Error:` line, exit code 2,
nothing written; a plan carries the buckets and their weights to the child; a study's name and
settings carry them, and the export writes them for `apply`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.child import buckets, rounds
from autotune.measure import requests
from tests.support.cli import run_cli


@pytest.fixture
def empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "here"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


@pytest.mark.parametrize("command", [["plan"], ["bench", "--cache-dir", "cache"], ["search", "--trials", "2"]])
@pytest.mark.parametrize(
    ("args", "message"),
    [
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
    ],
)
def test_each_mistake_is_one_line_exit_2_and_nothing_written(capsys: pytest.CaptureFixture[str], empty: Path,
                                                            command: list[str], args: list[str],
                                                            message: str) -> None:
    code, out, err = run_cli(capsys, *command, *args)
    assert code == 2 and out == ""
    assert err.startswith(message), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert list(empty.iterdir()) == []


def test_the_plan_carries_the_buckets_and_their_shares(capsys: pytest.CaptureFixture[str], tiny_bert: Path) -> None:
    code, out, err = run_cli(capsys, "plan", "--model", f"hf:{tiny_bert}", "--seq-lens", "16,32,64",
                             "--seq-len-weights", "1,2,1", "--json")
    assert code == 0, err
    bench = json.loads(out)["bench"]
    assert (bench["item_shape"], bench["seq_lens"], bench["seq_len_weights"]) == ([64], [16, 32, 64],
                                                                                   [0.25, 0.5, 0.25])
    command = json.loads(out)["instances"][0]["command"]
    assert command[command.index("--seq-lens") + 1] == "16,32,64"
    assert command[command.index("--seq-len-weights") + 1] == "0.25,0.5,0.25"


def test_an_exported_environment_gives_the_buckets_back() -> None:
    env = {"AUTOTUNE_MODEL": "hf:bert", buckets.SEQ_LENS_VAR: "32,128", buckets.SEQ_LEN_WEIGHTS_VAR: "0.75,0.25"}
    assert requests.exported_request(env).buckets == buckets.Buckets((32, 128), (0.75, 0.25))
    with pytest.raises(requests.ConfigError, match="AUTOTUNE_SEQ_LENS='128,32': .* is not increasing"):
        requests.exported_request({**env, buckets.SEQ_LENS_VAR: "128,32"})


def test_the_buckets_builds_combine_into_one_setup_record() -> None:
    each = [{"compile_s": 2.0, "max_rel_err": 1e-6, "min_cosine": 0.999, "artifact_hit": False, "model": "m"},
            {"compile_s": 3.0, "max_rel_err": 1e-4, "min_cosine": 0.99, "artifact_hit": True, "model": "m"}]
    assert rounds.combined(each) == {"compile_s": 5.0, "max_rel_err": 1e-4, "min_cosine": 0.99,
                                     "artifact_hit": False, "model": "m"}
