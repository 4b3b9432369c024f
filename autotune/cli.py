"""The `autotune` command: flags in, one function call, output and exit code out.

Exit codes: 0 success; 1 a benchmark ran and failed; 2 bad input (one `Error:` line);
128 + the signal when stopped: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from autotune import display, knobs, machine, models, options, planning, tempdirs
from autotune.child.errors import ApplyError
from autotune.errors import AutotuneError, Interrupted, RunFailed
from autotune.launch import LaunchPlan
from autotune.lock import machine_lock
from autotune.objectives import COMPARABLE, metric_of, min_rounds_two_sided, parse_objective
from autotune.replicates import WARM_SEARCH_DEFAULT

if TYPE_CHECKING:  # the profile command imports it when it runs: it loads optuna
    from autotune.profiling import Profiled, Target

EXIT_FAILED, EXIT_USAGE = 1, 2
STUDIES = Path("studies")
DEFAULT_PROFILED = 20  # forward calls `profile` records per configuration


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


def _holding(command: str, no_wait: bool) -> AbstractContextManager[None]:
    """The machine to ourselves while measuring: one benchmark per machine at a time."""
    return machine_lock(command, wait=not no_wait,
                        say=lambda line: display.err.print(line, markup=False, soft_wrap=True))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def doctor(as_json: bool) -> None:
    """What autotune sees on this machine and which knobs it can use.

    \b
    Example:
      autotune doctor --json
    """
    _emit("doctor", machine.report(machine.this_machine()), as_json, display.doctor)


@cli.command()
@options.model_options
@options.calibration_option
@click.option("--lscpu", type=click.Path(path_type=Path, dir_okay=False),
              help="Plan for another machine: a file with its `lscpu --parse=CPU,Core,Socket,Node`.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plan(model: str, assignments: tuple[str, ...], batch_size: int, input_shape: str | None,
         example_inputs: str | None, calibration_batches: int | None, lscpu: Path | None, as_json: bool) -> None:
    """Show what would be launched for a configuration, without running it.

    \b
    Example:
      autotune plan --model resnext101 --set instances=2 --set allocator=jemalloc --json
    """
    request = planning.BenchRequest.from_flags(model, assignments, batch_size, input_shape=input_shape,
                                               example_inputs=example_inputs, calibration_batches=calibration_batches)
    target = machine.described_machine(lscpu) if lscpu else machine.this_machine()
    _emit("plan", planning.make_plan(request, target).to_json(), as_json, display.plan)


@cli.command(name="bench")
@options.model_options
@options.measure_options
@options.no_wait_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def bench_command(model: str, assignments: tuple[str, ...], batch_size: int, input_shape: str | None,
                  example_inputs: str | None, cache_dir: Path, as_json: bool, timeout: float,
                  tolerance: float | None, calibration_batches: int | None, no_wait: bool, **measure: Any) -> None:
    """Run one configuration once and print latency, throughput and memory.

    \b
    Example:
      autotune bench --model resnet18 --set instances=2 --set omp_runtime=intel
    """
    from autotune.orchestrate import run_plan

    request = planning.BenchRequest.from_flags(model, assignments, batch_size, measure=options.settings(**measure),
                                               cache_dir=cache_dir, input_shape=input_shape,
                                               example_inputs=example_inputs, tolerance=tolerance,
                                               calibration_batches=calibration_batches)
    here = machine.this_machine()
    launch = planning.make_plan(request, here)
    with _holding("bench", no_wait):
        planning.check_model(request, here, timeout)
        with display.status(f"measuring {launch.bench.model} ({request.config.describe()}), "
                            f"{len(launch.instances)} instance(s)", quiet=as_json) as on_phase:
            result = run_plan(launch, timeout, on_phase=on_phase)
    _emit("bench", {"plan": launch.to_json(), "result": result.summary()}, as_json, display.bench_result)
    if not result.ok:
        sys.exit(EXIT_FAILED)


@cli.command()
@click.option("--model", required=True, help=options.MODEL_HELP)
@click.option("--input-shape", help=options.SHAPE_HELP)
@click.option("--example-inputs", type=click.Path(dir_okay=False), help=options.INPUTS_HELP)
@click.option("--trials", required=True, type=int,
              help="Total finished trials the study should hold (baseline included); a rerun resumes.")
@click.option("--set", "pins", multiple=True, metavar="KNOB=VALUE",
              help="Pin a knob in every trial (the baseline stays PyTorch's defaults) and search the rest; repeatable.")
@options.duration_option("--time-budget", "Start no trial once it and the confirmation no longer fit in this "
                                          "time (20m, 1.5h); whichever of this and --trials comes first.")
@click.option("--space", "space_spec", default="default", show_default=True,
              help="Search space: a name in search_spaces/ or a .yaml path.")
@options.study_options("Study name (default: MODEL-bsB-OBJECTIVE).", "Optuna storage URL (default: sqlite:///studies/STUDY.db).")
@click.option("--objective", default="latency", show_default=True,
              help="latency (min p50), throughput (max items/s) or both (Pareto front).")
@click.option("--batch-size", default="1", show_default=True,
              help="Items per forward call; a list like 1,2,4,8 is searched with --objective throughput.")
@click.option("--max-latency-ms", type=float,
              help="With --objective throughput: only configurations whose p90 latency stays under this.")
@click.option("--seed", type=int,
              help="Seed of the sampler and of the confirmation's round order, for a reproducible run.")
@click.option("--replicates", default=3, show_default=True, type=click.IntRange(min=1),
              help="Measurements per trial; more are added (up to 2, fresh processes) while a trial stays noisy.")
@click.option("--warm-replicates/--fresh-replicates", default=WARM_SEARCH_DEFAULT, show_default=True,
              help="A trial's replicates as consecutive windows of one warmed process (one start, build and "
                   "warmup: see README for what that saves and risks), or each in a fresh process. "
                   "Confirmation always uses fresh processes.")
@click.option("--confirm-top", default=3, show_default=True, type=click.IntRange(min=0),
              help="Candidates re-measured against the baseline at the end (0: skip).")
@options.rounds_option("--confirm-rounds", "Interleaved rounds of that confirmation")
@options.min_effect_option
@click.option("--allow-mixed", is_flag=True,
              help="Let this host join a shared study made on another host class (raw values ranked together, "
                   "each trial's speedup over its own host's baseline recorded); without it such a host is refused.")
@options.measure_options
@options.no_wait_option
@options.json_option
def search(model: str, input_shape: str | None, example_inputs: str | None, trials: int, pins: tuple[str, ...],
           time_budget: float | None, space_spec: str,
           study_name: str | None, storage: str | None, objective: str, batch_size: str, max_latency_ms: float | None,
           seed: int | None, replicates: int, warm_replicates: bool, confirm_top: int, confirm_rounds: int,
           min_effect: float, timeout: float, tolerance: float | None, calibration_batches: int | None,
           cache_dir: Path, no_wait: bool, as_json: bool, allow_mixed: bool, **measure: Any) -> None:
    """Search the knobs with Optuna; trial 0 is PyTorch's defaults, the baseline.

    \b
    Example:
      autotune search --model resnext101 --trials 50
      autotune search --model resnet18 --trials 10 --space quick --objective throughput
      autotune search --model resnext101 --trials 50 --set backend=eager --time-budget 20m
    """
    from autotune import search_loop, space
    from autotune.confirm import check_rounds
    from autotune.replicates import ReplicatePolicy

    if confirm_top:
        check_rounds(confirm_rounds, confirm_top, "--confirm-rounds", "--confirm-top")
    sizes = _batch_sizes(batch_size)
    request = search_loop.SearchRequest(
        model=model, trials=trials, space=space.find(space_spec), objective=parse_objective(objective),
        batch_size=sizes[0], batch_sizes=sizes if len(sizes) > 1 else (), max_latency_ms=max_latency_ms,
        study=study_name, storage=storage, measure=options.settings(**measure),
        replicates=ReplicatePolicy(replicates=replicates, timeout_s=timeout, in_process=warm_replicates),
        cache_dir=cache_dir, seed=seed,
        input_shape=input_shape, example_inputs=example_inputs, tolerance=tolerance,
        calibration_batches=calibration_batches, command_line=" ".join(["autotune", *sys.argv[1:]]),
        pins=knobs.Config.from_assignments(pins), time_budget_s=time_budget, allow_mixed=allow_mixed,
        confirm_processes=(confirm_top + 1) * confirm_rounds if confirm_top else 0)
    here = machine.this_machine()
    search_loop.validate(request, here)  # a bad input is said at once, not after waiting for the machine
    with _holding("search", no_wait):
        opened = search_loop.open_search(request, here, check=planning.check_model)
        for note in opened.notes:
            display.err.print(f"note: {note}", markup=False)
        progress = display.SearchProgress(request.objective, replicates=replicates, warm=warm_replicates)
        try:
            stopped = search_loop.run_search(opened, here, progress, _reporting(progress))
        finally:
            progress.close()
        if stopped:
            display.err.print(f"note: {stopped}", markup=False)
        if not as_json:
            display.search_summary(_search_body(opened, stopped, False))
        confirming = opened.should_confirm(confirm_top)
        if confirming:
            _confirm(opened.study, confirm_top, confirm_rounds, min_effect, timeout, seed, as_json)
        elif confirm_top > 0:
            display.err.print("note: nothing new ran, so the stored confirmation stands (`autotune confirm` redoes "
                              "it)")
    if as_json:
        _emit("search", _search_body(opened, stopped, confirming), True, None)


def _search_body(opened: Any, stopped: str, confirmed_now: bool) -> dict[str, Any]:
    from autotune import summaries
    from autotune.records import best_measured

    return summaries.search(opened.study, opened.storage, best_measured(opened.study)[:5], stopped, confirmed_now)


def _reporting(progress: display.SearchProgress) -> Any:
    """The search's runner, telling the progress line each run and its processes' phases."""
    from autotune.orchestrate import run_plan

    def run(plan: LaunchPlan, timeout_s: float) -> Any:
        progress.run_started()
        return run_plan(plan, timeout_s, on_phase=progress.phase)

    return run


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise AutotuneError(f"--batch-size {text!r} is not allowed; give a number like 8 or a list like 1,2,4,8")
    return tuple(dict.fromkeys(sizes))


def _confirm(found: Any, top: int, rounds: int, min_effect: float, timeout: float, seed: int | None,
             as_json: bool) -> dict[str, Any]:
    from autotune import confirm

    verdict = confirm.confirm(found, top, rounds, min_effect, timeout, display.confirm_progress, seed=seed,
                              ran_on=machine.host_identity(machine.this_machine()))
    if not as_json:
        display.confirmation(verdict)
    return verdict


@cli.command(name="confirm")
@options.study_options()
@click.option("--top", default=3, show_default=True, type=click.IntRange(min=1),
              help="Best distinct candidates re-measured against the baseline.")
@options.rounds_option("--rounds", "Interleaved rounds, each contender once per round in a fresh process")
@options.min_effect_option
@options.timeout_option
@options.order_seed_option
@options.no_wait_option
@options.json_option
def confirm_command(study_name: str | None, storage: str | None, top: int, rounds: int, min_effect: float,
                    timeout: float, seed: int | None, no_wait: bool, as_json: bool) -> None:
    """Re-measure the best candidates and the baseline in interleaved rounds; store the verdict.

    \b
    Example:
      autotune confirm --study resnext101_32x8d-bs1-latency --top 3 --rounds 10
    """
    from autotune.confirm import check_rounds
    from autotune.storage import find_study

    check_rounds(rounds, top)
    found = find_study(STUDIES, study_name, storage)
    with _holding("confirm", no_wait):
        verdict = _confirm(found, top, rounds, min_effect, timeout, seed, as_json)
    if as_json:
        _emit("confirm", {"study": found.study_name, **verdict}, True, None)


def _margin(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """`5%` or `5` (percent) as 0.05."""
    if value is None:
        return None
    try:
        percent = float(value.strip().removesuffix("%"))
    except ValueError:
        percent = float("nan")
    if not 0 <= percent < 100:
        raise AutotuneError(f"--fail-if-slower {value!r} is not a margin; give a percentage from 0 to 100, like 5%")
    return percent / 100


@cli.command(name="compare")
@click.argument("first")
@click.argument("second")
@options.study_options()
@options.rounds_option("--rounds", "Interleaved rounds, each configuration once per round in a fresh process")
@click.option("--min-effect", default=0.0, show_default=True, type=click.FloatRange(min=0, max=10),
              help="Gain the test must exceed to call SECOND faster.")
@click.option("--objective", default="latency", show_default=True, help="latency (p50) or throughput.")
@click.option("--fail-if-slower", "margin", callback=_margin, metavar="PCT",
              help="A CI gate: exit 1 when SECOND is slower than FIRST by more than PCT (like 5%), two-sided "
                   "test at the 5% level; exit 0 otherwise.")
@click.option("--model", help="The model, when FIRST or SECOND is a configuration (`defaults`, `KNOB=V,KNOB=V`).")
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1),
              help="Batch size, when FIRST or SECOND is a configuration.")
@options.timeout_option
@options.order_seed_option
@options.no_wait_option
@options.json_option
def compare_command(first: str, second: str, study_name: str | None, storage: str | None, rounds: int,
                    min_effect: float, objective: str, margin: float | None, model: str | None, batch_size: int,
                    timeout: float, seed: int | None, no_wait: bool, as_json: bool) -> None:
    """Measure two configurations (trial numbers, env files or knobs) the same way; SECOND over FIRST.

    \b
    Example:
      autotune compare 0 12 --study resnet18-bs1-latency
      autotune compare baseline.env best.env --rounds 20
      autotune compare deployed.env deployed.env --fail-if-slower 5%   # after upgrading torch
      autotune compare defaults backend=inductor,precision=bf16 --model resnet18
    """
    from autotune import confirm, summaries
    from autotune.orchestrate import run_plan
    from autotune.storage import find_study

    metric = metric_of(parse_objective(objective, COMPARABLE))
    if margin is not None and rounds < min_rounds_two_sided():
        raise AutotuneError(f"--rounds {rounds} can never show a slowdown with --fail-if-slower: the smallest "
                            f"two-sided signed-rank p is 2/{2**rounds}; use --rounds {min_rounds_two_sided()} or more")
    plan_config = _config_planner(model, batch_size) if model else None
    pair = confirm.distinct([confirm.contender_from(spec, lambda: find_study(STUDIES, study_name, storage),
                                                    _plan_from_env_file, plan_config) for spec in (first, second)])
    with _holding("compare", no_wait):
        measured = confirm.interleave(pair, rounds, metric, timeout, run_plan, display.confirm_progress, seed)
    if margin is not None:
        _gate(measured, metric, margin, as_json)
    comparison = confirm.compared(measured, metric, min_effect)
    _emit("compare", summaries.comparison(measured, metric, comparison), as_json,
          lambda _: display.comparison(measured, metric, comparison))
    if comparison is None:
        sys.exit(EXIT_FAILED)


def _gate(measured: Any, metric: Any, margin: float, as_json: bool) -> NoReturn:
    """The regression gate's verdict line and exit code: 1 only for a significant slowdown past the margin."""
    from autotune import confirm, summaries

    check = confirm.regression(measured, metric, margin)
    body = summaries.comparison(measured, metric, confirm.compared(measured, metric, 0.0))
    _emit("compare", body | {"gate": summaries.gate(check, margin)}, as_json,
          lambda _: display.regression(measured, metric, check, margin))
    sys.exit(EXIT_FAILED if check is None or check.slower_than_margin else 0)


def _config_planner(model: str, batch_size: int) -> Any:
    def plan(config: knobs.Config) -> LaunchPlan:
        return planning.make_plan(planning.BenchRequest(model=model, config=config, batch_size=batch_size),
                                  machine.this_machine())

    return plan


def _plan_from_env_file(path: str) -> LaunchPlan:
    from autotune import export

    return planning.plan_from_exported(export.read(Path(path)).env, machine.this_machine())


@cli.command(name="export")
@click.argument("path", type=click.Path(path_type=Path))
@options.study_options()
@click.option("--trial", "trial_number", type=int, help="Export this trial instead of the best.")
@click.option("--artifacts", type=click.Path(path_type=Path, file_okay=False),
              help="Compile the configuration once into this folder; autotune.apply loads it from there.")
@options.timeout_option
@options.no_wait_option
@options.json_option
def export_command(path: Path, study_name: str | None, storage: str | None,
                   trial_number: int | None, artifacts: Path | None, timeout: float, no_wait: bool,
                   as_json: bool) -> None:
    """Write the best configuration (or --trial N) as a bash env file to `source`.

    \b
    Example:
      autotune export best.env
      autotune export fast.env --study resnet18-bs1-latency --trial 7
      autotune export best.env --artifacts compiled/
    """
    from autotune import export, summaries
    from autotune.records import plan_of
    from autotune.storage import find_study

    found = find_study(STUDIES, study_name, storage)
    trial = export.pick_trial(found, trial_number)
    text = export.render(found, trial, artifacts)
    if artifacts is not None:
        with _holding("export", no_wait), display.status(f"compiling trial {trial.number} into {artifacts}"):
            compiled = planning.build_artifacts(plan_of(trial), artifacts, timeout)  # all cores: spoils timings
        if not compiled:
            display.err.print(f"note: trial {trial.number} runs its model as it is; nothing to compile into "
                              f"{artifacts}", markup=False, soft_wrap=True)
    export.write(path, text)
    display.err.print(f"wrote {path}: study {found.study_name}, trial {trial.number} "
                      f"({trial.user_attrs.get('config')})", markup=False, soft_wrap=True)
    verdict = found.user_attrs.get("confirmation")
    if verdict and trial_number is None and not verdict["significant"]:
        display.err.print(f"note: the baseline was exported: {verdict['message']}", markup=False, soft_wrap=True)
    if as_json:
        _emit("export", summaries.exported(path, found, trial, text, artifacts), True, None)


@cli.command(name="studies")
@click.option("--storage", help="An Optuna storage URL to list instead of studies/*.db.")
@options.json_option
def studies_command(storage: str | None, as_json: bool) -> None:
    """List the studies: model, objective, trials, best result, confirmation, host.

    \b
    Example:
      autotune studies
      autotune studies --storage sqlite:///elsewhere/resnet18-bs1-latency.db --json
    """
    from autotune import catalog

    _emit("studies", {"folder": str(STUDIES), "studies": catalog.studies(STUDIES, storage)}, as_json, display.studies)


@cli.command(name="report")
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
    from autotune import report, report_html
    from autotune.storage import find_study

    report_html.check_output(output)
    gathered = report.gather(find_study(STUDIES, study_name, storage), STUDIES)
    report_html.write(output, report_html.page(gathered, output.parent))
    _emit("report", report.summary(gathered, output), as_json, display.report_summary)


@cli.command(name="profile")
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

    from autotune import profiling

    targets, folder = _profile_targets(env_file, study_name, storage, trial_number, with_baseline)
    profiling.check_out(out or folder)
    with profiling.staging() as staged:
        with _holding("profile", no_wait):
            profiled = [_profile_one(target, iterations, staged, timeout, as_json) for target in targets]
        body = profiling.summary(profiled, out or folder)
        profiling.save(profiled, out or folder, display.json_document("profile", body))
    _emit("profile", body, as_json, partial(display.profile, top=profiling.TOP_OPS, open_with=profiling.OPEN_WITH))


def _profile_targets(env_file: Path | None, study_name: str | None, storage: str | None, trial_number: int | None,
                     with_baseline: bool) -> tuple[list[Target], Path]:
    """What to profile, and where its files go by default."""
    from autotune import profiling
    from autotune.storage import find_study

    if env_file is not None and (trial_number is not None or study_name or storage):
        raise AutotuneError("give ENV_FILE or a study's trial (--trial, --study, --storage), not both")
    if env_file is not None:
        return (profiling.env_file_targets(env_file, machine.this_machine(), with_baseline),
                profiling.env_file_out(env_file))
    found = find_study(STUDIES, study_name, storage)
    return profiling.study_targets(found, trial_number, with_baseline), profiling.study_out(STUDIES, found)


def _profile_one(target: Target, iterations: int, staged: Path, timeout: float, quiet: bool) -> Profiled:
    from autotune import profiling

    with display.status(f"profiling {target.label} ({target.config}): {iterations} forward calls", quiet=quiet):
        return profiling.profile(target, iterations, staged, timeout)


@cli.command(name="run", context_settings={"ignore_unknown_options": True})
@click.argument("env_file", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_command(env_file: Path, command: tuple[str, ...]) -> None:
    """Run your own command under an exported configuration: env, preloads, instances, binding.

    \b
    Example:
      autotune run best.env -- python serve.py --port 8000
    """
    from autotune import export, userrun

    loaded = export.read(env_file)
    here = machine.this_machine()
    userrun.check_runnable(loaded, env_file, command[0], here.topology)
    launches = userrun.user_launches(loaded, command, here.libs, dict(os.environ))
    code, warning = userrun.run_checked(loaded, launches)
    if warning:
        display.err.print(warning, markup=False, soft_wrap=True)
    sys.exit(code)


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


@cli.command(name="cache")
@options.cache_dir_option
@click.option("--prune", is_flag=True,
              help="Remove what this torch or CPU can no longer use (and, with --older-than, what nobody used).")
@options.duration_option("--older-than", "With --prune: also remove entries not used for this long (30d, 12h).")
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
    from autotune import cache

    if not prune and (older_than is not None or include_exported or dry_run):
        raise AutotuneError("--older-than, --include-exported and --dry-run only apply with --prune; add --prune")
    exports, notes = cache.exports_in(Path.cwd())
    entries = cache.scan(cache_dir, cache.Here.now(), exports)
    chosen = cache.to_prune(entries, older_than, time.time(), include_exported) if prune else []
    failed = []
    if chosen and not dry_run:
        with _holding("cache --prune", no_wait):  # never delete what a measurement is loading
            failed = [why for why in map(cache.remove, chosen) if why]
    for note in notes + failed:
        display.err.print(f"note: {note}", markup=False, soft_wrap=True)
    data = {"cache_dir": str(cache_dir), "entries": [e.to_json() for e in entries], "pruned": prune,
            "dry_run": dry_run, "removed": [str(e.path) for e in chosen], "failed": failed}
    _emit("cache", data, as_json, lambda _: display.cache(entries, chosen, prune and not dry_run, time.time()))
    if failed:
        sys.exit(EXIT_FAILED)


def _emit(kind: str, data: dict[str, Any], as_json: bool, render: Any) -> None:
    if as_json:
        click.echo(json.dumps(display.json_document(kind, data), indent=2, default=str))
    else:
        render(data)


def _raise_interrupt(signum: int, frame: object) -> NoReturn:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point: one `Error:` line and exit code 2 for every bad input; `--debug` re-raises."""
    args = sys.argv[1:] if argv is None else argv
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
    except (AutotuneError, ApplyError) as exc:
        if "--debug" in args:
            raise
        code = _fail(str(exc), EXIT_USAGE)
    except RunFailed as exc:
        code = _fail(str(exc), EXIT_FAILED)
    except Exception as exc:  # a bug or an unexpected outside failure: still one line, unless --debug
        if "--debug" in args:
            raise
        code = _fail(f"unexpected {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
                     "rerun with --debug for the traceback and report it", EXIT_FAILED)
    sys.exit(code if isinstance(code, int) else 0)


def _help_hint(exc: click.ClickException) -> str:
    ctx = getattr(exc, "ctx", None)
    return f" (see `{ctx.command_path} --help`)" if ctx is not None else ""


def _fail(message: str, code: int) -> int:
    click.echo(f"Error: {message}", err=True)
    return code


def _interrupted(cause: BaseException | None) -> int:
    stop = cause if isinstance(cause, Interrupted) else Interrupted()  # a plain one is Ctrl-C
    click.echo(f"{stop.reason[0].upper()}{stop.reason[1:]}: every benchmark process was stopped.", err=True)
    return stop.exit_code
