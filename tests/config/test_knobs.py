from __future__ import annotations

from pathlib import Path

import pytest

from autotune.base.errors import ConfigError
from autotune.config.knobs import Config


def test_empty_configuration_is_pytorch_defaults() -> None:
    config = Config.from_assignments([])
    assert config.values == ()
    assert config.describe() == "defaults"
    assert config.get("omp_runtime") == "gnu"
    assert config.get("omp_threads") is None


def test_values_are_typed_and_ordered_like_the_registry() -> None:
    config = Config.from_assignments(["allocator=jemalloc", "mkldnn=on", "omp_threads=2"])
    assert config.values == (("mkldnn", True), ("omp_threads", 2), ("allocator", "jemalloc"))
    assert config.describe() == "mkldnn=on omp_threads=2 allocator=jemalloc"


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("omp_thread=2", "unknown knob 'omp_thread'; did you mean omp_threads? knobs are: backend, mkldnn,"),
        ("allocator=jemaloc", "allocator=jemaloc is not allowed; use default, jemalloc, tcmalloc"),
        ("omp_threads=0", "omp_threads=0 is not allowed; use an integer from 1 to 4096"),
        ("mkldnn=maybe", "mkldnn=maybe is not allowed; use on, off"),
        ("omp_threads", "--set 'omp_threads' is not KNOB=VALUE, e.g. --set omp_threads=2"),
        ("kmp_blocktime=1", "kmp_blocktime applies only with omp_runtime=intel (here omp_runtime=gnu); "
                            "set omp_runtime or drop kmp_blocktime"),
    ],
)
def test_bad_assignments_say_what_is_allowed(assignment: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_assignments([assignment])
    assert str(info.value).startswith(message)


def test_omp_proc_bind_is_not_for_intel_openmp() -> None:
    with pytest.raises(ConfigError, match="omp_proc_bind applies only with omp_runtime=gnu/llvm"):
        Config.from_assignments(["omp_runtime=intel", "omp_proc_bind=close"])
    llvm = Config.from_assignments(["omp_runtime=llvm", "omp_proc_bind=close"])
    assert llvm.get("omp_proc_bind") == "close"


def test_a_knob_given_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match="--set gives omp_threads twice"):
        Config.from_assignments(["omp_threads=1", "omp_threads=2"])


def test_layout_knobs_follow_the_backend_and_mkldnn() -> None:
    with pytest.raises(ConfigError, match=r"mkldnn applies only with backend=eager \(here backend=inductor\)"):
        Config.from_assignments(["backend=inductor", "mkldnn=on"])
    with pytest.raises(ConfigError, match=r"precision applies only with mkldnn=off \(here mkldnn=on\)"):
        Config.from_assignments(["mkldnn=on", "precision=bf16"])
    config = Config.from_assignments(["backend=torchscript", "memory_format=channels_last", "precision=bf16"])
    assert config.describe() == "backend=torchscript memory_format=channels_last precision=bf16"


def test_the_model_knobs_types_and_defaults_are_the_tables() -> None:
    """ModelKnobs's fields and their Literal types say what `model.knobs.KNOBS` says, knob by knob, and
    `ModelSettings` (what the backends below the table read of them) names every one."""
    from dataclasses import fields
    from typing import Literal, get_args, get_origin, get_type_hints

    from autotune.model.knobdefs import ModelSettings
    from autotune.model.knobs import KNOBS, MODEL_KNOBS, ModelKnobs

    assert {f.name for f in fields(ModelKnobs)} == set(MODEL_KNOBS)
    assert {name: getattr(ModelKnobs(), name) for name in MODEL_KNOBS} == {n: KNOBS[n].default for n in MODEL_KNOBS}
    hints = get_type_hints(ModelKnobs)
    literals = {name: get_args(hints[name]) for name in MODEL_KNOBS if get_origin(hints[name]) is Literal}
    assert set(literals) == {name for name in MODEL_KNOBS if KNOBS[name].kind == "choice"}
    assert literals == {name: KNOBS[name].choices for name in literals}
    assert {name for name in vars(ModelSettings) if not name.startswith("_")} == {*MODEL_KNOBS, "without_peers"}
    assert {name: get_type_hints(vars(ModelSettings)[name].fget)["return"] for name in MODEL_KNOBS} == hints


def test_the_child_flags_take_the_knobs_values_and_the_protocol_defaults() -> None:
    from autotune.child.settings import CACHE_DIR, MeasureSettings
    from autotune.child.worker import parse_args
    from autotune.model.knobs import KNOBS, MODEL_KNOBS

    args = parse_args(["--model", "resnet18", "--item-shape", "3x8x8", "--result", "r.json"])
    assert (args.backend, args.precision, args.mkldnn, args.cache_dir) == ("eager", "fp32", "off", CACHE_DIR)
    protocol = (args.warmup, args.warmup_time, args.duration, args.min_iterations)
    assert protocol == tuple(vars(MeasureSettings()).values())
    for name in MODEL_KNOBS:
        for value in KNOBS[name].spellings():
            flag = f"--{name.replace('_', '-')}"
            assert getattr(parse_args(["--model", "m", "--item-shape", "1", "--result", "r", flag, value]),
                           name) == value


def test_apply_and_the_harness_refuse_a_broken_condition_in_the_same_words() -> None:
    from autotune.model.errors import ApplyError
    from autotune.model.knobs import ModelKnobs

    with pytest.raises(ConfigError) as harness:
        Config.from_assignments(["backend=inductor", "mkldnn=on"])
    with pytest.raises(ApplyError) as child:
        ModelKnobs(backend="inductor", mkldnn=True).check()
    assert str(harness.value) == str(child.value) == (
        "mkldnn applies only with backend=eager (here backend=inductor); set backend or drop mkldnn")


def test_a_knob_set_to_its_default_launches_what_leaving_it_unset_does() -> None:
    from autotune.config.knobs import identity_of

    assert Config.from_assignments(["allocator=default"]).identity() == "defaults"
    assert Config.from_assignments(["backend=eager", "omp_runtime=gnu", "allocator=jemalloc"]).identity() == (
        "allocator=jemalloc")
    assert Config.from_assignments(["instances=1"]).identity() == "instances=1"  # no default: setting it binds
    assert identity_of("allocator=default precision=fp32") == "defaults"
    assert identity_of("a_knob_of_long_ago=3") == "a_knob_of_long_ago=3"


def test_the_docs_knob_table_is_the_knob_table(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/knobs.md is `autotune knobs --markdown` (regenerate it with that command after a change)."""
    from tests.conftest import ROOT
    from tests.support.cli import run_cli

    code, out, _ = run_cli(capsys, "knobs", "--markdown")
    page = (ROOT / "docs" / "knobs.md").read_text()
    assert code == 0 and page.endswith(out), "docs/knobs.md is stale: run `autotune knobs --markdown`"
    from autotune.model.knobs import KNOBS

    assert out.count("\n") == len(KNOBS) + 2


def test_the_knob_list_fits_a_100_column_terminal(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`autotune knobs`: names, values, defaults and the variables each sets, a few lines a knob at
    most (what a knob does is behind `autotune knobs KNOB`), nothing cut at the edge."""
    from rich.console import Console

    from autotune.cli import knob_display
    from autotune.model.knobs import KNOBS
    from tests.support.cli import run_cli

    monkeypatch.setattr(knob_display, "out", Console(width=100, highlight=False))
    code, out, _ = run_cli(capsys, "knobs")
    lines = out.splitlines()
    assert code == 0 and max(len(line.rstrip()) for line in lines) <= 100
    assert lines[2].rstrip().endswith("┃") and lines[-3].rstrip().endswith("┘")  # the table's right edge shows
    assert all(f"│ {name} " in out for name in KNOBS) and "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD" in out
    assert len(lines) <= 2 * len(KNOBS) and "autotune knobs KNOB" in out


def test_one_knob_in_full(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.cli import run_cli

    code, out, _ = run_cli(capsys, "knobs", "kmp_affinity")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 100
    assert out.startswith("kmp_affinity (a process knob)\n  values:       compact, scatter, disabled\n"
                          "  default:      - (unset runs as kmp_affinity=disabled)\n"
                          "  applies when: backend=eager/torchscript/inductor omp_runtime=intel\n"
                          "  sets:         KMP_AFFINITY (compact: granularity=fine,compact,1,0; scatter:\n")
    code, out, _ = run_cli(capsys, "knobs", "allocator")
    assert "LD_PRELOAD (jemalloc: jemalloc; tcmalloc: tcmalloc), MALLOC_CONF (jemalloc:" in out


def test_an_unknown_knob_is_one_error_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.cli import assert_one_error_line

    monkeypatch.chdir(tmp_path)
    assert_one_error_line(capsys, tmp_path, "Error: unknown knob 'omp_thread'; did you mean omp_threads?",
                          "knobs", "omp_thread")
