"""The kernel probe: what it decides from its figures, how it is kept and run again, how a crash
of its child is recorded, and (e2e) the real probe of this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from autotune.base import thresholds
from autotune.host import capabilities, topology
from autotune.host.capabilities import Probe, ProbeError
from autotune.model.backends import probe as kernel_probe
from tests.conftest import HOST_PROBE
from tests.support import probes
from tests.support.cli import run_cli


def test_a_precision_is_refused_only_for_what_its_probe_measured() -> None:
    probe = probes.probe({
        "openvino:bf16:conv": {"ran_as": "f32"},
        "torch:bf16:conv": {"gops": {"1": 30.0, "2": 60.0}},
        "torch:int8:conv": {"rel_error": 0.09},
        "onnxruntime:int8:conv": {"runs": False, "error": "RuntimeError: no kernel", "gops": {}},
    })
    assert probe.refusal("openvino", "bf16", "conv") == "openvino ran it in f32 in its probe"
    assert probe.refusal("torch", "bf16", "conv") == "it measured 3.3x slower than fp32 in its probe (conv)"
    assert probe.failure("torch", "bf16", "conv") == ""  # slow is no failure: `bench` measures it
    assert probe.refusal("torch", "int8", "conv") == ("it disagrees with fp32 in its probe (relative error 0.090 on "
                                                      "the same inputs, at most 0.05 allowed)")
    assert probe.refusal("onnxruntime", "int8", "conv") == "its probe failed: RuntimeError: no kernel"
    for runtime, precision in (("torch", "bf16"), ("torch", "int8"), ("openvino", "bf16"), ("onnxruntime", "int8")):
        assert probe.refusal(runtime, precision, "matmul") == ""  # the other operation ran well
    assert probe.refusal("torch", "int8_dynamic", "conv") == ""  # judged by its matmul, the only one it has
    refused = capabilities.refusals(probe, "conv")
    assert set(refused) == {("eager", "bf16"), ("torchscript", "bf16"), ("inductor", "bf16"), ("inductor", "int8"),
                            ("openvino", "bf16"), ("onnxruntime", "int8")}  # a backend's own precisions alone


def test_slower_counts_at_the_best_thread_count() -> None:
    """A precision that scales worse but is faster at one thread count is not refused."""
    probe = probes.probe({"torch:bf16:conv": {"gops": {"1": 150.0, "2": 90.0}}})
    assert probe.refusal("torch", "bf16", "conv") == ""
    assert probe.over_fp32(probe.kernel("torch", "bf16", "conv")) == 1.5  # type: ignore[arg-type]


def test_the_peak_fills_the_cores_with_instances_where_that_gives_more() -> None:
    probe = probes.probe({"torch:int8:conv": {"gops": {"1": 400.0, "2": 600.0}}})
    peak = probe.peak("torch", "int8", "conv", cores=2)
    assert peak == capabilities.Peak(800.0, threads=1, instances=2)
    assert peak.describe("GOP/s") == "800 GOP/s (2 x 1 thread)"
    assert probe.summary(2)["peaks"]["torch:int8:conv"] == {"gops": 800.0, "threads": 1, "instances": 2}
    assert probe.bandwidth_gbs() == 30.0


def test_thread_counts_reach_every_core() -> None:
    assert capabilities.thread_counts(1) == (1,)
    assert capabilities.thread_counts(2) == (1, 2)
    assert capabilities.thread_counts(12) == (1, 2, 4, 8, 12)


class Runs:
    """A made-up probe child: counts its runs and returns the made-up probe's figures."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, threads: Sequence[int], folder: Path) -> dict[str, Any]:
        self.count += 1
        return {"threads": list(threads), "kernels": [probes.kernel("torch", "fp32", "conv")], "bandwidth": {}}


@pytest.mark.real_probe
def test_the_kept_probe_is_reused_and_run_again_on_a_new_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(capabilities.PROBE_DIR_ENV, raising=False)
    runs, said = Runs(), []
    first = capabilities.load(tmp_path, 2, say=said.append, runner=runs)
    again = capabilities.load(tmp_path, 2, say=said.append, runner=runs)
    assert runs.count == 1 and again.path == first.path and Path(first.path).parent == tmp_path / "probe"
    assert said == [f"probing what this CPU runs and how fast (once per host and library versions; {first.path})"]
    capabilities.load(tmp_path, 2, rerun=True, runner=runs)  # `autotune doctor --probe`
    assert runs.count == 2
    versions = kernel_probe.versions()
    monkeypatch.setattr(kernel_probe, "versions", lambda: versions | {"torch": "2.15.0"})
    newer = capabilities.load(tmp_path, 2, runner=runs)
    assert runs.count == 3 and newer.path != first.path and newer.key["versions"]["torch"] == "2.15.0"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # an instruction-set limit is another machine
    assert capabilities.load(tmp_path, 2, runner=runs).path not in (first.path, newer.path)


class Beside(Runs):
    """A made-up probe child that other processes shared the CPUs with in its first `busy` runs."""

    def __init__(self, busy: int) -> None:
        super().__init__()
        self.busy = busy

    def __call__(self, threads: Sequence[int], folder: Path) -> dict[str, Any]:
        share = 0.6 if self.count < self.busy else 0.01
        return super().__call__(threads, folder) | {"noise": {"other_cpu_share": share, "steal_share": 0.0}}


@pytest.mark.real_probe
def test_a_probe_beside_other_work_runs_again_and_is_kept_once_it_ran_alone(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(capabilities.PROBE_DIR_ENV, raising=False)
    runs, said, waits = Beside(busy=1), [], []
    probe = capabilities.load(tmp_path, 2, say=said.append, runner=runs, wait=waits.append)
    assert runs.count == 2 and waits == [thresholds.NOISY_RETRY_WAIT]
    assert said[1] == ("the probe ran beside other work (other processes used 60% of the CPUs > 25%); probing again "
                       f"in {thresholds.NOISY_RETRY_WAIT} s")
    assert json.loads(Path(probe.path).read_text())["noise"]["other_cpu_share"] == 0.01  # the quiet one is kept
    assert capabilities.load(tmp_path, 2, runner=runs) == probe and runs.count == 2


@pytest.mark.real_probe
def test_a_probe_beside_other_work_every_time_is_used_once_and_not_kept(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(capabilities.PROBE_DIR_ENV, raising=False)
    runs, said, waits = Beside(busy=99), [], []
    probe = capabilities.load(tmp_path, 2, say=said.append, runner=runs, wait=waits.append)
    assert runs.count == 1 + thresholds.PROBE_RETRIES and len(waits) == thresholds.PROBE_RETRIES
    assert probe.kernels and probe.path == "" and not list((tmp_path / "probe").glob("probe-*.json"))
    assert said[-1].startswith("the probe ran beside other work every time (other processes used 60% of the CPUs "
                               "> 25%): this command uses it, but it is not kept, and the next command probes again")
    alone = Beside(busy=0)
    assert Path(capabilities.load(tmp_path, 2, runner=alone).path).exists() and alone.count == 1


def _busy(seconds: float) -> list[str]:
    """A process that keeps one CPU busy for `seconds`."""
    loop = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    return [sys.executable, "-c", loop]


def test_the_probe_counts_its_own_children_as_its_own_and_a_process_beside_it_as_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real processes: the probe's child keeps a CPU busy for a second; run alone, other processes'
    share stays under the limit; with a busy process beside it, that process's second is someone else's."""
    def child(threads: Sequence[int], out: Path, skip: Sequence[str], timeout_s: float) -> tuple[int, str]:
        subprocess.run(_busy(1.0), check=True)
        out.write_text(json.dumps({"threads": [1], "kernels": [probes.kernel("torch", "fp32", "conv")],
                                   "bandwidth": {}, "running": ""}))
        return 0, ""

    monkeypatch.setattr(capabilities, "_child", child)
    alone = capabilities.run_child([1], tmp_path)
    assert alone["noise"]["other_cpu_share"] < thresholds.BUSY_MACHINE and capabilities.disturbed(alone) == ""
    neighbour = subprocess.Popen(_busy(60.0))
    try:
        beside = capabilities.run_child([1], tmp_path)
    finally:
        neighbour.kill()
        neighbour.wait()
    assert beside["noise"]["other_cpu_share"] > thresholds.BUSY_MACHINE
    assert capabilities.disturbed(beside).startswith("other processes used")


@pytest.mark.real_probe
def test_a_damaged_kept_probe_is_measured_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(capabilities.PROBE_DIR_ENV, raising=False)
    runs, said = Runs(), []
    path = Path(capabilities.load(tmp_path, 2, runner=runs).path)
    path.write_text('{"kernels": [')
    assert capabilities.load(tmp_path, 2, say=said.append, runner=runs).kernels
    assert runs.count == 2 and said[0] == (f"the kept probe {path} cannot be used (not JSON: Expecting value: line 1 "
                                           f"column 14 (char 13)); probing again")


def _runs_no(kept: dict[str, Any]) -> dict[str, Any]:
    return kept | {"kernels": [k | {"runs": "no"} for k in kept["kernels"]]}


@pytest.mark.real_probe
@pytest.mark.parametrize(("damage", "why"), [
    (lambda kept: {"kernels": "abc", "threads": 5}, 'kernels: "abc" is not a list'),
    (_runs_no, 'kernels[0].runs: "no" is not true or false'),  # a string is not taken for "it runs"
    (lambda kept: kept | {"threads": [0]}, "threads[0]: 0 is not a whole number above 0"),
    (lambda kept: kept | {"kernels": [kept["kernels"][0] | {"gops": {"two": 1.0}}]},
     'kernels[0].gops.two: the key "two" is not a whole number above 0'),
    (lambda kept: [kept], "the file: list is not an object"),
])
def test_a_kept_probe_of_the_wrong_types_is_measured_again_with_a_note(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: Any, why: str) -> None:
    monkeypatch.delenv(capabilities.PROBE_DIR_ENV, raising=False)
    runs, said = Runs(), []
    path = Path(capabilities.load(tmp_path, 2, runner=runs).path)
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    again = capabilities.load(tmp_path, 2, say=said.append, runner=runs)
    assert runs.count == 2 and again.kernel("torch", "fp32", "conv").runs is True  # type: ignore[union-attr]
    assert said[0] == f"the kept probe {path} cannot be used ({why}); probing again"
    assert capabilities.load(tmp_path, 2, runner=runs) == again and runs.count == 2  # the new one is kept


@pytest.mark.real_probe
@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_kept_probe_that_is_no_file_is_refused_before_anything_is_probed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    monkeypatch.delenv(capabilities.PROBE_DIR_ENV, raising=False)
    path = capabilities.probe_path(tmp_path, capabilities.key(2))
    path.parent.mkdir(parents=True)
    path.mkdir() if kind == "folder" else os.mkfifo(path)  # a named pipe with no writer: never read
    runs = Runs()
    what = "a folder" if kind == "folder" else "a named pipe (FIFO)"
    for rerun in (False, True):
        with pytest.raises(ProbeError) as refused:
            capabilities.load(tmp_path, 2, rerun=rerun, runner=runs)
        assert str(refused.value) == (f"the kept probe {path} cannot be used: it is {what}, not a file; remove it, or "
                                      f"point AUTOTUNE_PROBE_DIR or --cache-dir at another folder")
    assert runs.count == 0


@pytest.mark.real_probe
def test_a_folder_the_probe_cannot_be_kept_in_is_refused_before_it_runs(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(capabilities.PROBE_DIR_ENV, raising=False)
    (tmp_path / "file").write_text("")
    runs = Runs()
    with pytest.raises(ProbeError, match=r"^cannot write the kernel probe into .*/file/probe \(.*\); make the cache "
                                         r"folder writable or choose another with --cache-dir$"):
        capabilities.load(tmp_path / "file", 2, runner=runs)
    assert runs.count == 0


def test_a_kernel_that_kills_its_child_is_recorded_and_the_rest_measured(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def child(threads: Sequence[int], out: Path, skip: Sequence[str], timeout_s: float) -> tuple[int, str]:
        calls.append(list(skip))
        first = probes.kernel("torch", "fp32", "conv")
        if len(calls) == 1:  # died in its second kernel
            out.write_text(json.dumps({"threads": [1, 2], "kernels": [first], "running": "torch:fp32:matmul"}))
            return -11, "killed by SIGSEGV"
        rest = [probes.kernel("torch", "bf16", "conv")]
        out.write_text(json.dumps({"threads": [1, 2], "kernels": rest, "bandwidth": {}, "running": ""}))
        return 0, ""

    monkeypatch.setattr(capabilities, "_child", child)
    result = capabilities.run_child([1, 2], tmp_path)
    assert calls == [[], ["torch:fp32:conv", "torch:fp32:matmul"]]
    assert [(k["precision"], k["op"], k["runs"]) for k in result["kernels"]] == [
        ("fp32", "conv", True), ("fp32", "matmul", False), ("bf16", "conv", True)]
    assert result["kernels"][1]["error"] == "the probe's process died running it (killed by SIGSEGV)"
    assert not list(tmp_path.iterdir())  # its scratch folder is gone


def test_a_child_that_measures_nothing_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capabilities, "_child", lambda *args: (1, "exit 1: ModuleNotFoundError: No module named x"))
    with pytest.raises(ProbeError, match=r"^the kernel probe failed \(exit 1: ModuleNotFoundError: No module named "
                                         r"x\) before it measured anything; run `python -m "
                                         r"autotune.model.backends.probe"):
        capabilities.run_child([1], tmp_path)


def test_a_probe_round_trips_through_its_json() -> None:
    made = probes.probe({"torch:int8:conv": {"remedy": "reduce_range", "saturates": True, "exact_error": 0.09}})
    data = made.to_json()
    again = Probe.from_json(data)
    assert again.kernel("torch", "int8", "conv") == made.kernel("torch", "int8", "conv")
    assert data["kernels"][4]["over_fp32"] == 4.0 and data["kernels"][4]["refusal"] == ""


@pytest.mark.e2e
def test_this_machines_probe_measured_every_kernel_and_the_bandwidth() -> None:
    """The suite's probe of this host (tests/conftest.py): the real child, every runtime installed."""
    assert HOST_PROBE.threads == capabilities.thread_counts(len(topology.detect().usable_cores))
    names = {(k.runtime, k.precision, k.op) for k in HOST_PROBE.kernels}
    assert names == {(k.runtime, k.precision, k.op) for k in kernel_probe.all_kernels()}
    fp32 = HOST_PROBE.kernel("torch", "fp32", "conv")
    assert fp32 is not None and fp32.runs and all(g > 1 for _, g in fp32.gops)
    assert HOST_PROBE.bandwidth_gbs() is not None and HOST_PROBE.bandwidth_gbs() > 1  # type: ignore[operator]


@pytest.mark.e2e
def test_doctor_shows_the_probe(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "doctor", "--json")
    assert code == 0
    probe = json.loads(out)["probe"]
    assert {k["precision"] for k in probe["kernels"]} == {"fp32", "bf16", "int8", "int8_dynamic", "int8_weight_only"}
    assert probe["bandwidth"] and probe["measured_at"]


def test_probing_in_a_measuring_process_keeps_its_thread_count() -> None:
    """int8's conversion asks, in the process that then runs the model, whether this CPU's kernels
    saturate (`saturation.remedy`), measured on one thread: the model must still run at the count the
    process was launched with (left at one, resnext101 int8 at 2 threads took 85 ms instead of 45)."""
    import torch

    from autotune.model import backends, saturation
    from autotune.model.kernels import Kernel, bandwidth

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        saturation.forget()
        saturation.remedy(backends.get("inductor"))
        assert torch.get_num_threads() == 2
        kernel_probe.measure(Kernel("torch", "int8", "matmul"), [1])
        bandwidth([1])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.e2e
def test_int8_sums_saturate_where_onednn_is_limited_to_avx2() -> None:
    """With oneDNN limited to AVX2 (no VNNI), u8 x s8 pairs go through 16-bit sums: measured to saturate
    at the full uint8 range, so PyTorch's int8 quantizes activations to 7 bits, which agree."""
    program = ("from autotune.model.backends import probe as p; from autotune.model.kernels import Kernel; "
               "from autotune.model import backends, saturation as s; "
               "import json; m = p.measure(Kernel('torch', 'int8', 'conv'), [1]); "
               "print(json.dumps([s.saturates(backends.of_runtime('torch')), s.remedy(backends.get('inductor')), "
               "m.rel_error]))")
    env = os.environ | {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    saturates, remedy, rel_error = json.loads(done.stdout.strip().splitlines()[-1])
    assert (saturates, remedy) == (True, "reduce_range")
    assert rel_error < 0.02
