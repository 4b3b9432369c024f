"""`autotune cache`: what is cached, whether this torch and CPU can use it, and pruning that never
removes what an exported env file loads."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.base.errors import AutotuneError
from autotune.cli.options import parse_duration
from autotune.deploy import cache, cache_prune, export
from autotune.model import apply, references
from autotune.model.artifacts import ARTIFACT_FORMAT, installed_torch_version
from autotune.model.convert import saved_knobs
from autotune.model.knobs import ModelKnobs
from tests.support.cli import AUTOTUNE, run_cli

HERE = cache.Here(torch="2.14.1+cu130", isa=("avx2", "avx512f"))
DAY = 86400.0


def artifact(folder: Path, name: str, knobs: ModelKnobs, age_s: float = 0.0, **meta: Any) -> Path:
    """An artifact file and its description, as model.artifacts.save_artifact leaves them."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"x" * 1000)
    described = {"format": ARTIFACT_FORMAT, "knobs": saved_knobs(knobs), "inputs": ["1x3x64x64:float32:contiguous"],
                 "torch": HERE.torch, "isa": list(HERE.isa), "weights": "w", "model": "resnet18"} | meta
    Path(f"{path}.json").write_text(json.dumps(described))
    then = time.time() - age_s
    os.utime(f"{path}.json", (then, then))
    return path


INDUCTOR = ModelKnobs(backend="inductor", precision="bf16")


def test_unusable_names_what_changed() -> None:
    good = {"format": ARTIFACT_FORMAT, "torch": HERE.torch, "isa": list(HERE.isa)}
    assert cache.unusable(good, HERE) == ""
    assert cache.unusable(good | {"torch": "2.13.0"}, HERE) == "built for torch 2.13.0, this is 2.14.1+cu130"
    assert cache.unusable(good | {"isa": ["avx2"]}, HERE) == "built for a CPU with other instruction sets"
    assert cache.unusable(good | {"format": "v0"}, HERE).startswith("made in format v0")


def test_the_torch_version_read_without_importing_torch_is_torchs_own() -> None:
    import torch

    assert installed_torch_version() == torch.__version__


def test_scan_lists_artifacts_kernels_and_leftovers(tmp_path: Path) -> None:
    folder = tmp_path / "artifacts"
    fresh = artifact(folder, "inductor-a.pt2", INDUCTOR, threads=2)
    old_torch = artifact(folder, "torchscript-b.pt", ModelKnobs(backend="torchscript"), torch="2.13.0")
    (folder / "inductor-c.pt2.json").write_text("{}")  # its artifact is gone
    leftover = folder / ".inductor-d.123.tmp.pt2"
    leftover.write_bytes(b"x")
    os.utime(leftover, (time.time() - 2 * cache.UNFINISHED_AFTER_S,) * 2)
    (folder / ".inductor-e.124.tmp.pt2").write_bytes(b"x")  # young: maybe a compile running now
    (tmp_path / "inductor" / HERE.torch / "fx").mkdir(parents=True)
    (tmp_path / "inductor" / HERE.torch / "fx" / "k.so").write_bytes(b"k" * 10)
    (tmp_path / "inductor" / "2.13.0").mkdir()
    entries = {e.path.name: e for e in cache.scan(tmp_path, HERE)}
    assert set(entries) == {fresh.name, old_torch.name, "inductor-c.pt2.json", leftover.name, HERE.torch, "2.13.0"}
    assert entries[fresh.name].config == "backend=inductor precision=bf16 threads=2 inputs 1x3x64x64:float32:contiguous"
    assert entries[fresh.name].unusable == "" and entries[fresh.name].model == "resnet18"
    assert entries[fresh.name].size == 1000 + len(Path(f"{fresh}.json").read_bytes())
    assert entries[old_torch.name].unusable == "built for torch 2.13.0, this is 2.14.1+cu130"
    assert entries["inductor-c.pt2.json"].unusable == "its artifact file is missing"
    assert entries[leftover.name].unusable == "left by a compile that was stopped"
    assert entries[HERE.torch].unusable == "" and entries[HERE.torch].size == 10
    assert entries["2.13.0"].unusable == "built by torch 2.13.0, this is 2.14.1+cu130"


def test_the_kept_eager_outputs_are_entries_per_torch_version(tmp_path: Path) -> None:
    """`model.references` keeps them per torch version: another torch's are unusable, and pruned."""
    for version in (HERE.torch, "2.13.0", "2.12.0"):
        folder = tmp_path / references.FOLDER / version
        folder.mkdir(parents=True)
        (folder / "k.pt").write_bytes(b"r" * 7)
    os.utime(tmp_path / references.FOLDER / "2.12.0" / "k.pt", (time.time() - 40 * DAY,) * 2)
    entries = {e.path.name: e for e in cache.scan(tmp_path, HERE)}
    assert {e.kind for e in entries.values()} == {cache.REFERENCES}
    assert entries[HERE.torch].unusable == "" and entries[HERE.torch].size == 7
    assert entries["2.13.0"].unusable == "built by torch 2.13.0, this is 2.14.1+cu130"
    assert entries["2.12.0"].last_used < time.time() - 39 * DAY
    chosen = cache_prune.to_prune(entries.values(), None, time.time(), False)
    assert sorted(e.path.name for e in chosen) == ["2.12.0", "2.13.0"]
    assert all(cache_prune.remove(e) == "" for e in chosen)
    assert [p.name for p in (tmp_path / references.FOLDER).iterdir()] == [HERE.torch]


def test_prune_takes_the_unusable_and_the_unused_but_never_what_an_env_file_keeps(tmp_path: Path) -> None:
    folder = tmp_path / "artifacts"
    artifact(folder, "inductor-new.pt2", INDUCTOR)
    artifact(folder, "inductor-old.pt2", INDUCTOR, age_s=40 * DAY)
    artifact(folder, "inductor-kept.pt2", ModelKnobs(backend="inductor"), age_s=40 * DAY, threads=2)
    artifact(folder, "torchscript-stale.pt", ModelKnobs(backend="torchscript"), torch="2.13.0")
    keeper = cache.Export("best.env", folder, ModelKnobs(backend="inductor"), 2)
    entries = cache.scan(tmp_path, HERE, [keeper])
    names = lambda chosen: sorted(e.path.name for e in chosen)  # noqa: E731
    assert names(cache_prune.to_prune(entries, None, time.time(), False)) == ["torchscript-stale.pt"]
    assert names(cache_prune.to_prune(entries, 30 * DAY, time.time(), False)) == ["inductor-old.pt2",
                                                                                  "torchscript-stale.pt"]
    assert names(cache_prune.to_prune(entries, 30 * DAY, time.time(), True)) == [
        "inductor-kept.pt2", "inductor-old.pt2", "torchscript-stale.pt"]
    other_threads = cache.Export("one.env", folder, ModelKnobs(backend="inductor"), 1)
    assert not any(e.kept_by for e in cache.scan(tmp_path, HERE, [other_threads]))


def test_an_int8_graph_is_listed_as_such_and_no_env_file_keeps_it(tmp_path: Path) -> None:
    """The quantized graph each thread count's int8 artifact is compiled from: an entry of its own
    kind, pruned by age even where an env file keeps the artifact made from it (it loads that)."""
    folder = tmp_path / "artifacts"
    int8 = ModelKnobs(backend="inductor", precision="int8")
    graph = artifact(folder, "int8graph-a.pt2", int8, age_s=40 * DAY, calibration="c")
    compiled = artifact(folder, "inductor-b.pt2", int8, age_s=40 * DAY, calibration="c", threads=1)
    keeper = cache.Export("best.env", folder, int8, 1)
    entries = {e.path.name: e for e in cache.scan(tmp_path, HERE, [keeper])}
    assert entries[graph.name].kind == "int8 quantized graph" and entries[graph.name].kept_by == ()
    assert entries[compiled.name].kind == "inductor artifact" and entries[compiled.name].kept_by == ("best.env",)
    assert [e.path.name for e in cache_prune.to_prune(entries.values(), 30 * DAY, time.time(), False)] == [graph.name]


def test_an_int8_layer_ranking_is_listed_pruned_with_its_torch_and_a_damaged_one_is_unusable(tmp_path: Path) -> None:
    """int8_fallback's ranking (model.fallback), kept beside the artifacts: an entry of its own kind,
    unusable for another torch, and one that cannot be read is ranked again."""
    from autotune.model import fallback

    folder = tmp_path / "artifacts"
    meta = {"format": ARTIFACT_FORMAT, "knobs": saved_knobs(ModelKnobs(backend="inductor", precision="int8")),
            "inputs": ["1x64:float32:contiguous"], "torch": "2.13.0", "isa": list(HERE.isa), "weights": "w",
            "calibration": "c", "model": "tinynets:outlier"}
    path = fallback.ranking_path(folder, meta)
    fallback.keep_ranking(path, fallback.Ranking(("head", "stem"), 0.5, {"head": 0.0, "stem": 0.4}, 0.2), meta)
    damaged = folder / "int8ranking-0.json"
    damaged.write_text("{")
    entries = {e.path.name: e for e in cache.scan(tmp_path, HERE)}
    assert entries[path.name].kind == "int8 layer ranking" and entries[path.name].model == "tinynets:outlier"
    assert entries[path.name].config == "backend=inductor precision=int8 inputs 1x64:float32:contiguous"
    assert entries[path.name].unusable == f"built for torch 2.13.0, this is {HERE.torch}"
    assert entries[damaged.name].unusable == "it cannot be read; it is ranked again"
    assert not cache_prune.prune(cache_prune.to_prune(entries.values(), None, time.time(), False)).kept
    assert list(folder.iterdir()) == []


def test_int8_calibration_batches_are_listed_and_kept_by_the_env_file_that_loads_them(tmp_path: Path) -> None:
    """`apply` without batches of its own calibrates on the ones an int8 artifact was made from: an
    env file of the folder keeps them as it keeps the artifact (any thread count's)."""
    folder = tmp_path / "artifacts"
    int8 = ModelKnobs(backend="inductor", precision="int8")
    batches = artifact(folder, "int8calibration-a.pt", int8, age_s=40 * DAY, batches=4)
    entries = {e.path.name: e for e in cache.scan(tmp_path, HERE, [cache.Export("best.env", folder, int8, 1)])}
    assert entries[batches.name].kind == cache.CALIBRATION and entries[batches.name].kept_by == ("best.env",)
    assert cache_prune.to_prune(entries.values(), 30 * DAY, time.time(), False) == []
    alone = cache.scan(tmp_path, HERE, [])
    assert [e.path.name for e in cache_prune.to_prune(alone, 30 * DAY, time.time(), False)] == [batches.name]


def test_a_guard_record_is_kept_in_the_description_and_a_damaged_one_is_no_record(tmp_path: Path) -> None:
    from autotune.model.artifacts import guard_record, remember_guard

    path = artifact(tmp_path / "artifacts", "inductor-a.pt2", ModelKnobs(backend="inductor", precision="int8"))
    assert guard_record(path, "k") is None
    remember_guard(path, "k", {"min_cosine": 0.99})
    remember_guard(path, "j", {"min_cosine": 0.98})
    assert guard_record(path, "k") == {"min_cosine": 0.99} and guard_record(path, "j") == {"min_cosine": 0.98}
    assert json.loads(Path(f"{path}.json").read_text())["model"] == "resnet18"  # the description is kept
    (entry,) = cache.scan(tmp_path, HERE)
    assert entry.unusable == "" and entry.kind == "inductor artifact"
    Path(f"{path}.json").write_text("[1, 2")
    remember_guard(path, "k", {"min_cosine": 0.99})  # costs the next process a guard, nothing more
    assert guard_record(path, "k") is None and Path(f"{path}.json").read_text() == "[1, 2"
    assert [p.name for p in (tmp_path / "artifacts").iterdir() if p.name.startswith(".")] == []


def test_remove_deletes_the_artifact_and_its_description(tmp_path: Path) -> None:
    path = artifact(tmp_path / "artifacts", "inductor-a.pt2", INDUCTOR)
    (entry,) = cache.scan(tmp_path, HERE)
    assert cache_prune.remove(entry) == ""
    assert list((tmp_path / "artifacts").iterdir()) == [] and not path.exists()


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("20m", 1200), ("1.5h", 5400), ("7d", 604800)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--older-than") == seconds


def test_older_than_takes_zero_for_everything_and_a_time_budget_does_not() -> None:
    assert parse_duration("0d", "--older-than", zero=True) == 0.0
    with pytest.raises(AutotuneError, match="'-1d' is not a duration; give a number with s, m, h or d"):
        parse_duration("-1d", "--older-than", zero=True)
    with pytest.raises(AutotuneError, match="give a positive number"):
        parse_duration("0m", "--time-budget")


@pytest.mark.parametrize("text", ["", "m", "0", "90", "-1h", "3x", "inf", "nan", "infh"])
def test_bad_durations_say_what_to_give(text: str) -> None:
    with pytest.raises(AutotuneError, match=f"--older-than {text!r} is not a duration; give a positive number"):
        parse_duration(text, "--older-than")


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUTOTUNE, "cache", *args], cwd=cwd, capture_output=True, text=True)


def test_cli_prune_keeps_what_an_exported_env_file_points_to(tmp_path: Path,
                                                            searched: optuna.Study) -> None:
    compiled = tmp_path / "compiled"
    trial = export.pick_trial(searched, None)
    export.write(tmp_path / "best.env", export.render(searched, trial, compiled))
    env = export.read(tmp_path / "best.env").env
    knobs = apply.knobs_from_env(env)
    threads = int(env["OMP_NUM_THREADS"]) if "OMP_NUM_THREADS" in env else 1
    here = {"torch": installed_torch_version(), "isa": list(cache.Here.now().isa)}
    kept = artifact(compiled, "inductor-kept.pt2", knobs, age_s=40 * DAY, threads=threads, **here)
    other = ModelKnobs(backend="torchscript", precision="bf16" if knobs.precision == "fp32" else "fp32")
    gone = artifact(compiled, "torchscript-gone.pt", other, age_s=40 * DAY, **here)
    (tmp_path / "notes.env").write_text("FOO=1\n")  # another tool's .env file: ignored, not an error

    proc = cli(tmp_path, "--cache-dir", "compiled", "--prune", "--older-than", "30d")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert kept.exists() and Path(f"{kept}.json").exists()
    assert not gone.exists() and not Path(f"{gone}.json").exists()
    listed = json.loads(cli(tmp_path, "--cache-dir", "compiled", "--json").stdout)
    assert (listed["kind"], listed["schema_version"]) == ("cache", 1)
    assert [(e["path"].rsplit("/", 1)[1], e["kept_by"]) for e in listed["entries"]] == [(kept.name, ["best.env"])]

    proc = cli(tmp_path, "--cache-dir", "compiled", "--prune", "--older-than", "30d", "--include-exported")
    assert proc.returncode == 0 and not kept.exists()


def test_cli_dry_run_removes_nothing_and_bad_flags_are_one_line(tmp_path: Path) -> None:
    stale = artifact(tmp_path / "studies" / "cache" / "artifacts", "inductor-a.pt2", INDUCTOR, torch="2.13.0")
    proc = cli(tmp_path, "--prune", "--dry-run")
    assert proc.returncode == 0 and stale.exists()
    assert "would remove 1" in proc.stdout
    proc = cli(tmp_path, "--older-than", "30d")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "Error: --older-than, --include-exported and --dry-run only apply with --prune; add --prune\n"
    proc = cli(tmp_path, "--prune", "--older-than", "soon")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert stale.exists()
    assert "nothing cached here" in cli(tmp_path, "--cache-dir", "elsewhere").stdout


@pytest.mark.parametrize(("described", "why"), [
    ({"knobs": "abc"}, 'knobs: "abc" is not an object'),
    ({"inputs": 5}, "inputs: 5 is not a list"),
    ({"isa": 5}, "isa: 5 is not a list"),
    ({"knobs": {"backend": ["inductor"]}}, "knobs.backend: list is not a string, number, true, false or null"),
    ({"format": None}, "format: null is not a string"),
])
def test_a_description_of_the_wrong_types_is_as_good_as_none(tmp_path: Path, described: dict[str, Any],
                                                             why: str) -> None:
    """It was an internal error of `autotune cache` (a str has no .get, an int is not iterable)."""
    path = artifact(tmp_path / "cache" / "artifacts", "inductor-a.pt2", INDUCTOR)
    Path(f"{path}.json").write_text(json.dumps(json.loads(Path(f"{path}.json").read_text()) | described))
    (entry,) = cache.scan(tmp_path / "cache", HERE)
    assert (entry.kind, entry.model, entry.config) == ("inductor artifact", "?", "?")
    assert entry.unusable == f"its description {path.name}.json cannot be used ({why})"
    assert cache_prune.to_prune([entry], None, time.time(), False) == [entry]  # pruned as unusable, never loaded
    listed = cli(tmp_path, "--cache-dir", "cache", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["entries"][0]["unusable_reason"] == entry.unusable


def test_a_description_that_is_a_named_pipe_is_not_read(tmp_path: Path) -> None:
    """Read, a named pipe with no writer would hang `autotune cache` for good."""
    folder = tmp_path / "cache" / "artifacts"
    folder.mkdir(parents=True)
    (folder / "inductor-a.pt2").write_bytes(b"x" * 1000)
    os.mkfifo(folder / "inductor-a.pt2.json")
    listed = subprocess.run([AUTOTUNE, "cache", "--cache-dir", "cache"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "cannot be used (it is a named pipe (FIFO), not a file)" in " ".join(listed.stdout.split())
    from autotune.model.artifacts import guard_record, remember_guard

    remember_guard(folder / "inductor-a.pt2", "k", {"min_cosine": 0.99})  # nothing read, nothing written
    assert guard_record(folder / "inductor-a.pt2", "k") is None
    assert (folder / "inductor-a.pt2.json").is_fifo()


def test_a_prune_counts_what_it_removed_and_names_what_it_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A read-only cache once said "removed 4, 1.0 kB" after four "cannot remove" notes."""
    folder = tmp_path / "cache" / "artifacts"
    stale = [artifact(folder, f"inductor-{n}.pt2", INDUCTOR, torch="2.13.0") for n in range(4)]
    stuck = {stale[1].name, stale[3].name}
    unlink = Path.unlink

    def refusing(path: Path, missing_ok: bool = False) -> None:
        if path.name in stuck:
            raise PermissionError(1, "Operation not permitted", str(path))
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refusing)
    monkeypatch.chdir(tmp_path)

    def rel(path: Path) -> str:  # as --cache-dir names it
        return str(path.relative_to(tmp_path))

    code, out, err = run_cli(capsys, "cache", "--cache-dir", "cache", "--prune")
    assert code == 2, (out, err)
    assert err == (f"Error: 2 of the 4 entries to prune could not be removed (cannot remove {rel(stale[1])}: Operation "
                   f"not permitted, and 1 more); they are kept: make the cache folder writable for this user, then "
                   f"prune again\n")
    each = 1000 + len(Path(f"{stale[1]}.json").read_bytes())
    size = f"{2 * each / 1024:.1f} kB"
    assert out.splitlines()[-1] == (f"4 entries, {4 * each / 1024:.1f} kB; removed 2, {size}; kept 2 that could not "
                                    f"be removed (Operation not permitted)")
    assert [p.exists() for p in stale] == [False, True, False, True]
    code, out, err = run_cli(capsys, "cache", "--cache-dir", "cache", "--prune", "--json")
    assert code == 2 and err.count("\n") == 1
    data = json.loads(out)
    assert data["removed"] == [] and [k["path"] for k in data["kept"]] == [rel(stale[1]), rel(stale[3])]
    assert data["kept"][0]["reason"] == "Operation not permitted"
    monkeypatch.setattr(Path, "unlink", unlink)
    code, out, err = run_cli(capsys, "cache", "--cache-dir", "cache", "--prune")
    assert (code, err) == (0, "") and out.splitlines()[-1] == f"2 entries, {size}; removed 2, {size}"


@pytest.mark.parametrize("backend", ["openvino", "llamacpp"])
def test_what_text_generation_converts_is_listed_sized_keyed_and_pruned(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str) -> None:
    """A peer's conversion for --task generate, as the measuring child makes it under the cache folder:
    `autotune cache` lists the model's saved folder and what the peer converted from it, with their
    sizes and keys; `--prune --older-than 0d` removes them, descriptions and all."""
    import torch

    from autotune.model import backends, generate, hf

    if not backends.installed(backend, generates=True):
        pytest.skip(backends.not_installed(backend, generates=True))
    torch.manual_seed(0)
    folder = tmp_path / "cache" / "artifacts"
    knobs = ModelKnobs(backend=backend, precision="int8_weight_only")  # type: ignore[arg-type]
    generate.generator(hf.load_causal("hf:qwen2@tiny"), knobs, {}, cache=folder, threads=2)
    capsys.readouterr()  # what the conversion printed (NNCF's progress) is not the command's
    code, out, _ = run_cli(capsys, "cache", "--cache-dir", str(tmp_path / "cache"), "--json")
    assert code == 0
    entries = json.loads(out)["entries"]
    converted = (f"{backend} generation artifact", f"backend={backend} precision=int8_weight_only", "qwen2")
    assert {(cache.SAVED_MODEL, "", "qwen2"), converted} <= {(e["kind"], e["config"], e["model"]) for e in entries}
    assert all(e["size_bytes"] > 1000 and len(e["key"]) == 16 and e["usable"] for e in entries), entries
    code, out, _ = run_cli(capsys, "cache", "--cache-dir", str(tmp_path / "cache"), "--prune", "--older-than", "0d")
    assert code == 0 and list(folder.iterdir()) == []
