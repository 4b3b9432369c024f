"""The quality figures (`autotune.measure.quality`): an interval labelled 95% covers 95%, a drop is
fp32's figure against the configuration's on the same items, and the words say the numbers."""

from __future__ import annotations

import math
import random

import pytest

from autotune.measure import quality


def test_wilson_interval_matches_the_textbook_value() -> None:
    low, high = quality.wilson(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)  # Wilson (1927), z = 1.96
    assert quality.wilson(0, 20)[0] == 0.0 and quality.wilson(20, 20)[1] == 1.0


def _covered(trials: int, draw: object) -> float:
    return sum(bool(draw()) for _ in range(trials)) / trials  # type: ignore[operator]


def test_the_paired_accuracy_drop_interval_covers_95_percent() -> None:
    """200 items, fp32 right alone on 6% of them and the configuration right alone on 2%: the true
    drop is 4 points; Agresti-Min's interval should hold it about 95% of the time."""
    rng = random.Random(1)

    def one() -> bool:
        cells = [rng.random() for _ in range(200)]
        b, c = sum(x < 0.06 for x in cells), sum(0.06 <= x < 0.08 for x in cells)
        low, high = quality.paired_difference(b, c, 200)
        return low <= 0.04 <= high

    assert 0.93 <= _covered(3000, one) <= 0.975


def test_the_t_interval_over_windows_covers_95_percent() -> None:
    rng = random.Random(2)

    def one() -> bool:
        low, high = quality.mean_interval([rng.gauss(3.0, 0.4) for _ in range(8)])
        return low <= 3.0 <= high

    assert 0.935 <= _covered(4000, one) <= 0.965


def _lm_counts(nll: list[float], nll_ref: list[float]) -> dict[str, object]:
    return {"kind": "perplexity", "windows": len(nll), "window_tokens": 512, "scored_per_window": 255,
            "nll": nll, "nll_reference": nll_ref, "kl_per_window": [0.01, 0.03, 0.02], "kl_mean": 0.02,
            "kl_max": 0.9, "kl_quantiles": {"0.5": 0.01, "0.99": 0.2}, "same_top": 700, "positions": 765}


def test_perplexity_is_exp_of_the_mean_nll_and_its_drop_is_paired() -> None:
    found = quality.figures(_lm_counts([3.03, 3.231, 2.929], [3.0, 3.2, 2.9]), "search")
    assert found["value"] == pytest.approx(math.exp(9.19 / 3))
    assert found["reference_value"] == pytest.approx(math.exp(9.1 / 3))
    assert found["drop"] == pytest.approx(100 * (math.exp(0.09 / 3) - 1))
    low, high = found["drop_interval"]
    assert low < found["drop"] < high and low > 0  # every window worse: the paired interval excludes 0
    assert found["same_top"] == pytest.approx(700 / 765) and found["kl_p99"] == 0.2
    assert found["drop_relative"] == pytest.approx(found["drop"])  # perplexity's drop is relative already
    assert found["drop_absolute"] == pytest.approx(found["value"] - found["reference_value"])
    assert found["unit"] == "%" and found["split"] == "search"


def test_accuracy_counts_become_points() -> None:
    counts = {"kind": "accuracy", "items": 400, "both_right": 350, "reference_only_right": 12,
              "candidate_only_right": 4, "both_wrong": 34, "top1_agreement_items": 380}
    found = quality.figures(counts, "confirm")
    assert found["value"] == pytest.approx(88.5) and found["reference_value"] == pytest.approx(90.5)
    assert found["drop"] == pytest.approx(2.0) and found["unit"] == "points"
    assert found["drop_absolute"] == pytest.approx(2.0) and found["drop_relative"] == pytest.approx(200 / 90.5)
    assert found["drop_interval"][0] < 2.0 < found["drop_interval"][1]
    assert quality.describe(found).startswith("accuracy 88.50% (95% CI ")
    assert "fp32 90.50%: a drop of +2.00 points" in quality.describe(found)


def test_a_drop_that_is_not_a_number_is_no_drop() -> None:
    assert quality.drop_of({"drop": float("nan")}) is None
    assert quality.drop_of({"error": "it crashed"}) is None
    assert quality.drop_of(None) is None
    assert quality.drop_of({"drop": 1.5}) == 1.5
    assert quality.describe({"error": "it crashed"}) == "quality not measured: it crashed"


def test_a_metric_of_the_users_drops_its_own_way() -> None:
    higher = quality.figures({"kind": "custom", "metric": "m:f", "direction": "higher", "value": 0.8,
                              "reference_value": 0.9, "batches": 4}, "search")
    lower = quality.figures({"kind": "custom", "metric": "m:f", "direction": "lower", "value": 0.8,
                             "reference_value": 0.9, "batches": 4}, "search")
    assert higher["drop"] == pytest.approx(0.1) and lower["drop"] == pytest.approx(-0.1)
    assert higher["drop_relative"] == pytest.approx(100 / 9) and higher["interval"] is None
    assert quality.describe(higher) == ("m:f 0.8 (higher is better) on 4 batch(es), fp32 0.9: a drop of +0.1 "
                                        "(+11.11%)")


def test_a_drop_is_read_against_the_limit_with_its_interval() -> None:
    """The SmolLM2 search's winner on the confirmation's windows: +1.34% (95% CI +0.62 to +2.06)
    against 2%: within on its estimate, not shown within."""
    found = {"unit": "%", "confidence": 0.95, "drop": 1.34, "drop_interval": [0.62, 2.06]}
    assert quality.against_limit(found, 2.0) == ("within the 2% limit on its estimate, not shown within it: its 95% "
                                                 "interval reaches +2.06% (more held-out data would narrow it)")
    assert quality.against_limit(found, 2.5) == "within the 2.5% limit, its whole 95% interval too"
    assert quality.against_limit(found, 1.0) == "over the 1% limit"
    points = {"unit": "points", "confidence": 0.95, "drop": 0.5, "drop_interval": [-0.2, 0.9]}
    assert quality.against_limit(points, 1.0) == "within the 1 points limit, its whole 95% interval too"
    assert quality.against_limit({"drop": float("nan")}, 1.0) == "not measured"
    assert quality.against_limit({"unit": "", "drop": 0.1}, 0.5) == "within the 0.5 limit"
