"""The `autotune` command: flags in, one function call, output and exit code out.

Exit codes: 0 success; 1 a benchmark ran and failed; 2 bad input (one `Error:` line);
130 interrupted.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from autotune import bench, display, knobs, machine, models
from autotune.errors import AutotuneError

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
def cli(debug: bool) -> None:
    """Find the fastest way to run a PyTorch model for inference on this CPU.

    \b
    Example:
      autotune doctor
      autotune plan --model resnext101 --set instances=2
      autotune bench --model resnet18 --set allocator=jemalloc
    """


def _model_options(func: Any) -> Any:
    func = click.option("--batch-size", default=1, show_default=True, type=int,
                        help="Items per forward call.")(func)
    func = click.option("--set", "assignments", multiple=True, metavar="KNOB=VALUE",
                        help="Set a knob (repeatable); `autotune knobs` lists them.")(func)
    func = click.option("--model", required=True,
                        help="torchvision classification model, e.g. resnext101.")(func)
    return func


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def doctor(as_json: bool) -> None:
    """What autotune sees on this machine and which knobs it can use.

    \b
    Example:
      autotune doctor --json
    """
    report = machine.report(machine.this_machine())
    _emit(report, as_json, display.doctor)


@cli.command()
@_model_options
@click.option("--lscpu", type=click.Path(path_type=Path, dir_okay=False),
              help="Plan for another machine: a file with its `lscpu --parse=CPU,Core,Socket,Node`.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plan(model: str, assignments: tuple[str, ...], batch_size: int, lscpu: Path | None,
         as_json: bool) -> None:
    """Show what would be launched for a configuration, without running it.

    \b
    Example:
      autotune plan --model resnext101 --set instances=2 --set allocator=jemalloc --json
    """
    request = bench.BenchRequest.from_flags(model, assignments, batch_size)
    target = machine.described_machine(lscpu) if lscpu else machine.this_machine()
    _emit(bench.make_plan(request, target).to_json(), as_json, display.plan)


@cli.command(name="bench")
@_model_options
@click.option("--duration", default=5.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds of the common measuring window.")
@click.option("--warmup", default=3, show_default=True, type=click.IntRange(min=0),
              help="Untimed iterations before the barrier.")
@click.option("--timeout", default=900.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds before a run is killed and recorded as failed.")
@click.option("--cache-dir", default=Path("studies/cache"), show_default=True,
              type=click.Path(path_type=Path, file_okay=False), help="Where weight caches live.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def bench_command(model: str, assignments: tuple[str, ...], batch_size: int, duration: float,
                  warmup: int, timeout: float, cache_dir: Path, as_json: bool) -> None:
    """Run one configuration and print latency, throughput and memory.

    \b
    Example:
      autotune bench --model resnet18 --set instances=2 --set omp_runtime=intel
    """
    request = bench.BenchRequest.from_flags(model, assignments, batch_size, duration_s=duration,
                                            warmup=warmup, cache_dir=cache_dir)
    launch = bench.make_plan(request, machine.this_machine())
    with display.status(f"measuring {launch.bench.model} ({request.config.describe()}), "
                        f"{len(launch.instances)} instance(s)", quiet=as_json):
        result = bench.run(launch, timeout)
    _emit({"plan": launch.to_json(), "result": result.summary()}, as_json, display.bench)
    if not result.ok:
        sys.exit(EXIT_FAILED)


@cli.command(name="knobs")
def knobs_command() -> None:
    """List every knob with its allowed values and what it changes.

    \b
    Example:
      autotune knobs
    """
    display.knobs(knobs.KNOBS.values())


@cli.command(name="models")
def models_command() -> None:
    """List the model names `--model` accepts, short names included.

    \b
    Example:
      autotune models
    """
    display.models(models.classification_models(), models.ALIASES)


def _emit(data: dict[str, Any], as_json: bool, render: Any) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        render(data)


def _raise_interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point: one `Error:` line and exit code 2 for every bad input; `--debug` re-raises."""
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        code = cli.main(args=args, prog_name="autotune", standalone_mode=False)
    except click.exceptions.Abort:
        code = _interrupted()
    except KeyboardInterrupt:
        code = _interrupted()
    except click.ClickException as exc:
        code = _fail(exc.format_message() + _help_hint(exc), EXIT_USAGE)
    except AutotuneError as exc:
        if "--debug" in args:
            raise
        code = _fail(str(exc), EXIT_USAGE)
    sys.exit(code if isinstance(code, int) else 0)


def _help_hint(exc: click.ClickException) -> str:
    ctx = getattr(exc, "ctx", None)
    return f" (see `{ctx.command_path} --help`)" if ctx is not None else ""


def _fail(message: str, code: int) -> int:
    click.echo(f"Error: {message}", err=True)
    return code


def _interrupted() -> int:
    click.echo("Interrupted: every benchmark process was stopped.", err=True)
    return EXIT_INTERRUPTED
