"""The `autotune` command: flags in, one function call, output and exit code out.

Exit codes (named in `common.py`), so that a CI job can tell a slower model from a broken tool:
0 success; 1 a measured result failed (a benchmark that ran and failed, a `compare --fail-if-slower`
FAIL, a comparison a failed run prevented); 2 bad input (one `Error:` line); 3 an internal error
(one `Error:` line naming the file in the temporary folder that holds its traceback, `crash.py`;
`--debug` raises it instead); 128 + the signal when stopped: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP.
`autotune run` exits with the code of the program it ran. Standard output or error closed before
autotune starts (a cron job, a daemon): what would go there is discarded and the code is the
command's own; one that cannot be written (`> /dev/full`, a reader gone): 1, with one line on
standard error where it can still be written (`streams.py`).
The commands live by what they are about: `cmd_machine.py`, `cmd_search.py`, `cmd_result.py`.
"""

from __future__ import annotations

import errno
import signal
import sys
from typing import NoReturn

import click

from autotune.base import tempdirs
from autotune.base.errors import FREE_DISK, AutotuneError, Interrupted, RunFailed
from autotune.cli import cmd_machine, cmd_result, cmd_search, crash, streams
from autotune.cli.common import EXIT_FAILED, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE
from autotune.model.errors import ApplyError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
def cli(debug: bool) -> None:
    """Find the fastest way to run a PyTorch model for inference on this CPU.

    \b
    Example:
      autotune doctor
      autotune plan --model resnext101 --set instances=2
      autotune bench --model resnet18 --set allocator=jemalloc

    \b
    Exit codes:
      0      success
      1      a measured result failed: a benchmark that ran and failed,
             a `compare --fail-if-slower` FAIL, a comparison a failed run prevented
      2      bad input: one `Error:` line says what to fix
      3      an internal error: one `Error:` line names the file in the
             temporary folder that holds its traceback; please report it
      128+N  stopped by signal N: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP
      `autotune run` exits with the code of the program it ran.
      Output that cannot be written (a full disk, a reader gone) is 1; a
      standard output closed before autotune starts is discarded.
    """


# each command from the module it lives in; `autotune --help` lists them by name
for _command in (cmd_machine.doctor, cmd_machine.plan, cmd_machine.bench_command, cmd_search.search,
                 cmd_search.confirm_command, cmd_search.compare_command, cmd_result.export_command,
                 cmd_result.studies_command, cmd_result.report_command, cmd_result.profile_command,
                 cmd_result.run_command, cmd_machine.knobs_command, cmd_machine.models_command,
                 cmd_machine.cache_command):
    cli.add_command(_command)


def _raise_interrupt(signum: int, frame: object) -> NoReturn:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point: every failure as one `Error:` line and its exit code; `--debug` re-raises."""
    args = sys.argv[1:] if argv is None else argv
    streams.guard()
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)  # a closed terminal stops the children too
    tempdirs.remove_orphans()
    try:
        code = cli.main(args=args, prog_name="autotune", standalone_mode=False)
    except click.exceptions.Abort as exc:  # click turns a KeyboardInterrupt into Abort
        code = _interrupted(exc.__context__)
    except KeyboardInterrupt as exc:
        code = _interrupted(exc)
    except click.ClickException as exc:
        code = _fail(exc.format_message() + _help_hint(exc), EXIT_USAGE)
    except streams.OutputFailed as exc:
        streams.discard(exc.stream)
        code = _fail(str(exc), EXIT_FAILED)
    except (AutotuneError, ApplyError) as exc:
        if "--debug" in args:
            raise
        code = _fail(str(exc), EXIT_USAGE)
    except RunFailed as exc:
        code = _fail(str(exc), EXIT_FAILED)
    except Exception as exc:  # a bug or an unexpected outside failure: one line naming its report, unless --debug
        if "--debug" in args:
            raise
        full = _disk_full(exc) if isinstance(exc, OSError) else ""
        code = _fail(full, EXIT_FAILED) if full else _fail(crash.error_line(exc, args), EXIT_INTERNAL)
    streams.settle()
    sys.exit(code if isinstance(code, int) else EXIT_OK)


def _disk_full(exc: OSError) -> str:
    """A full disk (or quota) is the machine's state, not a bug: what to free, instead of a crash report
    that could not be written there either."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return ""
    where = f" writing {exc.filename}" if exc.filename else ""
    return f"no space left on the disk{where}; {FREE_DISK} and run again"


def _help_hint(exc: click.ClickException) -> str:
    ctx = getattr(exc, "ctx", None)
    return f" (see `{ctx.command_path} --help`)" if ctx is not None else ""


def _fail(message: str, code: int) -> int:
    try:
        click.echo(f"Error: {message}", err=True)
    except streams.OutputFailed:
        streams.discard("stderr")  # nowhere to say it: the exit code alone tells
    return code


def _interrupted(cause: BaseException | None) -> int:
    stop = cause if isinstance(cause, Interrupted) else Interrupted()  # a plain one is Ctrl-C
    click.echo(f"{stop.reason[0].upper()}{stop.reason[1:]}: every benchmark process was stopped.", err=True)
    return stop.exit_code
