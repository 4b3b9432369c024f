"""The commands that use a study's result: export, studies, report, profile, run.

Each is its flags and one call; `autotune.cli.main` puts them on the `autotune` group.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from autotune.base.errors import AutotuneError
from autotune.cli import display, options, result_display
from autotune.cli.common import STUDIES, emit, holding
from autotune.config import evaldata
from autotune.host import machine
from autotune.measure import requests

if TYPE_CHECKING:  # the profile command imports it when it runs: it loads optuna
    from autotune.report.profiling import Profiled, Target

DEFAULT_PROFILED = 20  # forward calls `profile` records per configuration


@click.command(name="export")
@click.argument("path", type=click.Path(path_type=Path))
@options.study_options()
@click.option("--trial", "trial_number", type=int, help="Export this trial instead of the best.")
@click.option("--max-quality-drop", metavar="X",
              help="Export the fastest trial whose quality drop on --eval-data is at most X (accuracy points, or "
                   "percent of perplexity), instead of the confirmed one.")
@click.option("--artifacts", type=click.Path(path_type=Path, file_okay=False),
              help="Compile the configuration once into this folder; autotune.apply loads it from there.")
@options.timeout_option
@options.no_wait_option
@options.json_option
def export_command(path: Path, study_name: str | None, storage: str | None,
                   trial_number: int | None, max_quality_drop: str | None, artifacts: Path | None, timeout: float,
                   no_wait: bool, as_json: bool) -> None:
    """Write the best configuration (or --trial N) as a bash env file to `source`.

    \b
    Example:
      autotune export best.env
      autotune export fast.env --study resnet18-bs1-latency --trial 7
      autotune export best.env --artifacts compiled/
      autotune export within1pt.env --max-quality-drop 1
    """
    from autotune.cli import summaries
    from autotune.deploy import export
    from autotune.study.records import plan_of
    from autotune.study.storage import find_study

    drop = evaldata.parse_drop(max_quality_drop)
    if drop is not None and trial_number is not None:
        raise AutotuneError("give --trial or --max-quality-drop, not both")
    found = find_study(STUDIES, study_name, storage)
    trial = export.fastest_within(found, drop) if drop is not None else export.pick_trial(found, trial_number)
    text = export.render(found, trial, artifacts)
    if artifacts is not None:
        with holding("export", no_wait), display.status(f"compiling trial {trial.number} into {artifacts}"):
            compiled = requests.build_artifacts(plan_of(trial), artifacts, timeout)  # all cores: spoils timings
        if not compiled:
            display.err.print(f"note: trial {trial.number} runs its model as it is; nothing to compile into "
                              f"{artifacts}", markup=False, soft_wrap=True)
    export.write(path, text)
    display.err.print(f"wrote {path}: study {found.study_name}, trial {trial.number} "
                      f"({trial.user_attrs.get('config')})", markup=False, soft_wrap=True)
    verdict = found.user_attrs.get("confirmation")
    if verdict and trial_number is None and drop is None and verdict.get("quality_breach"):
        display.err.print(f"note: the baseline was exported: {verdict['quality_breach']}", markup=False,
                          soft_wrap=True)
    elif verdict and trial_number is None and drop is None and not verdict["significant"]:
        display.err.print(f"note: the baseline was exported: {verdict['message']}", markup=False, soft_wrap=True)
    if as_json:
        emit("export", summaries.exported(path, found, trial, text, artifacts), True, None)


@click.command(name="studies")
@click.option("--storage", help="An Optuna storage URL to list instead of studies/*.db.")
@options.json_option
def studies_command(storage: str | None, as_json: bool) -> None:
    """List the studies: model, objective, trials, best result, confirmation, host.

    \b
    Example:
      autotune studies
      autotune studies --storage sqlite:///elsewhere/resnet18-bs1-latency.db --json
    """
    from autotune.study import catalog

    found = {"folder": str(STUDIES), "studies": catalog.studies(STUDIES, storage)}
    emit("studies", found, as_json, result_display.studies)


@click.command(name="report")
@options.study_options()
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("report.html"), show_default=True,
              help="The HTML file to write (one self-contained page).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of text.")
def report_command(study_name: str | None, storage: str | None, output: Path, as_json: bool) -> None:
    """Write one HTML page that shows why the winner is faster: history, knob importance, marginal
    effects, the confirmation, latency against throughput, failures; print its summary.

    \b
    Example:
      autotune report --study resnext101_32x8d-bs1-latency -o report.html
    """
    from autotune.report import contents, html_page
    from autotune.study.storage import find_study

    html_page.check_output(output)
    gathered = contents.gather(find_study(STUDIES, study_name, storage), STUDIES)
    html_page.write(output, html_page.page(gathered, output.parent))
    emit("report", contents.summary(gathered, output), as_json, result_display.report_summary)


@click.command(name="profile")
@click.argument("env_file", required=False, type=click.Path(path_type=Path, dir_okay=False))
@options.study_options()
@click.option("--trial", "trial_number", type=int, help="Profile this trial instead of the best (confirmed winner).")
@click.option("--baseline/--no-baseline", "with_baseline", default=True, show_default=True,
              help="Also profile the baseline (PyTorch's defaults) and show what changed.")
@click.option("--iterations", default=DEFAULT_PROFILED, show_default=True, type=click.IntRange(min=1),
              help="Forward calls profiled per configuration.")
@click.option("--out", type=click.Path(path_type=Path),
              help="Folder for the traces and profile.json (default: studies/profiles/STUDY/, or "
                   "profiles/NAME/ for NAME.env).")
@options.timeout_option
@options.no_wait_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def profile_command(env_file: Path | None, study_name: str | None, storage: str | None, trial_number: int | None,
                    with_baseline: bool, iterations: int, out: Path | None, timeout: float, no_wait: bool,
                    as_json: bool) -> None:
    """Profile the best trial (or --trial N, or an env file) and the baseline: hot ops, Chrome traces.

    \b
    Example:
      autotune profile --study resnext101_32x8d-bs1-latency
      autotune profile --trial 12 --iterations 50
      autotune profile best.env --no-baseline --out traces/
    """
    from functools import partial

    from autotune.report import profiling

    targets, folder = _profile_targets(env_file, study_name, storage, trial_number, with_baseline)
    profiling.check_out(out or folder)
    with profiling.staging() as staged:
        with holding("profile", no_wait):
            profiled = [_profile_one(target, iterations, staged, timeout, as_json) for target in targets]
        body = profiling.summary(profiled, out or folder)
        profiling.save(profiled, out or folder, display.json_document("profile", body))
    shown = partial(result_display.profile, top=profiling.TOP_OPS, open_with=profiling.OPEN_WITH)
    emit("profile", body, as_json, shown)


def _profile_targets(env_file: Path | None, study_name: str | None, storage: str | None, trial_number: int | None,
                     with_baseline: bool) -> tuple[list[Target], Path]:
    """What to profile, and where its files go by default."""
    from autotune.report import profiling
    from autotune.study.storage import find_study

    if env_file is not None and (trial_number is not None or study_name or storage):
        raise AutotuneError("give ENV_FILE or a study's trial (--trial, --study, --storage), not both")
    if env_file is not None:
        return (profiling.env_file_targets(env_file, machine.this_machine(), with_baseline),
                profiling.env_file_out(env_file))
    found = find_study(STUDIES, study_name, storage)
    return profiling.study_targets(found, trial_number, with_baseline), profiling.study_out(STUDIES, found)


def _profile_one(target: Target, iterations: int, staged: Path, timeout: float, quiet: bool) -> Profiled:
    from autotune.report import profiling

    with display.status(f"profiling {target.label} ({target.config}): {iterations} forward calls", quiet=quiet):
        return profiling.profile(target, iterations, staged, timeout)


@click.command(name="run", context_settings={"ignore_unknown_options": True})
@click.argument("env_file", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_command(env_file: Path, command: tuple[str, ...]) -> None:
    """Run your own command under an exported configuration: env, preloads, instances, binding.

    \b
    Example:
      autotune run best.env -- python serve.py --port 8000
    """
    from autotune.deploy import export, user_run

    loaded = export.read(env_file)
    here = machine.this_machine()
    user_run.check_runnable(loaded, env_file, command[0], here.topology)
    launches = user_run.user_launches(loaded, command, here.libs, dict(os.environ))
    code, warning = user_run.run_checked(loaded, launches)
    if warning:
        display.err.print(warning, markup=False, soft_wrap=True)
    sys.exit(code)
