"""Export: a valid bash file that sets exactly what the trial ran with; `autotune run` applies it."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.deploy import export
from autotune.deploy.export import ExportError
from autotune.model import envfile
from tests.support.cli import AUTOTUNE


def sourced(path: Path) -> dict[str, str]:
    """The environment after sourcing the file in a clean bash (bash's own variables removed)."""
    script = f"source {path} && {sys.executable} -c 'import json, os; print(json.dumps(dict(os.environ)))'"
    out = subprocess.run(["env", "-i", f"PATH={os.environ['PATH']}", "OMP_NUM_THREADS=64", "bash", "-c",
                          script], capture_output=True, text=True, check=True).stdout
    env = json.loads(out)
    return {k: v for k, v in env.items() if k not in ("PATH", "PWD", "SHLVL", "_", "LC_CTYPE")}


def test_export_is_valid_bash_and_sets_exactly_the_recorded_variables(tmp_path: Path,
                                                                       searched: optuna.Study) -> None:
    best = export.pick_trial(searched, None)
    assert best.values[0] == min(t.values[0] for t in searched.get_trials() if t.values)
    path = tmp_path / "best.env"
    export.write(path, export.render(searched, best))
    subprocess.run(["bash", "-n", str(path)], check=True)
    env = sourced(path)
    recorded = best.user_attrs["plan"]["instances"][0]["env"]
    tuning = {k: v for k, v in env.items() if not k.startswith("AUTOTUNE_")}
    assert tuning == recorded
    assert "OMP_NUM_THREADS" not in env or recorded.get("OMP_NUM_THREADS")  # the shell's 64 is unset
    configured = best.user_attrs["plan"]["config"]
    assert env["AUTOTUNE_MODEL"] == "resnet18"  # and each knob set, once: instances only where it was set
    assert env.get("AUTOTUNE_INSTANCES") == (str(configured["instances"]) if "instances" in configured else None)
    text = path.read_text()
    assert f"trial {best.number}" in text and "speedup over PyTorch defaults" in text
    assert "# launch lines, as the trial ran them:" in text


def test_export_of_a_chosen_trial_and_of_the_baseline(tmp_path: Path, searched: optuna.Study) -> None:
    zero = export.pick_trial(searched, 0)
    text = export.render(searched, zero)
    assert "# knobs: defaults" in text
    assert "unset OMP_NUM_THREADS MKL_NUM_THREADS" in text
    assert not [line for line in text.splitlines() if line.startswith("export ") and "AUTOTUNE_" not in line]


def test_nothing_to_export_is_one_clear_error(tmp_path: Path, searched: optuna.Study) -> None:
    last = len(searched.get_trials()) - 1  # 8 counted, and a crashed configuration's rerun beside them
    with pytest.raises(ExportError, match=f"has no trial 99; it has trials 0 to {last}$"):
        export.pick_trial(searched, 99)
    failed = next(t.number for t in searched.get_trials() if t.state.name == "FAIL")
    with pytest.raises(ExportError, match=f"trial {failed} of .* did not complete \\(fail: instance 0: crashed"):
        export.pick_trial(searched, failed)
    empty = optuna.create_study(study_name="empty")
    with pytest.raises(ExportError, match="study 'empty' has no completed trial \\(0 trials, 0 failed\\)"):
        export.pick_trial(empty, None)


def test_unwritable_paths_leave_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="cannot write .*: No such file or directory"):
        export.write(tmp_path / "nope" / "best.env", "x")
    with pytest.raises(ExportError, match="it is a directory"):
        export.write(tmp_path, "x")
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.geteuid() != 0:
            with pytest.raises(ExportError, match="Permission denied"):
                export.write(locked / "best.env", "x")
    finally:
        locked.chmod(0o700)
    assert list(tmp_path.rglob("*.env")) == [] and list(tmp_path.rglob(".best.env*")) == []


def test_a_link_is_written_through_and_a_pipe_is_refused(tmp_path: Path) -> None:
    """Written to a temporary file renamed over the path, a link became a file beside its target,
    and a pipe or device was replaced (as root, `autotune export /dev/full` removed the device)."""
    (tmp_path / "real.env").write_text("old")
    (tmp_path / "link.env").symlink_to("real.env")
    export.write(tmp_path / "link.env", "new")
    assert (tmp_path / "link.env").is_symlink() and (tmp_path / "real.env").read_text() == "new"
    os.mkfifo(tmp_path / "pipe.env")
    with pytest.raises(ExportError, match="cannot write .*pipe.env: not a regular file"):
        export.write(tmp_path / "pipe.env", "x")
    assert stat.S_ISFIFO((tmp_path / "pipe.env").stat().st_mode) and not list(tmp_path.glob(".pipe.env*"))


def test_read_rejects_files_it_did_not_write(tmp_path: Path) -> None:
    other = tmp_path / "other.env"
    other.write_text("export A=1\n")
    with pytest.raises(ExportError, match="is not an autotune env file"):
        export.read(other)
    damaged = tmp_path / "damaged.env"
    damaged.write_text(f"{envfile.HEADER}: x\nexport A=1\nrm -rf /\n")
    with pytest.raises(ExportError, match="line 3: not an export or unset line"):
        export.read(damaged)


def test_cli_export_finds_the_newest_study_and_run_applies_it(tmp_path: Path, searched: optuna.Study) -> None:
    env_path = tmp_path / "best.env"
    proc = subprocess.run([AUTOTUNE, "export", str(env_path)], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("wrote ")
    expected = export.read(env_path).env
    probe = "import json, os; print(json.dumps(dict(os.environ)))"
    run = subprocess.run([AUTOTUNE, "run", str(env_path), "--", sys.executable, "-c", probe],
                         cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "KMP_BLOCKTIME": "9"})
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    for key, value in expected.items():
        assert seen[key] == value
    assert "KMP_BLOCKTIME" not in seen or expected.get("KMP_BLOCKTIME") == seen["KMP_BLOCKTIME"]
    assert seen["AUTOTUNE_INSTANCE_INDEX"] == "0"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "best.env", "--study", "nope"], "Error: no study 'nope' in studies/ (studies there: none)"),
        (["export", "best.env"], "Error: no study in studies/; run `autotune search --model M` first"),
        (["run", "missing.env", "--", "true"], "Error: cannot read env file missing.env: No such file or directory"),
    ],
)
def test_cli_errors_without_a_study(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([AUTOTUNE, *args], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == message or proc.stderr.startswith(message)
    assert list(tmp_path.iterdir()) == []


HOSTILE = ["a\nb", "x\rtouch PWNED_CR", "q'uote", "$(touch PWNED_SUB)", "`touch PWNED_TICK`", "n\x00ul",
           "d\ntouch PWNED\nx"]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_recorded_values_stay_inside_comments(tmp_path: Path, searched: optuna.Study, value: str) -> None:
    trial = copy.deepcopy(export.pick_trial(searched, None))
    plan = trial.user_attrs["plan"]
    plan["instances"][0]["command"] = [*plan["instances"][0]["command"], value]
    trial.user_attrs = {**trial.user_attrs, "config": value, "plan": plan}
    searched.set_user_attr("model", value)
    searched.set_user_attr("host", {"cpu_model": value, "torch": value})
    path = tmp_path / "best.env"
    export.write(path, export.render(searched, trial))
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    sourced(path)
    assert not list(tmp_path.glob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
    assert export.read(path).env["AUTOTUNE_BINDING"]


@pytest.mark.parametrize("value", ["in\nputs.pt", "x\rtouch PWNED", "nul\x00"])
def test_a_value_an_env_file_cannot_carry_is_refused(tmp_path: Path, searched: optuna.Study, value: str) -> None:
    trial = copy.deepcopy(export.pick_trial(searched, None))
    plan = trial.user_attrs["plan"]
    plan["bench"]["example_inputs"] = f"/data/{value}"
    trial.user_attrs = {**trial.user_attrs, "plan": plan}
    with pytest.raises(ExportError, match="cannot export AUTOTUNE_EXAMPLE_INPUTS: .* holds a control character"):
        export.render(searched, trial)


def test_sourcing_a_file_unsets_what_an_earlier_one_set(tmp_path: Path, searched: optuna.Study) -> None:
    first, second = tmp_path / "first.env", tmp_path / "second.env"
    trial = export.pick_trial(searched, None)
    export.write(first, export.render(searched, trial, tmp_path / "compiled"))
    export.write(second, export.render(searched, trial))
    script = (f"source {first} && source {second} && "
              "echo \"${AUTOTUNE_ARTIFACTS-unset} ${AUTOTUNE_EXAMPLE_INPUTS-unset}\"")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["unset", "unset"]


def test_a_dynamic_text_trial_recorded_before_the_cache_rule_exports_room_for_every_length(
        tmp_path: Path, searched: optuna.Study) -> None:
    trial = copy.deepcopy(export.pick_trial(searched, None))
    plan = trial.user_attrs["plan"]
    plan["config"] = {"backend": "inductor", "shapes": "dynamic"}
    plan["bench"] = {**plan["bench"], "model": "hf:bert", "item_shape": [384], "seq_lens": [32, 128, 384],
                     "seq_len_weights": [0.5, 0.25, 0.25]}
    assert export.PRIMITIVE_CACHE_VAR not in plan["instances"][0]["env"]  # as a search before the rule recorded it
    trial.user_attrs = {**trial.user_attrs, "plan": plan}
    path = tmp_path / "best.env"
    export.write(path, export.render(searched, trial))
    assert sourced(path)[export.PRIMITIVE_CACHE_VAR] == "6144"
    export.write(path, export.render(searched, export.pick_trial(searched, None)))
    assert export.PRIMITIVE_CACHE_VAR in path.read_text().split("\nunset ")[1].splitlines()[0].split()
    assert export.PRIMITIVE_CACHE_VAR not in sourced(path)
