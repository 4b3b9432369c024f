"""Everyday controls of a search: pinned knobs (`--set`) and a time budget (`--time-budget`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune import budget, recipes, search_loop, space
from autotune.errors import ConfigError
from autotune.knobs import Config
from autotune.launch import MeasureSettings
from autotune.libs import Libraries
from autotune.machine import Machine
from autotune.replicates import ReplicatePolicy
from autotune.space import SpaceError
from autotune.storage import StudyError
from tests.conftest import lscpu
from tests.test_proposals import DEFAULT, ok_runner
from tests.test_study import SPACE, request


@pytest.fixture
def here(fake_libs: Libraries) -> Machine:
    return Machine(lscpu("amd_1s_smt"), fake_libs)  # 8 usable physical cores


def pins(*assignments: str) -> Config:
    return Config.from_assignments(assignments)


def searched(tmp_path: Path, here: Machine, trials: int, **kw: Any) -> search_loop.Search:
    opened = search_loop.open_search(request(tmp_path, trials, **kw), here)
    search_loop.run_search(opened, here, lambda event: None, runner=ok_runner)
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
        search_loop.open_search(request(tmp_path, 4, space=SPACE), here)
    with pytest.raises(StudyError, match="searched with --set allocator=jemalloc, not --set allocator=default"):
        search_loop.open_search(request(tmp_path, 4, space=SPACE, pins=pins("allocator=default")), here)
    again = searched(tmp_path, here, 4, space=SPACE, pins=pins("allocator=jemalloc"))
    assert len(again.study.get_trials()) == 4


def test_a_study_searched_without_pins_refuses_them(tmp_path: Path, here: Machine) -> None:
    searched(tmp_path, here, 2, space=SPACE)
    with pytest.raises(StudyError, match="was searched with no --set pins, not --set mkldnn=on"):
        search_loop.open_search(request(tmp_path, 3, space=SPACE, pins=pins("mkldnn=on")), here)


@pytest.mark.parametrize(("assignments", "message"), [
    (("omp_threads=9",), "--set omp_threads=9 is above the 8 usable physical cores of this machine; use at most 8"),
    (("instances=4", "omp_threads=4"), "--set omp_threads=4 instances=4: 4 instance(s) x 4 thread(s) need more "
                                       "than the 8 usable physical cores of this machine; pin fewer"),
    (("precision=bf16",), "--set precision=bf16 cannot run here: this CPU has neither avx512_bf16 nor AMX; drop "
                          "that --set"),
    (("allocator=tcmalloc",), "--set allocator=tcmalloc is outside the search space"),
])
def test_a_pin_the_machine_or_the_space_cannot_honour_is_refused(tmp_path: Path, here: Machine,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 assignments: tuple[str, ...], message: str) -> None:
    monkeypatch.setattr(search_loop, "machine_has_bf16", lambda: False)
    with pytest.raises(SpaceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        search_loop.open_search(request(tmp_path, 3, space=SPACE, pins=pins(*assignments)), here)
    assert not (tmp_path / "studies").exists() or not list((tmp_path / "studies").glob("*.db"))


def test_a_pin_narrows_the_knobs_its_condition_needs() -> None:
    adapted = space.adapt(space.load(DEFAULT), 2, {})
    pinned = space.pin(adapted, pins("mkldnn=on"), {})
    backend = pinned.get("backend")
    assert backend is not None and backend.choices == ("eager",)
    assert all(c.get("mkldnn") is True for c in pinned.configurations() or [])
    with pytest.raises(SpaceError, match="--set mkldnn=on needs backend=eager, which the search space .* never "
                                         "picks; pin backend too, or drop that --set"):
        space.pin(space.pin(adapted, pins("backend=inductor"), {}), pins("mkldnn=on"), {})


def test_recipes_carry_the_pins_and_those_that_set_a_pinned_knob_otherwise_are_left_out(here: Machine) -> None:
    adapted = space.adapt(space.load(DEFAULT), 8, {})
    pinned = pins("allocator=tcmalloc")
    known, note = recipes.fitting(recipes.recipes(here.topology, "latency", True), space.pin(adapted, pinned, {}),
                                  pinned)
    assert [r.name for r in known] == ["compile+channels_last", "compile+bf16+channels_last"]
    assert all(r.config.get("allocator") == "tcmalloc" for r in known)
    assert note.endswith("with the pins does not offer a knob value they set: seed (allocator=jemalloc), "
                         "pytorch-launcher (allocator=jemalloc)")


class FakeClock:
    """Each finished trial costs `per_trial` seconds."""

    def __init__(self, per_trial: float) -> None:
        self.now, self.per_trial = 0.0, per_trial

    def __call__(self) -> float:
        return self.now

    def on_event(self, event: search_loop.TrialEvent) -> None:
        if event.kind == "done":
            self.now += self.per_trial


@pytest.mark.parametrize(("confirm_processes", "expected"), [(0, 6), (40, 1), (4, 3)])
def test_the_time_budget_starts_no_trial_that_would_not_fit(tmp_path: Path, here: Machine, confirm_processes: int,
                                                            expected: int) -> None:
    """10 s per trial, 65 s: 6 trials fit alone (the 7th would end at 70 s); a confirmation process
    costs a warm trial less its 2 extra 1 s windows (8 s), so 4 of them leave room for 3 trials."""
    clock = FakeClock(10.0)
    opened = search_loop.open_search(request(tmp_path, 50, space=DEFAULT, time_budget_s=65.0,
                                             confirm_processes=confirm_processes,
                                             measure=MeasureSettings(duration_s=1.0),
                                             replicates=ReplicatePolicy(in_process=True)), here)
    stopped = search_loop.run_search(opened, here, clock.on_event, runner=ok_runner, clock=clock)
    assert len(opened.study.get_trials()) == expected
    ended = opened.study.user_attrs["ended_by"]
    assert ended["by"] == "time budget" and ended["trial_estimate_s"] == 10.0
    assert ended["confirmation_reserve_s"] == 8.0 * confirm_processes
    assert stopped.startswith("the time budget (65 s) has no room for another trial (about 10 s each)")
    assert stopped.endswith(f"the study holds {expected} finished trials; raise --time-budget (or rerun) to search "
                            "further")


def test_the_trials_end_a_search_before_the_budget_and_a_resume_estimates_from_the_past(
        tmp_path: Path, here: Machine) -> None:
    clock = FakeClock(10.0)
    opened = search_loop.open_search(request(tmp_path, 3, space=DEFAULT, time_budget_s=3600.0), here)
    assert search_loop.run_search(opened, here, clock.on_event, runner=ok_runner, clock=clock) == ""
    assert opened.study.user_attrs["ended_by"] == {"by": "trials"}
    # The accounting says what a trial cost before: a resume with no room stops before its first trial.
    opened.study.set_user_attr("accounting", {"wall_s": 300.0, "trials": 3})
    again = search_loop.open_search(request(tmp_path, 10, space=DEFAULT, time_budget_s=50.0), here)
    stopped = search_loop.run_search(again, here, lambda event: None, runner=ok_runner, clock=FakeClock(0))
    assert len(again.study.get_trials()) == 3 and "about 100 s each" in stopped


def test_compiling_counts_for_the_next_trial_but_not_for_the_confirmation(tmp_path: Path, here: Machine) -> None:
    """10 s per trial of which 6 s compiling: the next trial is still 10 s, but a confirmation
    process loads what was compiled, 4 s less the 2 extra 1 s windows: 2 s. With 40 of them (80 s)
    and 165 s, trials start while elapsed + 10 + 80 <= 165: 8 trials (1 if compiling counted)."""
    def compiling_runner(plan: Any, timeout_s: float) -> Any:
        result = ok_runner(plan, timeout_s)
        result.instances[0].metrics["setup"] = {"compile_s": 5.0, "trace_s": 1.0, "quantize_s": 3.0}
        return result

    clock = FakeClock(10.0)
    opened = search_loop.open_search(request(tmp_path, 50, space=DEFAULT, time_budget_s=165.0, confirm_processes=40,
                                             measure=MeasureSettings(duration_s=1.0),
                                             replicates=ReplicatePolicy(in_process=True)), here)
    search_loop.run_search(opened, here, clock.on_event, runner=compiling_runner, clock=clock)
    assert len(opened.study.get_trials()) == 8
    ended = opened.study.user_attrs["ended_by"]
    assert ended["trial_estimate_s"] == 10.0 and ended["confirmation_reserve_s"] == 80.0
    assert budget.compile_seconds({"compile_s": 5.0, "quantize_s": 3.0, "build_s": 2.0}) == 5.0


def test_a_confirmation_process_costs_a_trial_less_its_extra_windows() -> None:
    warm = budget.TimeBudget(600, 10, replicates=3, window_s=2.0, warm=True)
    assert warm.process_s(18.0) == 14.0 and warm.process_s(3.0) == 2.0
    fresh = budget.TimeBudget(600, 10, replicates=3, window_s=2.0, warm=False)
    assert fresh.process_s(18.0) == 6.0


def test_pinning_int8_needs_its_backend_pinned_too() -> None:
    with pytest.raises(ConfigError, match="precision=int8 applies only with backend=inductor"):
        pins("precision=int8")
    adapted = space.adapt(space.load(DEFAULT), 2, {})
    pinned = space.pin(adapted, pins("backend=inductor", "precision=int8"), {})
    assert {(c.get("backend"), c.get("precision")) for c in pinned.configurations() or []} == {("inductor", "int8")}
