"""The CLI's contract: every command has --help; every bad input is one `Error:` line, exit code 2;
an internal error is one `Error:` line naming its saved traceback, exit code 3."""

from __future__ import annotations

import errno
import json
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import autotune
from autotune.base import tempdirs
from autotune.cli import crash, knob_display
from autotune.cli.common import EXIT_FAILED, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE
from autotune.cli.main import cli, main
from tests.conftest import FIXTURES
from tests.support.cli import run_cli

XEON = str(FIXTURES / "lscpu" / "xeon_2s_ht.txt")


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_command_has_help_with_an_example(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, _ = run_cli(capsys, command, "--help")
    assert code == 0
    assert "Example:" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "--model", "resnet18", "--set", "omp_thread=2"],
         "Error: unknown knob 'omp_thread'; did you mean omp_threads?"),
        (["plan", "--model", "resnet18", "--set", "allocator=mimalloc"],
         "Error: allocator=mimalloc is not allowed; use default, jemalloc, tcmalloc"),
        (["plan", "--model", "resnet5"], "Error: unknown model 'resnet5'; did you mean resnet50"),
        (["plan", "--model", "resnet18", "--lscpu", "/nonexistent/lscpu.txt"],
         "Error: cannot read --lscpu file '/nonexistent/lscpu.txt': No such file or directory"),
        (["plan", "--model", "resnet18", "--lscpu", XEON, "--set", "instances=9"],
         "Error: omp_threads=1 x instances=9 = 9 threads is above the 8 usable physical cores"),
        (["plan", "--model", "resnet18", "--batch-size", "0"],
         "Error: --batch-size 0 is not allowed; use 1 or more"),
        (["plan"], "Error: Missing option '--model'. (see `autotune plan --help`)"),
        (["plna"], "Error: No such command 'plna'."),
        (["bench", "--model", "resnet18", "--duration", "-1"], "Error: Invalid value for '--duration'"),
        (["search", "--model", "resnet18", "--trials", "2", "--batch-size", "1,x"],
         "Error: --batch-size '1,x' is not allowed; give a number like 8 or a list like 1,2,4,8"),
        (["confirm", "--rounds", "3"], "Error: Invalid value for '--rounds': 3 is not in the range x>=5."),
        (["confirm", "--rounds", "5", "--top", "3"], "Error: --rounds 5 can never reach significance for 3 "
                                                     "candidate(s)"),
        (["search", "--model", "resnet18", "--trials", "2", "--confirm-rounds", "5"],
         "Error: --confirm-rounds 5 can never reach significance for 3 candidate(s): the smallest one-sided "
         "signed-rank p is 1/32, and Holm's correction asks for p < 0.05/3; use --confirm-rounds 6 or more, or a "
         "smaller --confirm-top"),
        (["plan", "--model", "resnet18", "--set", "backend=inductor", "--set", "mkldnn=on"],
         "Error: mkldnn applies only with backend=eager (here backend=inductor)"),
        (["plan", "--model", "resnet18", "--example-inputs", "/nonexistent/inputs.pt"],
         "Error: --example-inputs '/nonexistent/inputs.pt' is not a file; save your inputs with torch.save"),
        (["plan", "--model", "resnet18", "--example-inputs", XEON],
         "Error: --example-inputs: cannot load example inputs"),
        (["plan", "--model", "resnet18", "--input-shape", "3x32x32", "--example-inputs", XEON],
         "Error: give --input-shape or --example-inputs, not both"),
        (["run", str(FIXTURES / "envs" / "unknown_backend.env"), "--", "true"],
         f"Error: {FIXTURES / 'envs' / 'unknown_backend.env'}: backend=tensorrt is not allowed; use eager, "),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(capsys: pytest.CaptureFixture[str], args: list[str],
                                               message: str) -> None:
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    assert err.startswith(message)
    assert err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""


def test_plan_json_for_a_described_machine(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "plan", "--model", "resnext101", "--lscpu", XEON, "--set",
                           "instances=2", "--set", "omp_runtime=intel", "--set", "kmp_blocktime=1",
                           "--json")
    assert code == 0
    data = json.loads(out)
    assert (data["kind"], data["schema_version"]) == ("plan", 1)
    assert data["bench"]["model"] == "resnext101_32x8d"
    assert [i["cpus"] for i in data["instances"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [i["numa_node"] for i in data["instances"]] == [0, 1]
    inst = data["instances"][1]
    assert inst["env"]["KMP_BLOCKTIME"] == "1" and inst["env"]["OMP_NUM_THREADS"] == "4"
    assert inst["command"][1:3] == ["--physcpubind=4-7", "--membind=1"]


def test_plan_table_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "plan", "--model", "resnet18", "--lscpu", XEON, "--set", "instances=2")
    assert code == 0
    assert "binding: numactl" in out and "OMP_NUM_THREADS=4" in out


def test_doctor_json_lists_libraries_with_install_hints(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "doctor", "--json")
    assert code == 0
    data = json.loads(out)
    assert (data["kind"], data["schema_version"]) == ("doctor", 1)
    assert data["physical_cores"] >= 1 and data["usable_physical_cores"] >= 1
    assert set(data["libraries"]) == {"libiomp5", "libomp", "jemalloc", "tcmalloc"}
    for info in data["libraries"].values():
        assert (info["path"] is None) != (info["install"] is None)
    assert set(data["isa"]) >= {"avx512f", "avx512_bf16", "amx_tile"}
    assert data["torch"].startswith("2.")
    assert set(data["timing_floor"]) == {"threshold", "windows", "described"}


def test_doctor_shows_this_hosts_timing_floor_once_searches_gathered_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from autotune.host import floor, machine

    code, out, _ = run_cli(capsys, "doctor", "--cache-dir", str(tmp_path))
    assert code == 0 and "timing floor: not known yet (0 of the 8 undisturbed windows it needs" in out
    floor.save(floor.here(tmp_path, len(machine.this_machine().topology.usable_cores)).adding([0.04] * 19 + [0.3]))
    code, out, _ = run_cli(capsys, "doctor", "--cache-dir", str(tmp_path), "--json")
    assert json.loads(out)["timing_floor"] == {
        "threshold": 0.04, "windows": 20,
        "described": "4.0% IQR/median (95% of 20 undisturbed windows spread less; their median 4.0%)"}


def test_doctor_lists_the_runtimes_found_with_their_versions_and_how_to_install_a_missing_one(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.model import backends
    from autotune.model.backends.base import Packages

    found = {"openvino": "2026.4.1", "nncf": "3.4.0", "openvino-genai": "2026.4.1.0", "onnxruntime": None,
             "onnx": "1.23.2", "onnxscript": None,
             "llama-cpp-python": "0.3.36", "gguf": "0.19.0"}
    monkeypatch.setattr(Packages, "versions", lambda self: {name: found[name] for name in self.distributions})
    monkeypatch.setattr(backends, "missing", lambda backend, generates=False: ("onnxruntime", "onnxscript")
                        if backend == "onnxruntime" else ())
    code, out, _ = run_cli(capsys, "doctor", "--json")
    assert code == 0
    assert json.loads(out)["runtimes"] == {
        "openvino": {"name": "OpenVINO", "versions": {"openvino": "2026.4.1", "nncf": "3.4.0"}, "install": None},
        "openvino generate": {"name": "OpenVINO GenAI", "versions": {"openvino-genai": "2026.4.1.0",
                                                                     "openvino": "2026.4.1", "nncf": "3.4.0"},
                              "install": None},
        "onnxruntime": {"name": "ONNX Runtime", "versions": {"onnxruntime": None, "onnx": "1.23.2", "onnxscript": None},
                        "install": "pip install 'autotune[onnxruntime]' (or: pip install onnxruntime onnx onnxscript)"},
        "llamacpp generate": {"name": "llama.cpp", "versions": {"llama-cpp-python": "0.3.36", "gguf": "0.19.0"},
                              "install": None}}
    code, out, _ = run_cli(capsys, "doctor")
    assert ("runtimes: openvino 2026.4.1, nncf 3.4.0, openvino-genai 2026.4.1.0, onnx 1.23.2, llama-cpp-python 0.3.36, "
            "gguf 0.19.0\n") in out
    assert "backend=onnxruntime needs ONNX Runtime: pip install 'autotune[onnxruntime]' (or: pip install " in out


def test_knobs_lists_every_knob(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "knobs")
    assert code == 0
    for name in ("mkldnn", "weight_cache", "kmp_blocktime", "omp_proc_bind", "dataloader_workers"):
        assert name in out


def test_the_installed_command_exits_2_without_traceback() -> None:
    exe = Path(sys.executable).with_name("autotune")
    proc = subprocess.run([str(exe), "plan", "--model", "nosuchmodel"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: unknown model 'nosuchmodel'")
    assert proc.stdout == ""


def test_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--help")
    codes = out.split("Exit codes:\n", 1)[1]
    lines = [f"    {value:<7}{meaning}" for value, meaning in [
        (EXIT_OK, "success"), (EXIT_FAILED, "a measured result failed"), (EXIT_USAGE, "bad input"),
        (EXIT_INTERNAL, "an internal error"), ("128+N", "stopped by signal N")]]
    assert code == 0 and all(line in codes for line in lines), codes


def _boom(*_: object) -> None:
    raise RuntimeError("boom\nsecond line")


@pytest.fixture
def broken_knobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`autotune knobs` with a bug in it, and a temporary folder of the test's own."""
    monkeypatch.setattr(knob_display, "knobs", _boom)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_an_internal_error_is_exit_3_and_one_line_naming_its_traceback(
        broken_knobs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "knobs")
    assert (code, out) == (3, "")
    found = re.fullmatch(r"Error: internal error \(RuntimeError: boom\); the traceback is in (\S+); please report it\n",
                         err)
    assert found, err
    saved = Path(found[1])
    assert saved.parent == broken_knobs and saved.name.startswith("autotune-crash-") and saved.suffix == ".txt"
    text = saved.read_text()
    assert "Traceback (most recent call last):" in text and "in _boom" in text and "RuntimeError: boom" in text
    assert "command: autotune knobs\n" in text and f"autotune: {autotune.__version__}\n" in text
    assert "\npython: CPython " in text and "\nplatform: " in text
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600  # a traceback may show what only this user may see
    tempdirs.remove_orphans(broken_knobs)  # the next start keeps it
    assert saved.exists()


def test_an_internal_error_whose_traceback_cannot_be_saved_is_still_one_line_and_exit_3(
        broken_knobs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(broken_knobs / "missing"))
    code, out, err = run_cli(capsys, "knobs")
    assert (code, out) == (3, "")
    assert err.startswith("Error: internal error (RuntimeError: boom); its traceback could not be saved "
                          "(FileNotFoundError: ")
    assert err.endswith("); rerun with --debug and please report it\n") and err.count("\n") == 1


def test_debug_shows_an_internal_error_as_a_traceback_and_saves_nothing(broken_knobs: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        main(["--debug", "knobs"])
    assert not list(broken_knobs.glob(f"{crash.PREFIX}*"))


def test_a_saved_traceback_shows_no_password() -> None:
    try:
        raise RuntimeError("cannot reach postgresql+psycopg://me:secretpw@127.0.0.1:1/db")
    except RuntimeError as exc:
        text = crash.report(exc, ["studies", "--storage", "postgresql+psycopg://me:secretpw@127.0.0.1:1/db"])
        line = crash.summary(exc)
    assert "secretpw" not in text + line
    assert "command: autotune studies --storage postgresql+psycopg://me:***@127.0.0.1:1/db\n" in text
    assert line == "RuntimeError: cannot reach postgresql+psycopg://me:***@127.0.0.1:1/db"


RUNS = {"search": ["--trials", "2"], "bench": [], "plan": []}


@pytest.fixture
def without_openvino(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This environment as one without OpenVINO's packages, in an empty folder (what gets written)."""
    from autotune.model import backends

    real = backends.missing
    monkeypatch.setattr(backends, "missing", lambda backend, generates=False: ("openvino", "nncf")
                        if backend == "openvino" else real(backend, generates))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", sorted(RUNS))
def test_a_backend_whose_runtime_is_not_installed_is_one_line_and_writes_nothing(
        capsys: pytest.CaptureFixture[str], without_openvino: Path, command: str) -> None:
    code, out, err = run_cli(capsys, command, "--model", "resnet18", "--set", "backend=openvino", *RUNS[command])
    assert code == 2
    install = "pip install 'autotune[openvino]' (or: pip install openvino nncf)"
    generation = "pip install 'autotune[openvino-genai]' (or: pip install openvino-genai openvino nncf)"
    assert err == ("Error: --set backend=openvino cannot run here: OpenVINO is not installed; install it with "
                   f"{install} (to generate text: {generation}); drop that --set\n" if command == "search" else
                   "Error: backend=openvino needs OpenVINO, and this environment lacks openvino, nncf; install it "
                   f"with {install}\n")
    assert out == "" and list(without_openvino.iterdir()) == []


@pytest.mark.parametrize("command", sorted(RUNS))
@pytest.mark.parametrize(("pins", "message"), [
    (["ov_hint=throughput", "backend=inductor"],
     "Error: ov_hint applies only with backend=openvino (here backend=inductor); set backend or drop ov_hint\n"),
    (["backend=onnxruntime", "ort_inter_threads=2"],
     "Error: ort_inter_threads applies only with ort_execution=parallel (here ort_execution=sequential); set "
     "ort_execution or drop ort_inter_threads\n"),
    (["backend=openvino", "omp_runtime=intel"],
     "Error: omp_runtime applies only with backend=eager/torchscript/inductor (here backend=openvino); set backend "
     "or drop omp_runtime\n"),
])
def test_a_knob_of_one_runtime_set_with_another_backend_is_one_line_and_writes_nothing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str,
        pins: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, command, "--model", "resnet18", *(a for p in pins for a in ("--set", p)),
                             *RUNS[command])
    assert (code, out, err) == (2, "", message)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_exit_1_and_one_line_saying_what_to_free_with_no_crash_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/srv/studies/tmp/run-1")

    monkeypatch.setattr(knob_display, "knobs", full)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, out, err = run_cli(capsys, "knobs")
    assert (code, out) == (EXIT_FAILED, "")
    assert err == ("Error: no space left on the disk writing /srv/studies/tmp/run-1; free space there (`autotune "
                   "cache` shows what compiled models take, `autotune cache --prune --older-than 1d` removes those "
                   "unused for a day) and run again\n")
    assert not list(tmp_path.iterdir())  # no crash report: this is no bug
