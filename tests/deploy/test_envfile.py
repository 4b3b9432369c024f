"""The env file, the format a user keeps (model/envfile.py): what an export of each kind of
configuration sets (its own knobs, once) and unsets, a file cut short, a format this autotune does not
read, and a file of the previous format, which still loads."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

import autotune
from autotune.config.knobs import KNOBS, Config
from autotune.deploy import export
from autotune.host.machine import Machine
from autotune.measure import requests
from autotune.model import apply, envfile
from autotune.model.knobs import ModelKnobs
from tests.conftest import FIXTURES, NEEDS_PEERS
from tests.support.cli import AUTOTUNE

KNOB_VARS = {envfile.knob_var(name) for name in KNOBS}


def exported(here: Machine, *assignments: str, seq_lens: str = "") -> str:
    """The env file of a trial that ran `assignments` on resnet18 (or a transformers model at buckets)."""
    model = "hf:bert" if seq_lens else "resnet18"
    buckets = requests.models.parse_buckets(seq_lens, None) if seq_lens else None
    plan = requests.make_plan(requests.BenchRequest(model, Config.from_assignments(assignments), buckets=buckets), here)
    study = optuna.create_study(study_name="kinds")
    for key, value in {"model": model, "batch_size": 1, "objective": "latency"}.items():
        study.set_user_attr(key, value)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=10.0, params={"x": "a"},
                                 distributions={"x": CategoricalDistribution(["a"])},
                                 user_attrs={"plan": plan.to_json(), "config": plan.config.describe(),
                                             "latency_p50_ms": 10.0, "latency_p90_ms": 11.0, "throughput_ips": 100.0,
                                             "peak_rss_mb": 500.0}))
    return export.render(study, study.trials[0])


def knob_exports(text: str) -> dict[str, str]:
    parsed = envfile.parse(text)
    return {name: value for name, value in parsed.env.items() if name in KNOB_VARS}


def test_an_eager_export_sets_its_own_knobs_once_and_unsets_the_rest(here: Machine) -> None:
    text = exported(here, "mkldnn=on", "weight_cache=on", "omp_threads=2", "allocator=jemalloc")
    assert knob_exports(text) == {"AUTOTUNE_BACKEND": "eager", "AUTOTUNE_MKLDNN": "on", "AUTOTUNE_WEIGHT_CACHE": "on",
                                  "AUTOTUNE_OMP_THREADS": "2", "AUTOTUNE_ALLOCATOR": "jemalloc"}
    parsed = envfile.parse(text)
    assert "AUTOTUNE_KNOBS" not in parsed.env and "AUTOTUNE_DATALOADER_WORKERS" not in parsed.env
    assert {"AUTOTUNE_OV_HINT", "AUTOTUNE_ORT_OPTIMIZATION", "AUTOTUNE_SHAPES", "AUTOTUNE_KNOBS"} <= set(parsed.unset)
    assert text.endswith(f"{envfile.END}\n") and text.startswith(f"{envfile.HEADER}, format 2: ")


def test_an_inductor_export_names_no_eager_or_peer_knob(here: Machine) -> None:
    text = exported(here, "backend=inductor", "memory_format=channels_last", "precision=bf16")
    assert knob_exports(text) == {"AUTOTUNE_BACKEND": "inductor", "AUTOTUNE_MEMORY_FORMAT": "channels_last",
                                  "AUTOTUNE_PRECISION": "bf16"}
    assert {"AUTOTUNE_MKLDNN", "AUTOTUNE_SHAPES", "AUTOTUNE_OV_STREAMS"} <= set(envfile.parse(text).unset)


def test_shapes_is_exported_only_with_the_buckets_it_serves(here: Machine) -> None:
    text = exported(here, "backend=inductor", "shapes=dynamic", seq_lens="32,128")
    assert knob_exports(text)["AUTOTUNE_SHAPES"] == "dynamic"
    assert envfile.parse(text).env[envfile.SEQ_LENS_VAR] == "32,128"


@NEEDS_PEERS
def test_an_openvino_export_sets_its_runtime_s_knobs_alone(here: Machine) -> None:
    text = exported(here, "backend=openvino", "ov_hint=throughput", "ov_streams=2", "omp_threads=2")
    assert knob_exports(text) == {"AUTOTUNE_BACKEND": "openvino", "AUTOTUNE_OV_HINT": "throughput",
                                  "AUTOTUNE_OV_STREAMS": "2", "AUTOTUNE_OMP_THREADS": "2"}
    assert {"AUTOTUNE_MEMORY_FORMAT", "AUTOTUNE_MKLDNN", "AUTOTUNE_ORT_EXECUTION"} <= set(envfile.parse(text).unset)


def test_the_file_reads_back_the_configuration_it_was_written_for(here: Machine) -> None:
    assignments = ("backend=inductor", "precision=int8", "omp_threads=1", "instances=2", "omp_runtime=llvm")
    parsed = envfile.parse(exported(here, *assignments))
    assert requests.exported_config(parsed.env) == Config.from_assignments(assignments)
    applied = apply.from_env(parsed.env)
    assert applied is not None and applied.knobs == ModelKnobs(backend="inductor", precision="int8")
    defaults = envfile.parse(exported(here))
    assert requests.exported_config(defaults.env) == Config()  # backend=eager names what runs, sets nothing


@pytest.mark.parametrize("lines", [12, 20, -1])
def test_a_file_cut_short_is_refused_in_one_line(here: Machine, tmp_path: Path, lines: int) -> None:
    whole = exported(here, "backend=inductor", "omp_threads=2").splitlines(keepends=True)
    path = tmp_path / "cut.env"
    path.write_text("".join(whole[:lines]))
    with pytest.raises(envfile.EnvFileError, match=r"^.*cut.env: the configuration is cut short or edited.*: a whole "
                                                   r"format-2 file ends with '# end of the autotune configuration'; "
                                                   r"export it again$"):
        envfile.read(path)
    done = subprocess.run([AUTOTUNE, "run", str(path), "--", "true"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "cut short" in done.stderr


def test_a_newer_format_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(autotune.ApplyError, match=r"AUTOTUNE_FORMAT='3' is a format this autotune does not read "
                                                  r"\(it reads 1 to 2\); upgrade autotune"):
        apply.from_env({"AUTOTUNE_FORMAT": "3", "AUTOTUNE_BACKEND": "eager"})


def test_a_file_of_the_previous_format_still_loads(tmp_path: Path) -> None:
    """Format 1 (every model knob's variable, and every knob again in AUTOTUNE_KNOBS)."""
    path = FIXTURES / "envs" / "format1.env"
    chosen = autotune.load_env_file(path)
    assert chosen is not None and chosen.knobs.describe() == "backend=inductor precision=bf16"
    parsed = envfile.read(path)
    assert requests.exported_config(parsed.env).describe() == (
        "backend=inductor precision=bf16 omp_threads=2 omp_runtime=intel kmp_affinity=compact")
    lines = path.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut1.env"
    for kept in (lines[:-1], lines[:-2], lines[:12]):  # its last line; the launch lines; most of it
        cut.write_text("".join(kept))
        with pytest.raises(envfile.EnvFileError, match=r"cut short or edited.*: a whole format-1 file ends with its "
                                                       r"launch lines, one comment per instance; export it again$"):
            envfile.read(cut)


def test_a_file_edited_after_its_last_line_or_against_its_header_is_refused(here: Machine, tmp_path: Path) -> None:
    whole = exported(here, "backend=inductor")
    path = tmp_path / "edited.env"
    path.write_text(whole + "export OMP_NUM_THREADS='1'\n")
    with pytest.raises(envfile.EnvFileError, match="cut short or edited"):
        envfile.read(path)
    path.write_text(whole.replace("export AUTOTUNE_FORMAT='2'", "export AUTOTUNE_FORMAT='1'"))
    with pytest.raises(envfile.EnvFileError, match=r"its header says format 2 but it sets AUTOTUNE_FORMAT='1'"):
        envfile.read(path)
    path.write_text(whole)
    assert envfile.read(path).format == 2


def _twice(text: str) -> str:
    return text.replace("export AUTOTUNE_BACKEND='inductor'\n",
                        "export AUTOTUNE_BACKEND='inductor'\nexport AUTOTUNE_BACKEND='eager'\n")


@pytest.mark.parametrize(("edit", "why"), [
    (_twice, r"line (\d+): AUTOTUNE_BACKEND is set a second time \(first on line (\d+)\); a file autotune writes "
             r"sets each variable once"),
    (lambda text: text.replace("export AUTOTUNE_MODEL='resnet18'", "export AUTOTUNE_MODEL='res\0net18'"),
     r"line \d+: the value of AUTOTUNE_MODEL holds a control character \(\\x00\), which no environment carries"),
    (lambda text: text.replace("export OMP_NUM_THREADS='2'", "export OMP_NUM_THREADS='2\x1b[2J'"),
     r"line \d+: the value of OMP_NUM_THREADS holds a control character \(\\x1b\), which no environment carries"),
    (lambda text: text.replace("export OMP_NUM_THREADS=", "export OMP-NUM-THREADS="),
     r"line \d+: 'OMP-NUM-THREADS' is not a variable's name"),
])
def test_a_file_autotune_never_writes_is_refused_in_one_line(here: Machine, tmp_path: Path, edit: Any,
                                                             why: str) -> None:
    """A variable set twice ran the last value silently; a NUL in a value was an internal error of Popen."""
    path = tmp_path / "edited.env"
    path.write_text(edit(exported(here, "backend=inductor", "omp_threads=2")))
    with pytest.raises(envfile.EnvFileError, match=rf"^{re.escape(str(path))}: {why}; export it again$") as refused:
        envfile.read(path)
    lines = re.findall(r"line (\d+)", str(refused.value))
    assert all(path.read_text().splitlines()[int(n) - 1].startswith("export ") for n in lines)
    done = subprocess.run([AUTOTUNE, "run", str(path), "--", "true"], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"Error: {refused.value}\n"


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_an_env_file_that_is_no_file_is_refused_without_reading_it(tmp_path: Path, kind: str) -> None:
    """A named pipe nobody writes to would block a reader forever."""
    path = tmp_path / "best.env"
    path.mkdir() if kind == "folder" else os.mkfifo(path)
    what = "a folder" if kind == "folder" else "a named pipe (FIFO)"
    with pytest.raises(envfile.EnvFileError, match=rf"^cannot read env file {re.escape(str(path))}: it is "
                                                   rf"{re.escape(what)}, not a file; give a file made by "
                                                   r"`autotune export`$"):
        envfile.read(path)
