"""`--json` on search, confirm, compare and export: one document on stdout (kind, schema_version),
whose numbers are the study's; measured by the fake child through the real runner."""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.cli.display import JSON_SCHEMA_VERSION
from autotune.cli.main import main
from autotune.host import machine
from autotune.measure import plan, stats
from autotune.study import confirmations, storage
from tests.support.cli import run_cli
from tests.support.fake_cli import fake_child
from tests.support.studies import SPACE

QUICK = ("--duration", "0.1", "--warmup-time", "0", "--replicates", "1", "--fresh-replicates")
STUDY = "resnet18-bs1-latency"


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A 3-trial search, confirmed in 5 rounds, run once for the module: its folder and its JSON."""
    folder = tmp_path_factory.mktemp("json")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(plan, "worker_command", fake_child("ok"))
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout), pytest.raises(SystemExit) as info:
            main(["search", "--model", "resnet18", "--trials", "3", "--space", str(SPACE), "--seed", "1",
                  "--confirm-top", "1", "--confirm-rounds", "5", *QUICK, "--json"])
        assert info.value.code in (0, None)
        yield folder, json.loads(stdout.getvalue())  # the whole of stdout is one document


def study_in(folder: Path) -> optuna.Study:
    return storage.load(STUDY, f"sqlite:///{folder / 'studies' / STUDY}.db")


@pytest.fixture
def in_study(searched: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> optuna.Study:
    monkeypatch.chdir(searched[0])
    monkeypatch.setattr(plan, "worker_command", fake_child("ok"))
    return study_in(searched[0])


def test_search_json_holds_the_studys_numbers(searched: tuple[Path, dict[str, Any]]) -> None:
    folder, doc = searched
    study = study_in(folder)
    assert (doc["kind"], doc["schema_version"]) == ("search", JSON_SCHEMA_VERSION)
    assert (doc["study"], doc["objective"]) == (STUDY, "latency")
    assert doc["storage"] == f"sqlite:///{(folder / 'studies' / STUDY).resolve()}.db"
    assert doc["trials"] == {"finished": 3, "total": 3, "distinct_configurations": 3}
    best = min((t for t in study.trials if t.values), key=lambda t: t.values[0])
    assert doc["best"][0]["number"] == best.number and doc["best"][0]["params"] == best.params
    assert doc["best"][0]["values"] == best.values
    assert doc["best"][0]["latency_p50_ms"] == best.user_attrs["latency_p50_ms"]
    assert doc["accounting"] == study.user_attrs["accounting"]
    assert doc["confirmation"] == study.user_attrs["confirmation"] and doc["confirmed_now"] is True
    assert doc["confirmation"]["rounds"] == 5 and doc["stopped"] is None
    cost = doc["confirmation_cost"]  # what the confirmation took of this command
    assert (cost["rounds"], cost["rounds_cap"], cost["looks"]) == (5, 5, 1) and cost["stopped_by"] in ("decided", "cap")
    assert 0 < cost["wall_s"] < cost["command_s"] and cost["share"] == pytest.approx(cost["wall_s"] / cost["command_s"],
                                                                                     abs=0.01)
    assert doc["confirmation"]["outcome"] in ("beats", "slower", "equivalent", "undecided")


def test_confirm_json_is_the_stored_verdict(in_study: optuna.Study, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "confirm", "--top", "1", "--rounds", "5", "--seed", "3", "--json")
    doc = json.loads(out)
    assert code == 0 and (doc["kind"], doc["schema_version"]) == ("confirm", JSON_SCHEMA_VERSION)
    stored = study_in(Path.cwd()).user_attrs["confirmation"]
    assert {k: v for k, v in doc.items() if k not in ("kind", "schema_version", "study")} == stored
    assert doc["study"] == STUDY and doc["order_seed"] == 3
    assert "round 5/5" in err  # progress stays on stderr


def test_confirm_records_the_host_that_ran_it(in_study: optuna.Study, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(machine.TEST_HOST_ENV, "confirmer-7")
    klass = machine.class_id(machine.host_class(machine.this_machine()))
    code, out, _ = run_cli(capsys, "confirm", "--top", "1", "--rounds", "5", "--json")
    doc = json.loads(out)
    stored = study_in(Path.cwd()).user_attrs["confirmation"]
    assert code == 0 and (doc["host"], doc["host_class"]) == ("confirmer-7", klass)
    assert (stored["host"], stored["host_class"]) == ("confirmer-7", klass)
    code, out, _ = run_cli(capsys, "confirm", "--top", "1", "--rounds", "5")
    assert code == 0 and f"measured on host confirmer-7 (host class {klass})" in out


def test_export_says_the_host_class_safely_for_any_host_name(in_study: optuna.Study, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    hostile = "evil\nexport PWNED=1\n$(touch pwned)`touch pwned`"
    monkeypatch.setenv(machine.TEST_HOST_ENV, hostile)
    assert run_cli(capsys, "confirm", "--top", "1", "--rounds", "5")[0] == 0
    code, out, _ = run_cli(capsys, "export", "best.env", "--json")
    doc = json.loads(out)
    winner = in_study.trials[doc["trial"]]
    assert code == 0 and doc["host_class"] == winner.user_attrs["host_class"]
    text = Path("best.env").read_text()
    line = next(x for x in text.splitlines() if x.startswith("# for host class "))
    assert line.startswith(f"# for host class {winner.user_attrs['host_class']}: trial {winner.number} was "
                           f"measured on host {winner.user_attrs['host']}, confirmed on host evil\\nexport")
    assert all(x.startswith(("#", "export ", "unset ")) for x in text.splitlines() if x)
    shell = subprocess.run(["bash", "-c", 'source best.env && echo "${PWNED-unset}"'], capture_output=True,
                           text=True, cwd=Path.cwd())
    assert shell.returncode == 0 and shell.stdout == "unset\n" and not Path("pwned").exists()


def test_compare_json_has_both_series_and_the_paired_comparison(in_study: optuna.Study,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "compare", "0", "1", "--rounds", "5", "--seed", "2", "--json")
    doc = json.loads(out)
    assert code == 0 and (doc["kind"], doc["schema_version"]) == ("compare", JSON_SCHEMA_VERSION)
    first, second = doc["contenders"]
    assert (first["label"], second["label"], first["trial"], second["trial"]) == ("trial 0", "trial 1", 0, 1)
    assert second["config"] == in_study.trials[1].user_attrs["config"]
    assert len(first["values"]) == len(second["values"]) == 5 and first["runs_ok"] == 5
    ratios = sorted(a / b for a, b in zip(first["values"], second["values"], strict=True))
    result = doc["comparison"]
    walsh = stats.walsh_averages([math.log(r) for r in ratios])  # the Hodges-Lehmann estimate
    assert result["speedup"] == pytest.approx(math.exp(walsh[len(walsh) // 2]))
    assert result["interval"]["label"] == "93.8% CI (full range)"
    assert result["interval"]["low"] == pytest.approx(ratios[0]) and 0 < result["p_value"] <= 1
    assert doc["seed"] == 2 and len(doc["orders"]) == 5


def test_compare_json_says_why_nothing_was_compared(in_study: optuna.Study, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "export", "zero.env", "--trial", "0")[0] == 0
    monkeypatch.setattr(plan, "worker_command", fake_child("crash-early"))  # the env file is planned again
    code, out, _ = run_cli(capsys, "compare", "0", "zero.env", "--rounds", "5", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["kind"] == "compare" and doc["comparison"] is None
    assert doc["reason"] == "a run failed (instance 0: crashed with SIGSEGV)"
    assert [c["label"] for c in doc["contenders"]] == ["trial 0", "zero.env"]
    assert doc["contenders"][0]["runs_ok"] == 5 and doc["contenders"][1]["values"] == [None] * 5


def test_export_json_names_the_file_its_variables_and_the_verdict(in_study: optuna.Study,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "export", "best.env", "--json")
    doc = json.loads(out)
    verdict = in_study.user_attrs["confirmation"]
    assert code == 0 and (doc["kind"], doc["schema_version"]) == ("export", JSON_SCHEMA_VERSION)
    assert (doc["path"], doc["study"], doc["trial"]) == ("best.env", STUDY, verdict["winner_trial"])
    assert doc["config"] == in_study.trials[verdict["winner_trial"]].user_attrs["config"]
    written = Path("best.env").read_text()
    assert all(f"export {name}=" in written for name in doc["env"]) and "AUTOTUNE_MODEL" in doc["env"]
    assert doc["unset"] and f"unset {' '.join(doc['unset'])}" in written
    status = "confirmed" if verdict["significant"] else "baseline kept"
    which = {"number": confirmations.number(in_study.user_attrs), "of": confirmations.count(in_study.user_attrs)}
    assert doc["confirmation"] == {"status": status, "message": verdict["message"], **which}
    assert which["number"] == which["of"] >= 1  # the latest is the one shown


@pytest.mark.parametrize(("args", "message"), [
    (["export", "best.env", "--json"], "Error: no study in studies/; run `autotune search --model M` first\n"),
    (["confirm", "--json"], "Error: no study in studies/; run `autotune search --model M` first\n"),
    (["compare", "0", "1", "--json"], "Error: no study in studies/; run `autotune search --model M` first\n"),
    (["search", "--model", "resnet18", "--trials", "0", "--json"], "Error: --trials 0 is not allowed; use 1 or more\n"),
])
def test_errors_under_json_stay_one_line_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str], args: list[str],
                                                   message: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, *args) == (2, "", message)


def test_an_unbounded_interval_is_null_in_json_not_infinity() -> None:
    from autotune.cli.display import json_document
    from autotune.measure import stats as measured

    few = measured.paired_speedup([1.5, 1.6])  # two rounds: no bound can be given
    document = json_document("compare", {"interval": {"low": few.interval.low, "high": few.interval.high},
                                         "rows": [(1.0, float("nan"))]})
    text = json.dumps(document, allow_nan=False)  # strict JSON: raises on inf or nan
    assert json.loads(text)["interval"] == {"low": 0.0, "high": None} and json.loads(text)["rows"] == [[1.0, None]]
