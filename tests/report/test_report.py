"""`autotune report`: the numbers gathered from a study, the self-contained page, the command's errors."""

from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial
from plotly.offline import get_plotlyjs

from autotune.host.machine import Machine
from autotune.measure import sequential
from autotune.measure.replicates import ReplicatePolicy
from autotune.report import contents, html_page, importance
from autotune.search import confirm, loop, opening
from autotune.search.rounds import Contender, RoundRun, Rounds
from autotune.search.verdict import decide
from tests.support.cli import run_cli
from tests.support.studies import SPACE, fake_runner

NAME = "resnet18-bs1-latency"
# The baseline, then configurations in a known order: 80 ms, 90 ms (pruned: >5% worse than 80
# in both replicates), 70 ms, and mkldnn (the fake child crashes).
ENQUEUED = [{"mkldnn": "off", "omp_runtime": "gnu", "allocator": "jemalloc"},
            {"mkldnn": "off", "omp_runtime": "intel", "allocator": "default"},
            {"mkldnn": "off", "omp_runtime": "intel", "allocator": "jemalloc"},
            {"mkldnn": "on", "omp_runtime": "gnu", "allocator": "default"}]
PLOTS = ("history", "importance", "marginals-latency_p50_ms", "forest", "tradeoff")


def searched(studies: Path, here: Machine, objective: str = "latency", trials: int = 5) -> optuna.Study:
    for total in (1, trials):
        opened = opening.open_search(opening.SearchRequest(
            model="resnet18", trials=total, space=SPACE, studies_dir=studies, objective=objective,  # type: ignore[arg-type]
            replicates=ReplicatePolicy(replicates=3), seed=0), here)
        if total == 1:
            loop.run_search(opened, here, lambda e: None, runner=fake_runner)
            for params in ENQUEUED[:trials - 1]:
                opened.study.enqueue_trial(params)
    loop.run_search(opened, here, lambda e: None, runner=fake_runner)
    return opened.study


def add_recipe(study: optuna.Study, like: int, name: str, latency: float) -> None:
    """A completed recipe trial (the small test space fits no real recipe): trial `like`'s records."""
    source = study.get_trials()[like]
    attrs = {**source.user_attrs, "recipe": name, "latency_p50_ms": latency, "speedup_latency": 100.0 / latency}
    study.add_trial(create_trial(value=latency, user_attrs=attrs, params={}, distributions={}))


@pytest.fixture
def study(tmp_path: Path, here: Machine) -> optuna.Study:
    found = searched(tmp_path / "studies", here)
    add_recipe(found, 1, "seed", 85.0)
    base, chosen = confirm.candidates(found, 2)
    five = (RoundRun(100.0, 101.0),) * 5
    measured = Rounds((Contender("base", None), Contender("a", None), Contender("b", None)),  # type: ignore[arg-type]
                      (five, (RoundRun(50.0, 51.0),) * 5, (RoundRun(None, None, "crashed"), *five[1:])),
                      ((0, 1, 2),) * 5, 1)
    plan = sequential.design(5, 2)  # one look, at the cap: 5 rounds
    found.set_user_attr("confirmation", decide(base, chosen, measured, "latency_p50_ms", plan, plan.looks[0], 0.03))
    return found


def test_the_study_is_what_the_tests_expect(study: optuna.Study) -> None:
    states = [(t.number, t.state, t.user_attrs.get("latency_p50_ms")) for t in study.get_trials()]
    assert states == [(0, TrialState.COMPLETE, 100.0), (1, TrialState.COMPLETE, 80.0), (2, TrialState.PRUNED, 90.0),
                      (3, TrialState.COMPLETE, 70.0), (4, TrialState.FAIL, None), (5, TrialState.COMPLETE, 85.0)]


def test_history_has_every_measured_trial_the_best_so_far_and_both_reference_lines(study: optuna.Study) -> None:
    found = contents.history(study, "latency_p50_ms")
    assert [(p.trial, p.value, p.best_so_far, p.pruned, p.recipe) for p in found.points] == [
        (0, 100.0, 100.0, False, None), (1, 80.0, 80.0, False, None), (2, 90.0, 80.0, True, None),
        (3, 70.0, 70.0, False, None), (5, 85.0, 70.0, False, "seed")]
    assert found.baseline == contents.Line("baseline (PyTorch defaults)", 0, 100.0)
    assert found.recipe == contents.Line("best expert recipe: seed", 5, 85.0)


def test_marginals_group_each_knobs_values_and_importance_ranks_the_larger_effect_first(study: optuna.Study) -> None:
    rows = importance.design(study)
    assert [r.trial for r in rows] == [0, 1, 2, 3, 5]  # the failure has no value; the pruned trial has its median
    assert rows[0].knobs == {"mkldnn": "off", "omp_runtime": "gnu", "allocator": "default"}  # unset: the default
    found = {m.knob: m.groups for m in importance.marginals(rows, "latency_p50_ms")}
    assert found == {"omp_runtime": (("gnu", (100.0, 80.0, 85.0)), ("intel", (90.0, 70.0))),
                     "allocator": (("default", (100.0, 90.0)), ("jemalloc", (80.0, 70.0, 85.0)))}
    ranked = importance.importance(rows, "latency_p50_ms")
    assert [k for k, _ in ranked.knobs] == ["allocator", "omp_runtime"]  # jemalloc -20 ms, intel -10 ms
    assert sum(v for _, v in ranked.knobs) == pytest.approx(1.0, abs=1e-3) and ranked.trials == 5


def test_importance_says_why_it_has_nothing_to_show(study: optuna.Study) -> None:
    rows = importance.design(study)[:2]
    assert importance.importance(rows, "latency_p50_ms") == importance.Importance(
        "latency_p50_ms", (), 2, "needs at least 3 measured trials that differ in a knob (this study has 2)")


def test_values_of_a_knob_come_in_its_own_order() -> None:
    texts = ["2", "default", "10", "1"]
    assert sorted(texts, key=lambda v: importance.value_order("omp_threads", v)) == ["default", "1", "2", "10"]
    assert sorted(["inductor", "eager", "torchscript"], key=lambda v: importance.value_order("backend", v)) == [
        "eager", "torchscript", "inductor"]


def test_the_forest_holds_exactly_the_stored_intervals_and_labels(study: optuna.Study) -> None:
    verdict = study.user_attrs["confirmation"]
    found = contents.forest(verdict)
    assert found is not None and found.significant and found.winner_trial == 3 and found.rounds == 5
    tested, failed = found.rows
    assert (tested.trial, tested.speedup, tested.interval, tested.interval_label) == (
        3, 2.0, (2.0, 2.0), verdict["candidates"][0]["ci_label"])
    assert tested.interval_label == "93.8% CI (full range)"  # 5 rounds cannot give a 95% interval
    assert (failed.trial, failed.speedup, failed.interval) == (1, None, None)
    assert failed.reason == "failed 1 of 5 runs: crashed"
    assert contents.forest(None) is None


def test_failures_are_grouped_by_cause_and_reason_with_numbers_masked() -> None:
    def failed(number: int, reason: str, cause: str = "cut_short") -> optuna.trial.FrozenTrial:
        trial = create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": reason, "fail_cause": cause})
        trial.number = number
        return trial

    trials = [failed(1, "left running by an autotune process (pid 12) that was killed"),
              failed(2, "instance 0: crashed with SIGSEGV", "error"),
              failed(3, "left running by an autotune process (pid 345) that was killed"),
              create_trial(state=TrialState.PRUNED, user_attrs={"prune_reason": "worse than trial 1"})]
    trials[3].number = 4
    assert contents.failures(trials) == (
        contents.FailureGroup("failed", "cut_short", "left running by an autotune process (pid 12) that was killed",
                            (1, 3)),
        contents.FailureGroup("failed", "error", "instance 0: crashed with SIGSEGV", (2,)),
        contents.FailureGroup("pruned", "pruned", "worse than trial 1", (4,)))


def test_a_two_objective_study_gets_two_panels_and_its_pareto_front(tmp_path: Path, here: Machine) -> None:
    both = searched(tmp_path / "studies", here, objective="both", trials=4)
    gathered = contents.gather(both, tmp_path / "studies")
    assert gathered.metrics == ("latency_p50_ms", "throughput_ips")
    assert [h.metric for h in gathered.histories] == list(gathered.metrics)
    assert {p.trial for p in gathered.tradeoff if p.pareto} == {t.number for t in both.best_trials} == {3}
    text = html_page.page(gathered, tmp_path)
    assert 'id="marginals-throughput_ips"' in text and '"name":"Pareto front"' in text


class Sources(HTMLParser):
    """Every src and href attribute of the document's tags (script bodies are not tags)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found += [value or "" for name, value in attrs if name in ("src", "href")]


def test_the_page_is_self_contained_with_one_plotly_bundle_and_every_plot(study: optuna.Study,
                                                                          tmp_path: Path) -> None:
    text = html_page.page(contents.gather(study, tmp_path / "studies"), tmp_path)
    parser = Sources()
    parser.feed(text)
    assert not [s for s in parser.found if re.match(r"(https?:)?//", s)]
    assert "<script src" not in text and "<link" not in text
    assert text.count(get_plotlyjs()) == 1 and text.count("* plotly.js v") == 1
    for plot in PLOTS:
        assert text.count(f'id="{plot}"') == 1, plot
    assert "93.8% CI (full range)" in text and "95% CI" not in text  # the stored label, never another


def test_study_text_is_escaped_on_the_page(study: optuna.Study, tmp_path: Path) -> None:
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": "<script>alert(1)</script>",
                                                                   "fail_cause": "error"}))
    text = html_page.page(contents.gather(study, tmp_path / "studies"), tmp_path)
    assert "<script>alert(1)" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_profile_traces_are_linked_relative_to_the_report(study: optuna.Study, tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    assert contents.gather(study, studies).traces == ()
    assert "Profiles" not in html_page.page(contents.gather(study, studies), tmp_path)
    folder = studies / "profiles" / NAME
    folder.mkdir(parents=True)
    for name in ("winner.trace.json", "baseline.trace.json", "profile.json"):
        (folder / name).write_text("{}")
    gathered = contents.gather(study, studies)
    assert [p.name for p in gathered.traces] == ["baseline.trace.json", "winner.trace.json"]
    (tmp_path / "out").mkdir()
    text = html_page.page(gathered, tmp_path / "out")
    assert f'href="../studies/profiles/{NAME}/winner.trace.json"' in text


def test_report_writes_the_page_and_prints_its_summary(study: optuna.Study, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "report", "--study", NAME, "-o", "r.html")
    assert code == 0, err
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    lines = out.splitlines()
    assert lines[0] == f"study {NAME}: 6 trials, 4 completed, 1 pruned, 1 failed"
    assert lines[1] == ("best: trial 3 (mkldnn=off omp_runtime=intel allocator=jemalloc), 70.00 ms vs baseline "
                        "100.00 ms (1.43x)")
    assert lines[2].startswith("best expert recipe: trial 5 (seed), latency 1.18x; trial 3 is 1.21x that")
    assert lines[3].startswith("Confirmed: trial 3 (mkldnn=off omp_runtime=intel allocator=jemalloc) is 2.000x")
    assert lines[4].startswith("top knobs for ms (fANOVA, 5 trials): allocator ")
    assert lines[5:] == ["1 pruned (pruned): " + study.get_trials()[2].user_attrs["prune_reason"],
                         "1 failed (killed): instance 0: crashed with SIGSEGV", "wrote r.html"]


def test_report_json_is_the_summary_in_the_envelope(study: optuna.Study, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(capsys, "report", "--json", "-o", "r.html")
    data = json.loads(out)
    assert code == 0 and data["kind"] == "report" and data["schema_version"] == 1
    assert data["output"] == "r.html" and data["study"] == NAME
    assert data["best"]["trial"] == 3 and data["best"]["values"] == {"latency_p50_ms": 70.0}
    assert data["confirmation"]["winner_trial"] == 3
    assert list(data["importance"]["latency_p50_ms"]["knobs"]) == ["allocator", "omp_runtime"]
    assert [g["trials"] for g in data["failures"]] == [[2], [4]]


@pytest.mark.parametrize(("args", "message"), [
    (["--study", "nope"], f"Error: no study 'nope' in studies/ (studies there: {NAME})"),
    (["-o", "missing/r.html"], "Error: cannot write missing/r.html: the folder missing does not exist; create it "
                               "or give -o a path in an existing folder"),
    (["-o", "studies"], "Error: cannot write studies: it is a directory; give a file name like report.html"),
    (["--storage", "sqlite:///nowhere/x.db"], "Error: no study database at nowhere/x.db; give the file a search wrote"),
])
def test_bad_inputs_are_one_line_exit_2_and_no_file(study: optuna.Study, tmp_path: Path, args: list[str],
                                                   message: str, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    before = sorted(p for p in tmp_path.rglob("*") if "studies" not in p.parts)
    code, out, err = run_cli(capsys, "report", *args)
    assert code == 2 and out == ""
    assert err.startswith(message) and len(err.splitlines()) == 1 and "Traceback" not in err
    assert sorted(p for p in tmp_path.rglob("*") if "studies" not in p.parts) == before


def test_no_study_and_a_study_without_completed_trials_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "report")[::2] == (
        2, "Error: no study in studies/; run `autotune search --model M` first\n")
    (tmp_path / "studies").mkdir()
    empty = optuna.create_study(study_name="empty", storage=f"sqlite:///{tmp_path}/studies/empty.db")
    empty.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": "crashed"}))
    assert run_cli(capsys, "report", "--study", "empty")[::2] == (
        2, "Error: study 'empty' has no completed trial (1 trials, 1 failed): nothing to report; run `autotune "
           "search` first or fix what fails\n")
    assert not (tmp_path / "report.html").exists()


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(html_page.ReportWriteError, match="^cannot write .*r.html: No space left on device; give "
                                                           "-o a writable location$"):
        html_page.write(tmp_path / "r.html", "<html></html>")
    assert list(tmp_path.iterdir()) == []


def test_a_conditional_knob_is_judged_among_the_trials_where_it_applies() -> None:
    """ONNX Runtime's optimization level applies with backend=onnxruntime alone: over every trial its
    default elsewhere would stand in for "not ONNX Runtime" and take the backend's credit."""
    study = optuna.create_study()
    study.set_user_attr("space", {"knobs": {"backend": {}, "ort_optimization": {}, "allocator": {}}})
    dist = {"x": optuna.distributions.CategoricalDistribution(["a"])}
    configs = [({"backend": "eager"}, 100.0), ({"backend": "eager", "allocator": "jemalloc"}, 98.0),
               ({"backend": "eager"}, 101.0),
               ({"backend": "onnxruntime", "ort_optimization": "all"}, 60.0),
               ({"backend": "onnxruntime", "ort_optimization": "basic"}, 70.0),
               ({"backend": "onnxruntime", "ort_optimization": "all", "allocator": "jemalloc"}, 59.0),
               ({"backend": "onnxruntime", "ort_optimization": "basic", "allocator": "jemalloc"}, 71.0)]
    for config, latency in configs:
        study.add_trial(optuna.trial.create_trial(value=latency, params={"x": "a"}, distributions=dist, user_attrs={
            "plan": {"config": config}, "latency_p50_ms": latency}))
    rows = importance.design(study)
    ranked = importance.importance(rows, "latency_p50_ms")
    assert [k for k, _ in ranked.knobs] == ["backend", "allocator"]  # ort_optimization is not among them
    assert [(w.knob, w.trials, w.where) for w in ranked.within] == [("ort_optimization", 4, "backend=onnxruntime")]
    assert ranked.within[0].share > 0.5  # among ONNX Runtime's trials, it is what differs (allocator: 1 ms)
    found = {m.knob: m for m in importance.marginals(rows, "latency_p50_ms")}
    assert found["ort_optimization"].where == "backend=onnxruntime"
    assert found["ort_optimization"].groups == (("basic", (70.0, 71.0)), ("all", (60.0, 59.0)))
    assert found["backend"].where == "" and sum(len(v) for _, v in found["backend"].groups) == 7
