"""Sequence-length buckets: parsing the lengths, padding a batch to its bucket and cutting the outputs
back, the bucketed `apply` for lengths inside, between and beyond the buckets, and the child's
weighted sample over a round of buckets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import torch

import autotune
from autotune.child import rounds, timing
from autotune.model import apply, batches, buckets, envfile
from autotune.model.knobs import ModelKnobs
from tests.fixtures.models import tinynets


def tokens(length: int, size: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 500, (size, length), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def eager(model: Any, batch: Any) -> Any:
    with torch.no_grad():
        return batches.call(model, batch)


@pytest.mark.parametrize(("lengths", "weights", "message"), [
    ("128,32", "", "--seq-lens '128,32' is not increasing; give each length once, smallest first"),
    ("32,32", "", "is not increasing"),
    ("32,x", "", "--seq-lens '32,x' is not a list of lengths like 32,128,384"),
    ("", "", "is not a list of lengths"),
    ("0,8", "", "every length must be 1 or more"),
    ("8,16", "1", "--seq-len-weights gives 1 weights for 2 lengths"),
    ("8,16", "0,0", "not all 0"),
    ("8,16", "1,-1", "0 or more"),
    ("8,16", "1,nan", "must be finite"),
])
def test_a_bucket_list_that_is_not_one_says_what_to_give(lengths: str, weights: str, message: str) -> None:
    with pytest.raises(buckets.BucketError, match=message.replace("(", r"\(").replace("+", r"\+")):
        buckets.Buckets.parse(lengths, weights)


def test_weights_are_shares_and_default_to_equal() -> None:
    assert buckets.Buckets.parse("32, 128,384").weights == pytest.approx((1 / 3,) * 3)
    assert buckets.Buckets.parse("32,128", "1,3") == buckets.Buckets((32, 128), (0.25, 0.75))


def test_a_batch_goes_to_the_smallest_bucket_that_holds_it() -> None:
    found = buckets.Buckets.parse("8,16,32")
    assert [found.fitting(n) for n in (1, 8, 9, 16, 17, 32)] == [8, 8, 16, 16, 32, 32]
    with pytest.raises(autotune.ApplyError, match=r"an input of 33 tokens is longer than the largest bucket \(32\)"):
        found.fitting(33)


def test_fitting_pads_token_tensors_with_zeros_and_leaves_other_inputs() -> None:
    batch = {**tokens(5), "pixel_scale": torch.ones(2, 3)}
    padded = buckets.fit(batch, 8)
    assert padded["input_ids"].shape == (2, 8) and padded["attention_mask"][:, 5:].eq(0).all()
    assert torch.equal(padded["input_ids"][:, :5], batch["input_ids"]) and padded["pixel_scale"] is batch["pixel_scale"]
    assert torch.equal(buckets.fit(batch, 3)["input_ids"], batch["input_ids"][:, :3])
    assert buckets.sequence_length(padded) == 8


def test_a_batch_without_token_inputs_or_with_ragged_ones_is_refused() -> None:
    with pytest.raises(autotune.ApplyError, match="sequence-length buckets need token inputs"):
        buckets.sequence_length(torch.randn(2, 16))
    with pytest.raises(autotune.ApplyError, match=r"different lengths \[4, 5\]"):
        buckets.sequence_length({"input_ids": tokens(5)["input_ids"],
                                 "attention_mask": torch.ones(2, 4, dtype=torch.long)})


@pytest.fixture
def bucketed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> autotune.Applied:
    env = {**apply.to_env(ModelKnobs(backend="torchscript")), buckets.SEQ_LENS_VAR: "8,16,32",
           envfile.ARTIFACTS_VAR: str(tmp_path)}
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    return autotune.apply(tinynets.masked_tokens(), tokens(12), check=True)


@pytest.mark.parametrize("length", [3, 8, 12, 16, 30, 32])
def test_the_bucketed_model_answers_as_eager_for_lengths_inside_and_between_buckets(
        bucketed: autotune.Applied, length: int) -> None:
    batch = tokens(length, seed=length)
    hidden, logits = bucketed(**batch)
    want_hidden, want_logits = eager(tinynets.masked_tokens(), batch)
    assert hidden.shape == want_hidden.shape == (2, length, 32)  # cut back to the real tokens
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(hidden, want_hidden, rtol=1e-4, atol=1e-5)


def test_the_bucketed_model_compiled_one_model_per_bucket_and_refuses_a_longer_input(
        bucketed: autotune.Applied) -> None:
    assert sorted(bucketed.setup["buckets"]) == ["16", "32", "8"]
    assert all(part["max_rel_err"] <= 1e-3 for part in bucketed.setup["buckets"].values())
    with pytest.raises(autotune.ApplyError, match=r"an input of 33 tokens is longer than the largest bucket \(32\); "
                                                  r"truncate it to 32 tokens"):
        bucketed(**tokens(33))


@pytest.fixture(scope="module")
def ranged(tmp_path_factory: pytest.TempPathFactory) -> autotune.Applied:
    chosen = apply.Deployment(ModelKnobs(backend="inductor", shapes="dynamic"),
                               artifacts=tmp_path_factory.mktemp("artifacts"), seq_lens=(8, 16, 32))
    return apply.apply_buckets(tinynets.masked_tokens(), tokens(12), chosen, check=True)


@pytest.mark.parametrize("length", [1, 3, 8, 12, 32])
def test_shapes_dynamic_runs_each_batch_at_its_own_length_as_eager(ranged: autotune.Applied, length: int) -> None:
    batch = tokens(length, seed=length)
    hidden, logits = ranged(**batch)
    want_hidden, want_logits = eager(tinynets.masked_tokens(), batch)
    assert hidden.shape == want_hidden.shape == (2, length, 32)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(hidden, want_hidden, rtol=1e-4, atol=1e-5)


def test_shapes_dynamic_is_one_artifact_checked_at_every_bucket_and_refuses_a_longer_input(
        ranged: autotune.Applied) -> None:
    assert "buckets" not in ranged.setup and ranged.setup["artifact_file"].endswith(".pt2")
    assert len(list(Path(ranged.setup["artifact_file"]).parent.glob("*.pt2"))) == 1
    assert ranged.setup["max_rel_err"] <= 1e-3
    with pytest.raises(autotune.ApplyError, match=r"an input of 33 tokens is longer than the largest bucket \(32\)"):
        ranged(**tokens(33))
    with pytest.raises(autotune.ApplyError, match=r"the compiled model takes inputs .*input_ids=2xL:int64"):
        ranged(**tokens(8, size=3))  # the batch size stays the example's


def test_the_guard_of_shapes_dynamic_compares_every_shorter_bucket_with_eager() -> None:
    chosen = apply.Deployment(ModelKnobs(backend="inductor", shapes="dynamic"), seq_lens=(8, 16, 32))
    checked = apply.checked_batches(tokens(32), chosen)
    assert [buckets.sequence_length(batch) for batch in checked] == [32, 8, 16]
    one_each = apply.checked_batches(tokens(32), apply.Deployment(ModelKnobs(backend="inductor"), seq_lens=(8, 32)))
    assert len(one_each) == 1  # a model per bucket is checked on its own length


def test_shapes_dynamic_without_the_buckets_it_serves_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in apply.to_env(ModelKnobs(backend="inductor", shapes="dynamic")).items():
        monkeypatch.setenv(var, value)
    with pytest.raises(autotune.ApplyError, match="sets shapes=dynamic without the sequence lengths it serves "
                                                  r"\(AUTOTUNE_SEQ_LENS\); export the env file again"):
        autotune.apply(tinynets.masked_tokens(), tokens(12))


def test_an_eager_configuration_needs_no_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**apply.to_env(ModelKnobs(precision="bf16")), buckets.SEQ_LENS_VAR: "8,16"}
    chosen = apply.from_env(env)
    assert chosen is not None and chosen.seq_lens == (8, 16)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    applied = autotune.apply(tinynets.masked_tokens(), tokens(12))
    assert "buckets" not in applied.setup and applied(**tokens(20))[0].shape == (2, 20, 32)  # any length


def test_buckets_in_an_env_file_that_are_not_increasing_are_one_error() -> None:
    env = {**apply.to_env(ModelKnobs(backend="torchscript")), buckets.SEQ_LENS_VAR: "16,8"}
    with pytest.raises(autotune.ApplyError, match="AUTOTUNE_SEQ_LENS='16,8' in x.env is not an increasing list"):
        apply.from_env(env, "x.env")


def test_buckets_with_an_input_that_has_no_tokens_is_one_error(tmp_path: Path) -> None:
    chosen = apply.Deployment(ModelKnobs(backend="torchscript"), artifacts=tmp_path, seq_lens=(8, 16))
    with pytest.raises(autotune.ApplyError, match="sequence-length buckets need token inputs"):
        apply.apply_buckets(tinynets.cnn(), torch.randn(1, 3, 32, 32), chosen, check=False)


def test_a_round_over_buckets_is_one_sample_weighted_by_the_buckets_shares() -> None:
    spent = {8: 0.002, 16: 0.010}

    def slow(seconds: float) -> Any:
        def forward(batch: Any) -> Any:
            deadline = timing.time.perf_counter() + seconds
            while timing.time.perf_counter() < deadline:
                pass
            return batch
        return forward

    mixed = buckets.Mixed([slow(spent[8]), slow(spent[16])], buckets.Buckets.parse("8,16", "3,1"), batch_size=2)
    rounds = iter([buckets.Round(((tokens(8),), (tokens(16),)))] * 100)
    args = argparse.Namespace(min_iterations=5, give_up_after=0.0, give_up_iterations=1, give_up_above_ms=())
    now = timing.time.monotonic()
    result = timing.timed_loop(args, mixed, rounds, timing.Window(now, now))
    weighted = (3 * spent[8] + spent[16]) / 4 * 1e3
    assert len(result["latencies_ms"]) == 5
    assert all(weighted <= sample <= weighted * 1.5 + 1 for sample in result["latencies_ms"])
    # the stream of 3:1 requests serves 2 items per `weighted` ms, whatever the round's wall time
    assert result["items"] / sum(result["iterations_ms"]) * 1e3 == pytest.approx(2 / weighted * 1e3, rel=0.2)
    assert result["buckets"]["8"]["sweeps"] == 5 and result["buckets"]["16"]["latency_p50_ms"] >= 10
    assert result["buckets"]["8"]["lengths"] == [8]


def test_a_sweep_times_a_bucket_at_the_mean_of_its_lengths() -> None:
    """A model that takes any length is timed at lengths spread over the bucket, every one in each
    sample: the bucket's figure is their mean call, and the stream's items count every call."""
    def by_length(batch: Any) -> Any:  # 0.5 ms a token
        deadline = timing.time.perf_counter() + buckets.sequence_length(batch) * 0.0005
        while timing.time.perf_counter() < deadline:
            pass
        return batch

    mixed = buckets.Mixed([by_length], buckets.Buckets.parse("16"), batch_size=2, spreads=[(4, 12)])
    rounds = iter([buckets.Round(((tokens(4), tokens(12)),))] * 100)
    args = argparse.Namespace(min_iterations=12, give_up_after=0.0, give_up_iterations=1, give_up_above_ms=())
    now = timing.time.monotonic()
    result = timing.timed_loop(args, mixed, rounds, timing.Window(now, now))
    assert len(result["latencies_ms"]) == 6  # --min-iterations counts the model's calls: 2 a sample
    assert all(4.0 <= sample <= 6.0 + 1 for sample in result["latencies_ms"])  # the mean of 2 and 6 ms
    # two calls a round, each of 2 items: a stream of such requests serves 2 items per 4 ms
    assert result["items"] == pytest.approx(6 * 2 * 2, rel=0.3)
    assert result["buckets"]["16"] | {"latency_p50_ms": 0} == {"latency_p50_ms": 0, "sweeps": 6, "lengths": [4, 12],
                                                                  "weight": 1.0}


def test_the_lengths_that_stand_for_a_bucket_are_the_middles_of_equal_parts() -> None:
    assert buckets.spread(1, 32) == (5, 13, 21, 29)
    assert buckets.spread(33, 128) == (45, 69, 93, 117)
    assert buckets.spread(129, 384) == (161, 225, 289, 353)
    assert buckets.spread(5, 5) == (5,) and buckets.spread(1, 2) == (1, 2)
    assert buckets.spread(1, 3, count=8) == (1, 2, 3)
    # the midpoint rule: for a cost linear in the length, their mean is the mean over every length
    lengths = buckets.spread(129, 384)
    assert sum(lengths) / len(lengths) == pytest.approx(sum(range(129, 385)) / 256, abs=0.5)


@pytest.mark.parametrize("positional", [False, True])
@pytest.mark.parametrize("variadic", [False, True])
def test_dynamic_shapes_fit_the_module_torch_export_is_given(positional: bool, variadic: bool) -> None:
    class Variadic(torch.nn.Module):  # as `convert` wraps a model for bf16's autocast
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.inner(*args, **kwargs)

    example = tokens(32)
    batch = (example["input_ids"], example["attention_mask"]) if positional else example
    module = Variadic(tinynets.masked_tokens()) if variadic else tinynets.masked_tokens()
    args, kwargs = batches.split(batch)
    exported = torch.export.export(module, args, kwargs, dynamic_shapes=buckets.dynamic_shapes(batch, variadic))
    assert [str(r) for r in exported.range_constraints.values()] == ["VR[1, 32]"]


def test_a_round_interleaves_the_buckets_as_a_stream_mixes_them() -> None:
    """A short request after a long one costs more than after another short one: a round calls the
    first length of each bucket, then the second of each, so each bucket is timed among the others."""
    called: list[int] = []

    def record(batch: Any) -> Any:
        called.append(buckets.sequence_length(batch))
        return batch

    mixed = buckets.Mixed([record, record], buckets.Buckets.parse("8,32"), batch_size=1, spreads=[(2, 6), (12, 24)])
    outputs = mixed(buckets.Round(((tokens(2), tokens(6)), (tokens(12), tokens(24)))))
    assert called == [2, 12, 6, 24]
    assert [[buckets.sequence_length(o) for o in each] for each in outputs] == [[2, 6], [12, 24]]


def test_a_model_that_takes_any_length_serves_the_shortest_lengths_once_before_it_is_timed() -> None:
    """As a service that has served many lengths holds it (oneDNN keeps a primitive per shape, and a
    process holding hundreds runs short requests slower): one batch of the example's size at each length from 1, cut
    from the largest bucket's example, through the model the rounds time."""
    called: list[tuple[int, int, bool]] = []

    def record(batch: Any) -> Any:
        called.append((buckets.sequence_length(batch), int(batch["input_ids"].shape[0]),
                       all(t.is_contiguous() for t in batch.values())))
        return batch

    mixed = buckets.Mixed([record, record], buckets.Buckets.parse("8,32"), batch_size=2, spreads=[(2, 6), (12, 24)])
    example = tokens(32, size=2)
    done = rounds.fill(mixed, example, 32, count=20)
    assert called == [(length, 2, True) for length in range(1, 21)]
    assert done["fill_lengths"] == 20 and done["fill_s"] >= 0
    called.clear()  # never past the largest bucket: the model takes no longer input
    assert rounds.fill(mixed, example, 32)["fill_lengths"] == 32 and [c[0] for c in called] == list(range(1, 33))
    assert example["input_ids"].shape == (2, 32)  # the example itself is left whole
