"""The commands about this machine and one configuration: doctor, plan, bench, knobs, models, cache.

Each is its flags and one call; `autotune.cli.main` puts them on the `autotune` group.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from autotune.base.errors import AutotuneError
from autotune.cli import display, knob_display, options
from autotune.cli.common import EXIT_FAILED, emit, holding, note
from autotune.config import knobs, models
from autotune.host import capabilities, floor, machine
from autotune.measure import requests


@click.command()
@options.cache_dir_option
@click.option("--probe", "rerun", is_flag=True,
              help="Measure again what this CPU runs and how fast (the kernel probe), instead of the kept figures.")
@options.no_wait_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def doctor(cache_dir: Path, rerun: bool, no_wait: bool, as_json: bool) -> None:
    """What autotune sees on this machine, which precisions each runtime runs here and how fast.

    The precisions and peaks come from the kernel probe: a convolution and a matmul in every
    precision and runtime, and the memory bandwidth, measured once per host and library versions
    (about 15 s) and kept in the cache folder when nothing else ran meanwhile. The timing floor is
    the spread this host's windows showed with nothing else running, gathered by searches and
    confirmations: a wider window is flagged noisy.

    \b
    Example:
      autotune doctor
      autotune doctor --probe --json
    """
    here = machine.this_machine()
    with holding("doctor", no_wait):
        probe = capabilities.load(cache_dir, len(here.topology.usable_cores), rerun=rerun, say=note)
    spread = floor.here(cache_dir, len(here.topology.usable_cores))
    emit("doctor", machine.report(here) | {"probe": probe.to_json(), "timing_floor": {
        "threshold": spread.threshold, "windows": len(spread.spreads), "described": spread.describe()}},
        as_json, display.doctor)


@click.command()
@options.model_options
@options.calibration_option
@click.option("--lscpu", type=click.Path(path_type=Path, dir_okay=False),
              help="Plan for another machine: a file with its `lscpu --parse=CPU,Core,Socket,Node`.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plan(model: str, assignments: tuple[str, ...], batch_size: int, input_shape: str | None,
         example_inputs: str | None, seq_len: int | None, task: str | None, new_tokens: int | None,
         seq_lens: str | None, seq_len_weights: str | None, calibration_batches: int | None,
         lscpu: Path | None, as_json: bool) -> None:
    """Show what would be launched for a configuration, without running it.

    \b
    Example:
      autotune plan --model resnext101 --set instances=2 --set allocator=jemalloc --json
    """
    request = requests.BenchRequest.from_flags(model, assignments, batch_size, input_shape=input_shape,
                                               example_inputs=example_inputs, seq_len=seq_len, task=task,
                                               new_tokens=new_tokens,
                                               buckets=models.parse_buckets(seq_lens, seq_len_weights),
                                               calibration_batches=calibration_batches)
    target = machine.described_machine(lscpu) if lscpu else machine.this_machine()
    emit("plan", requests.make_plan(request, target).to_json(), as_json, display.plan)


@click.command(name="bench")
@options.model_options
@options.eval_data_option
@options.measure_options
@options.no_wait_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def bench_command(model: str, assignments: tuple[str, ...], batch_size: int, input_shape: str | None,
                  example_inputs: str | None, seq_len: int | None, task: str | None, new_tokens: int | None,
         seq_lens: str | None, seq_len_weights: str | None, cache_dir: Path,
                  as_json: bool, timeout: float, tolerance: float | None, calibration_batches: int | None,
                  no_wait: bool, eval_data: str | None, eval_metric: str | None, eval_direction: str | None,
                  **measure: Any) -> None:
    """Run one configuration once and print latency, throughput and memory (and with --eval-data,
    its quality on your held-out data beside fp32 eager's).

    \b
    Example:
      autotune bench --model resnet18 --set instances=2 --set omp_runtime=intel
      autotune bench --model hf:bert --seq-len 128 --set backend=inductor
      autotune bench --model hf:./smollm2 --task generate --eval-data book.txt --set precision=int4_weight_only
    """
    from autotune.measure import quality
    from autotune.measure.runner import run_plan

    request = requests.BenchRequest.from_flags(model, assignments, batch_size, measure=options.settings(**measure),
                                               cache_dir=cache_dir, input_shape=input_shape,
                                               example_inputs=example_inputs, seq_len=seq_len, task=task,
                                               new_tokens=new_tokens,
                                               buckets=models.parse_buckets(seq_lens, seq_len_weights),
                                               tolerance=tolerance, calibration_batches=calibration_batches,
                                               eval_data=eval_data, eval_metric=eval_metric,
                                               eval_direction=eval_direction)
    here = machine.this_machine()
    launch = requests.make_plan(request, here)
    requests.check_cache_dir(cache_dir)
    with holding("bench", no_wait):
        probe = capabilities.load(cache_dir, len(here.topology.usable_cores), say=note)
        slower = requests.check_runs_here(request, probe)
        if slower:
            note(slower)
        requests.check_model(request, here, timeout)
        with display.status(f"measuring {launch.bench.model} ({request.config.describe()}), "
                            f"{len(launch.instances)} instance(s)", quiet=as_json) as on_phase:
            result = run_plan(launch, timeout, on_phase=on_phase)
        judged = {}
        if launch.bench.judged and result.ok:
            with display.status("judging its quality on the held-out data", quiet=as_json):
                judged = {"quality": quality.measure(launch, "search", timeout)}
    emit("bench", {"plan": launch.to_json(), "result": result.summary(), "bandwidth_gbs": probe.bandwidth_gbs(),
                   **judged}, as_json, display.bench_result)
    if not result.ok:
        sys.exit(EXIT_FAILED)


@click.command(name="knobs")
@click.argument("name", required=False, metavar="[KNOB]")
@click.option("--markdown", is_flag=True, help="Print the whole table as Markdown (what docs/knobs.md holds).")
def knobs_command(name: str | None, markdown: bool) -> None:
    """List the knobs (values, default, what each sets), or one KNOB in full: what it does, when it
    applies, what each value sets.

    \b
    Example:
      autotune knobs
      autotune knobs kmp_affinity
      autotune knobs --markdown > docs/knobs.md
    """
    if name:
        click.echo(knob_display.knob_detail(knobs.knob(name)), nl=False)
    elif markdown:
        click.echo(knob_display.knobs_markdown(knobs.KNOBS.values()), nl=False)
    else:
        knob_display.knobs(tuple(knobs.KNOBS.values()))


@click.command(name="models")
def models_command() -> None:
    """List the model names `--model` accepts, short names included.

    \b
    Example:
      autotune models
    """
    display.models(models.classification_models(), models.ALIASES)


@click.command(name="cache")
@options.cache_dir_option
@click.option("--prune", is_flag=True,
              help="Remove what this torch or CPU can no longer use (and, with --older-than, what nobody used).")
@options.duration_option("--older-than", "With --prune: also remove entries not used for this long (30d, 12h; "
                         "0d: everything).", zero=True)
@click.option("--include-exported", is_flag=True,
              help="With --prune: remove entries that an exported env file in this folder points to, too.")
@click.option("--dry-run", is_flag=True, help="With --prune: show what would be removed, remove nothing.")
@options.no_wait_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def cache_command(cache_dir: Path, prune: bool, older_than: float | None, include_exported: bool, dry_run: bool,
                  no_wait: bool, as_json: bool) -> None:
    """List compiled artifacts and kernels in the cache (size, last used, usable here); --prune cleans.

    \b
    Example:
      autotune cache
      autotune cache --prune --older-than 30d
    """
    from autotune.deploy import cache, cache_prune

    if not prune and (older_than is not None or include_exported or dry_run):
        raise AutotuneError("--older-than, --include-exported and --dry-run only apply with --prune; add --prune")
    exports, notes = cache.exports_in(Path.cwd())
    entries = cache.scan(cache_dir, cache.Here.now(), exports)
    chosen = cache_prune.to_prune(entries, older_than, time.time(), include_exported) if prune else []
    pruned = None
    if chosen and not dry_run:
        with holding("cache --prune", no_wait):  # never delete what a measurement is loading
            pruned = cache_prune.prune(chosen)
    elif prune and not dry_run:
        pruned = cache_prune.Pruned()
    for line in notes:
        note(line)
    removed = chosen if dry_run else pruned.removed if pruned else ()  # with --dry-run: what would go
    failed = [f"cannot remove {e.path}: {why}" for e, why in pruned.kept] if pruned else []
    data = {"cache_dir": str(cache_dir), "entries": [e.to_json() for e in entries], "pruned": prune,
            "dry_run": dry_run, "removed": [str(e.path) for e in removed], "failed": failed,
            "kept": [{"path": str(e.path), "reason": why} for e, why in pruned.kept] if pruned else []}
    emit("cache", data, as_json, lambda _: display.cache(entries, chosen, pruned, time.time()))
    if pruned and pruned.kept:  # the table said which; the exit code and one line say that it failed
        raise AutotuneError(cache_prune.unremoved(pruned))
