"""The commands that search and measure against a baseline: search, confirm, compare.

Each is its flags and one call; `autotune.cli.main` puts them on the `autotune` group.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from autotune.base.errors import AutotuneError
from autotune.base.thresholds import CONFIRM_SHARE
from autotune.child.settings import CACHE_DIR
from autotune.cli import display, live, options, verdicts
from autotune.cli.common import EXIT_FAILED, STUDIES, emit, holding, note
from autotune.config import evaldata, knobs, models
from autotune.host import capabilities, machine
from autotune.measure import requests
from autotune.measure.objectives import COMPARABLE, metric_of, min_rounds_two_sided, parse_objective
from autotune.measure.plan import LaunchPlan
from autotune.measure.replicates import WARM_SEARCH_DEFAULT
from autotune.search import opening


@click.command()
@click.option("--model", required=True, help=options.MODEL_HELP)
@click.option("--input-shape", help=options.SHAPE_HELP)
@click.option("--example-inputs", type=click.Path(dir_okay=False), help=options.INPUTS_HELP)
@options.text_options
@click.option("--trials", required=True, type=int,
              help="Total finished trials the study should hold (baseline included; a trial not compiled, "
                   "predicted to lose, measured nothing and does not count); a rerun resumes.")
@click.option("--set", "pins", multiple=True, metavar="KNOB=VALUE",
              help="Pin a knob in every trial (the baseline stays PyTorch's defaults) and search the rest; repeatable.")
@options.duration_option("--time-budget", "Start no trial once it and the confirmation no longer fit in this "
                                          "time (20m, 1.5h); whichever of this and --trials comes first.")
@click.option("--space", "space_spec",
              help="Search space: a name in search_spaces/ or a .yaml path (default: default; generate with "
                   "--task generate).")
@options.study_options("Study name (default: MODEL-bsB-OBJECTIVE).", "Optuna storage URL (default: sqlite:///studies/STUDY.db).")
@click.option("--objective", default="latency", show_default=True,
              help="latency (min p50), throughput (max items/s) or both (Pareto front).")
@click.option("--batch-size", default="1", show_default=True,
              help="Items per forward call; a list like 1,2,4,8 is searched with --objective throughput.")
@click.option("--max-latency-ms", type=options.Finite(),
              help="With --objective throughput: only configurations whose p90 latency stays under this.")
@options.eval_data_option
@click.option("--max-quality-drop", metavar="X",
              help="The most quality a trial may lose against fp32 eager on --eval-data: accuracy points, or percent "
                   "of perplexity (2%). Trials beyond it are kept, shown, and never win.")
@click.option("--max-tpot-ms", type=options.Finite(),
              help="With --task generate: only configurations whose p90 time per output token stays under this.")
@click.option("--seed", type=int,
              help="Seed of the sampler and of the confirmation's round order, for a reproducible run.")
@click.option("--replicates", default=3, show_default=True, type=click.IntRange(min=1),
              help="Measurements per trial; more are added (up to 2, fresh processes) while a trial stays noisy.")
@click.option("--warm-replicates/--fresh-replicates", default=WARM_SEARCH_DEFAULT, show_default=True,
              help="A trial's replicates as consecutive windows of one warmed process (one start, build and "
                   "warmup: docs/noise.md says what that saves and risks), or each in a fresh process. "
                   "Confirmation always uses fresh processes.")
@click.option("--confirm-top", default=3, show_default=True, type=click.IntRange(min=0),
              help="Candidates re-measured against the baseline at the end (0: skip).")
@options.confirm_rounds_option("--confirm-rounds", "that confirmation")
@options.min_effect_option
@click.option("--allow-mixed", is_flag=True,
              help="Let this host join a shared study made on another host class (raw values ranked together, "
                   "each trial's speedup over its own host's baseline recorded); without it such a host is refused.")
@click.option("--no-warm-start", "cold", is_flag=True,
              help="Start a new study cold: without it, its first trials after the baseline measure what won in "
                   "other studies on this host class (other models, batch sizes).")
@options.measure_options
@options.no_wait_option
@options.json_option
def search(model: str, input_shape: str | None, example_inputs: str | None, seq_len: int | None, task: str | None,
           new_tokens: int | None, seq_lens: str | None, seq_len_weights: str | None,
           trials: int, pins: tuple[str, ...],
           time_budget: float | None, space_spec: str | None,
           study_name: str | None, storage: str | None, objective: str, batch_size: str, max_latency_ms: float | None,
           max_tpot_ms: float | None, eval_data: str | None, eval_metric: str | None, eval_direction: str | None,
           max_quality_drop: str | None,
           seed: int | None, replicates: int, warm_replicates: bool, confirm_top: int, confirm_rounds: int,
           min_effect: float, timeout: float, tolerance: float | None, calibration_batches: int | None,
           cache_dir: Path, no_wait: bool, as_json: bool, allow_mixed: bool, cold: bool, **measure: Any) -> None:
    """Search the knobs with Optuna; the first trial is PyTorch's defaults, the baseline.

    \b
    Example:
      autotune search --model resnext101 --trials 50
      autotune search --model resnet18 --trials 10 --space quick --objective throughput
      autotune search --model resnext101 --trials 50 --set backend=eager --time-budget 20m
      autotune search --model hf:./smollm2 --task generate --eval-data book.txt --max-quality-drop 2% --trials 50
    """
    from autotune.config import space
    from autotune.measure.replicates import ReplicatePolicy
    from autotune.search import loop
    from autotune.search.confirm import check_rounds

    started = time.monotonic()
    if confirm_top:
        check_rounds(confirm_rounds, confirm_top, "--confirm-rounds", "--confirm-top")
    sizes = _batch_sizes(batch_size)
    request = opening.SearchRequest(
        model=model, trials=trials, space=space.find(space_spec or ("generate" if task == "generate" else "default")),
        objective=parse_objective(objective),
        batch_size=sizes[0], batch_sizes=sizes if len(sizes) > 1 else (), max_latency_ms=max_latency_ms,
        max_tpot_ms=max_tpot_ms,
        study=study_name, storage=storage, measure=options.settings(**measure),
        replicates=ReplicatePolicy(replicates=replicates, timeout_s=timeout, in_process=warm_replicates),
        cache_dir=cache_dir, seed=seed,
        input_shape=input_shape, example_inputs=example_inputs, seq_len=seq_len, task=task, new_tokens=new_tokens,
        buckets=models.parse_buckets(seq_lens, seq_len_weights), tolerance=tolerance,
        calibration_batches=calibration_batches, command_line=" ".join(["autotune", *sys.argv[1:]]),
        pins=knobs.Config.from_assignments(pins), time_budget_s=time_budget, allow_mixed=allow_mixed,
        confirm_rounds=confirm_rounds if confirm_top else 0, confirm_top=confirm_top,
        eval_data=eval_data, max_quality_drop=evaldata.parse_drop(max_quality_drop), eval_metric=eval_metric,
        eval_direction=eval_direction, warm_start=not cold)
    here = machine.this_machine()
    opening.validate(request, here)  # a bad input is said at once, not after waiting for the machine
    with holding("search", no_wait):
        probe = capabilities.load(cache_dir, len(here.topology.usable_cores), say=note)
        opened = opening.open_search(request, here, check=requests.check_model, probe=probe)
        for line in opened.notes:
            note(line)
        progress = live.SearchProgress(request.objective, replicates=replicates, warm=warm_replicates)
        try:
            stopped = loop.run_search(opened, here, progress, _reporting(progress))
        finally:
            progress.close()
        if stopped:
            display.err.print(f"note: {stopped}", markup=False)
        if not as_json:
            display.search_summary(_search_body(opened, stopped, False))
        confirming, cost = _confirm_after(opened, confirm_top, confirm_rounds, min_effect, timeout, seed, as_json,
                                          time_budget, started)
    if as_json:
        emit("search", _search_body(opened, stopped, confirming, cost), True, None)


def _confirm_after(opened: Any, top: int, rounds: int, min_effect: float, timeout: float, seed: int | None,
                   as_json: bool, time_budget: float | None, started: float) -> tuple[bool, dict[str, Any] | None]:
    """The search's confirmation, when this worker runs it: at most `CONFIRM_SHARE` of the time
    budget past its first look; whether it ran, and what it cost of the command (`started`)."""
    from autotune.cli import summaries
    from autotune.search import fleet

    if not opened.should_confirm(top):
        if top > 0:
            display.err.print("note: nothing new ran, so the stored confirmation stands (`autotune confirm` redoes "
                              "it)")
        return False, None
    if not fleet.claim_confirmation(opened.study, opened.storage):
        display.err.print("note: other workers of this study are still measuring, or one of them confirms: the "
                          "last to stop runs the confirmation (`autotune confirm` runs it now)", markup=False)
        return False, None
    limit_s = CONFIRM_SHARE * time_budget if time_budget is not None else None
    verdict = _confirm(opened.study, top, rounds, min_effect, timeout, seed, as_json, limit_s, opened.request.cache_dir)
    cost = summaries.confirmation_cost(verdict, time.monotonic() - started)
    if not as_json:
        verdicts.cost(cost)
    return True, cost


def _search_body(opened: Any, stopped: str, confirmed_now: bool, cost: dict[str, Any] | None = None) -> dict[str, Any]:
    from autotune.cli import summaries
    from autotune.study.records import best_measured

    return summaries.search(opened.study, opened.storage, best_measured(opened.study)[:5], stopped, confirmed_now,
                            cost)


def _reporting(progress: live.SearchProgress) -> Any:
    """The search's runner, telling the progress line each run and its processes' phases."""
    from autotune.measure.runner import run_plan

    def run(plan: LaunchPlan, timeout_s: float) -> Any:
        progress.run_started()
        return run_plan(plan, timeout_s, on_phase=progress.phase)

    return run


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))  # an empty item ("1,,2") is refused too
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise AutotuneError(f"--batch-size {text!r} is not allowed; give a number like 8 or a list like 1,2,4,8")
    return tuple(dict.fromkeys(sizes))


def _confirm(found: Any, top: int, rounds: int, min_effect: float, timeout: float, seed: int | None,
             as_json: bool, time_limit_s: float | None = None, cache_dir: Path = Path(CACHE_DIR)) -> dict[str, Any]:
    from autotune.host import floor
    from autotune.search import confirm

    here = machine.this_machine()
    verdict = confirm.confirm(found, top, rounds, min_effect, timeout, verdicts.confirm_progress, seed=seed,
                              ran_on=machine.host_identity(here), time_limit_s=time_limit_s,
                              floor=floor.Kept(cache_dir, len(here.topology.usable_cores)))
    if not as_json:
        verdicts.confirmation(verdict)
    return verdict


@click.command(name="confirm")
@options.study_options()
@click.option("--top", default=3, show_default=True, type=click.IntRange(min=1),
              help="Best distinct candidates re-measured against the baseline.")
@options.confirm_rounds_option("--rounds", "the confirmation")
@options.min_effect_option
@options.timeout_option
@options.order_seed_option
@options.no_wait_option
@options.json_option
def confirm_command(study_name: str | None, storage: str | None, top: int, rounds: int, min_effect: float,
                    timeout: float, seed: int | None, no_wait: bool, as_json: bool) -> None:
    """Re-measure the best candidates and the baseline in interleaved rounds until the verdict is
    decided (or --rounds); store it.

    \b
    Example:
      autotune confirm --study resnext101_32x8d-bs1-latency --top 3 --rounds 20
    """
    from autotune.search.confirm import check_rounds
    from autotune.study.storage import find_study

    check_rounds(rounds, top)
    found = find_study(STUDIES, study_name, storage)
    with holding("confirm", no_wait):
        verdict = _confirm(found, top, rounds, min_effect, timeout, seed, as_json)
    if as_json:
        emit("confirm", {"study": found.study_name, **verdict}, True, None)


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


@click.command(name="compare")
@click.argument("first")
@click.argument("second")
@options.study_options()
@options.rounds_option("--rounds", "Interleaved rounds, each configuration once per round in a fresh process")
@click.option("--min-effect", default=0.0, show_default=True, type=options.Finite(min=0, max=10),
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
    from autotune.cli import summaries
    from autotune.measure.runner import run_series
    from autotune.search import compare
    from autotune.search import rounds as interleaved
    from autotune.study.storage import find_study

    metric = metric_of(parse_objective(objective, COMPARABLE))
    if margin is not None and rounds < min_rounds_two_sided():
        raise AutotuneError(f"--rounds {rounds} can never show a slowdown with --fail-if-slower: the smallest "
                            f"two-sided signed-rank p is 2/{2**rounds}; use --rounds {min_rounds_two_sided()} or more")
    plan_config = _config_planner(model, batch_size) if model else None
    pair = compare.distinct([compare.contender_from(spec, lambda: find_study(STUDIES, study_name, storage),
                                                    _plan_from_env_file, plan_config) for spec in (first, second)])
    with holding("compare", no_wait):
        measured = interleaved.interleave(pair, rounds, metric, timeout, run_series, verdicts.confirm_progress, seed)
    if margin is not None:
        _gate(measured, metric, margin, as_json)
    comparison = compare.compared(measured, metric, min_effect)
    emit("compare", summaries.comparison(measured, metric, comparison), as_json,
          lambda _: verdicts.comparison(measured, metric, comparison))
    if comparison is None:
        sys.exit(EXIT_FAILED)


def _gate(measured: Any, metric: Any, margin: float, as_json: bool) -> NoReturn:
    """The regression gate's verdict line and exit code: 1 only for a significant slowdown past the margin."""
    from autotune.cli import summaries
    from autotune.search import compare

    check = compare.regression(measured, metric, margin)
    body = summaries.comparison(measured, metric, compare.compared(measured, metric, 0.0))
    verdict = summaries.gate(check, margin)
    emit("compare", body | {"gate": verdict}, as_json, lambda _: verdicts.regression(measured, metric, check, margin))
    sys.exit(verdict["exit_code"])  # the code the document states, by one rule


def _config_planner(model: str, batch_size: int) -> Any:
    def plan(config: knobs.Config) -> LaunchPlan:
        return requests.make_plan(requests.BenchRequest(model=model, config=config, batch_size=batch_size),
                                  machine.this_machine())

    return plan


def _plan_from_env_file(path: str) -> LaunchPlan:
    from autotune.deploy import export

    return requests.plan_from_exported(export.read(Path(path)).env, machine.this_machine())
