"""`--seq-lens` on the command line (its mistakes are in test_hf.py's table): a plan carries the
buckets and their weights to the child, an exported environment gives them back, and the buckets'
builds combine into one set-up record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.child import rounds
from autotune.measure import requests
from autotune.model import buckets, envfile
from tests.support.cli import run_cli


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
    env = {"AUTOTUNE_MODEL": "hf:bert", envfile.SEQ_LENS_VAR: "32,128", envfile.SEQ_LEN_WEIGHTS_VAR: "0.75,0.25"}
    assert requests.exported_request(env).buckets == buckets.Buckets((32, 128), (0.75, 0.25))
    with pytest.raises(requests.ConfigError, match="AUTOTUNE_SEQ_LENS='128,32': .* is not increasing"):
        requests.exported_request({**env, envfile.SEQ_LENS_VAR: "128,32"})


def test_the_buckets_builds_combine_into_one_setup_record() -> None:
    each = [{"compile_s": 2.0, "max_rel_err": 1e-6, "min_cosine": 0.999, "artifact_hit": False, "model": "m"},
            {"compile_s": 3.0, "max_rel_err": 1e-4, "min_cosine": 0.99, "artifact_hit": True, "model": "m"}]
    assert rounds.combined(each) == {"compile_s": 5.0, "max_rel_err": 1e-4, "min_cosine": 0.99,
                                     "artifact_hit": False, "model": "m"}


def test_bench_says_which_lengths_stood_for_a_bucket(capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import display

    instance = {"index": 0, "buckets": {
        "8": {"latency_p50_ms": 1.5, "sweeps": 4, "lengths": [8], "weight": 0.5},
        "32": {"latency_p50_ms": 4.25, "sweeps": 4, "lengths": [12, 18, 24, 30], "weight": 0.5}}}
    ok = {"ok": True, "latency_p50_ms": 2.9, "latency_p90_ms": 3.0, "throughput_ips": 340.0, "peak_rss_mb": 100.0}
    display.bench_result({"result": ok | {"instances": [ok | instance | {"samples": 4}]}})
    out = " ".join(capsys.readouterr().out.split())
    assert "8 tokens 1.50 (50%)," in out
    assert "32 tokens 4.25 (50%; mean of 12/18/24/30 tokens)" in out
