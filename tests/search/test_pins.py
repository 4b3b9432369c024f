"""Pinned knobs (`--set`): held in every trial but the baseline, recorded for a resume, refused where
the machine or the space cannot honour them, narrowing the knobs and recipes they touch."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from autotune.base.errors import ConfigError
from autotune.config import recipes, space, space_fit
from autotune.config.knobs import Config
from autotune.config.space import SpaceError
from autotune.host.machine import Machine
from autotune.search import loop, opening
from autotune.study.storage import StudyError
from tests.support import probes
from tests.support.spaces import every
from tests.support.studies import DEFAULT, SPACE, ok_runner, request


def pins(*assignments: str) -> Config:
    return Config.from_assignments(assignments)


def searched(tmp_path: Path, here: Machine, trials: int, **kw: Any) -> opening.Search:
    opened = opening.open_search(request(tmp_path, trials, **kw), here)
    loop.run_search(opened, here, lambda event: None, runner=ok_runner)
    return opened


def test_pinned_knobs_hold_in_every_trial_but_the_baseline(tmp_path: Path, here: Machine) -> None:
    opened = searched(tmp_path, here, 5, space=SPACE, pins=pins("allocator=jemalloc", "dataloader_workers=1"))
    configs = [t.user_attrs["config"] for t in opened.study.get_trials()]
    assert configs[0] == "defaults"
    assert all({"allocator=jemalloc", "dataloader_workers=1"} <= set(c.split()) for c in configs[1:])
    assert len(set(configs)) == 5  # the rest is still searched: 2 x 2 configurations besides the baseline
    assert opened.study.user_attrs["pins"] == "allocator=jemalloc dataloader_workers=1"
    assert any(n.startswith("pinned: allocator=jemalloc dataloader_workers=1") for n in opened.notes)


def test_resuming_with_other_pins_is_refused_and_with_the_same_ones_goes_on(tmp_path: Path, here: Machine) -> None:
    searched(tmp_path, here, 3, space=SPACE, pins=pins("allocator=jemalloc"))
    refused = (r"^study 'resnet18-bs1-latency' was searched with --set allocator=jemalloc, not no --set pins; "
               r"give the same pins to resume it, or another --study name$")
    with pytest.raises(StudyError, match=refused):
        opening.open_search(request(tmp_path, 4, space=SPACE), here)
    with pytest.raises(StudyError, match="searched with --set allocator=jemalloc, not --set allocator=default"):
        opening.open_search(request(tmp_path, 4, space=SPACE, pins=pins("allocator=default")), here)
    again = searched(tmp_path, here, 4, space=SPACE, pins=pins("allocator=jemalloc"))
    assert len(again.study.get_trials()) == 4


def test_a_study_searched_without_pins_refuses_them(tmp_path: Path, here: Machine) -> None:
    searched(tmp_path, here, 2, space=SPACE)
    with pytest.raises(StudyError, match="was searched with no --set pins, not --set mkldnn=on"):
        opening.open_search(request(tmp_path, 3, space=SPACE, pins=pins("mkldnn=on")), here)


@pytest.mark.parametrize(("assignments", "message"), [
    (("omp_threads=9",), "--set omp_threads=9 is above the 8 usable physical cores of this machine; use at most 8"),
    (("instances=4", "omp_threads=4"), "--set omp_threads=4 instances=4: omp_threads=4 x instances=4 need more "
                                       "than the 8 usable physical cores of this machine; pin fewer"),
    (("precision=bf16",), "--set precision=bf16 cannot run well here with backend=eager: it measured 32.3x slower "
                          "than fp32 in its probe (conv); drop that --set (or `autotune doctor --probe` to measure "
                          "again)"),
    (("allocator=tcmalloc",), "--set allocator=tcmalloc is outside the search space"),
])
def test_a_pin_the_machine_or_the_space_cannot_honour_is_refused(tmp_path: Path, here: Machine,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 assignments: tuple[str, ...], message: str) -> None:
    slow_bf16 = probes.probe({f"torch:bf16:{op}": {"gops": {"1": 3.1, "2": 6.2}} for op in ("conv", "matmul")})
    with pytest.raises(SpaceError, match=re.escape(message)):
        opening.open_search(request(tmp_path, 3, space=SPACE, pins=pins(*assignments)), here, probe=slow_bf16)
    assert not (tmp_path / "studies").exists() or not list((tmp_path / "studies").glob("*.db"))


def test_a_pin_narrows_the_knobs_its_condition_needs() -> None:
    adapted = space_fit.adapt(space.load(DEFAULT), 2, {})
    pinned = space_fit.pin(adapted, pins("mkldnn=on"), {})
    backend = pinned.get("backend")
    assert backend is not None and backend.choices == ("eager",)
    assert all(c.get("mkldnn") is True for c in every(pinned))
    with pytest.raises(SpaceError, match="--set mkldnn=on needs backend=eager, which the search space .* never "
                                         "picks; pin backend too, or drop that --set"):
        space_fit.pin(space_fit.pin(adapted, pins("backend=inductor"), {}), pins("mkldnn=on"), {})


def test_recipes_carry_the_pins_and_those_that_set_a_pinned_knob_otherwise_are_left_out(here: Machine) -> None:
    adapted = space_fit.adapt(space.load(DEFAULT), 8, {})
    pinned = pins("allocator=tcmalloc")
    found = recipes.recipes(here.topology, "latency", probes.refusing(int8=True))
    known, note = recipes.fitting(found, space_fit.pin(adapted, pinned, {}), pinned)
    assert [r.name for r in known] == ["compile+channels_last", "compile+bf16+channels_last"]
    assert all(r.config.get("allocator") == "tcmalloc" for r in known)
    assert note.endswith("with the pins does not offer a knob value they set: seed (allocator=jemalloc), "
                         "pytorch-launcher (allocator=jemalloc)")


def test_pinning_int8_needs_its_backend_pinned_too() -> None:
    with pytest.raises(ConfigError, match="precision=int8 applies only with backend=inductor"):
        pins("precision=int8")
    adapted = space_fit.adapt(space.load(DEFAULT), 2, {})
    pinned = space_fit.pin(adapted, pins("backend=inductor", "precision=int8"), {})
    assert {(c.get("backend"), c.get("precision")) for c in every(pinned)} == {("inductor", "int8")}
