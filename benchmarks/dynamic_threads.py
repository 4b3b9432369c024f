"""One inductor artifact for every thread count, or one per thread count: is the shared one as fast?

Before, autotune compiled an AOTInductor artifact per thread count: inductor wrote the compiling
process's count into its kernels (`#pragma omp parallel num_threads(N)`, no parallel loops at all
for 1), and a search paid a 35-90 s compile for each (precision, layout, threads). Now kernels take
the count when they run (`convert.inductor_configs`: cpp.dynamic_threads), so one compile serves
them all. This measures what that costs at run time.

For a model at batch 1, channels_last, each precision: three artifact folders built by the real
benchmark child, "per-thread 1" and "per-thread 2" as autotune compiled before (the settings
without cpp.dynamic_threads, in a 1- or 2-thread process) and "shared" (today's). Then at each
thread count the per-thread artifact of that count and the shared one run in interleaved rounds of
fresh processes (`confirm.interleave`, balanced random order); the table gives the median p50 of
the rounds and the shared artifact's speedup paired per round (`confirm.paired`: median ratio,
order-statistic interval labelled with its real coverage). Build times come from the builds.

    .venv/bin/python benchmarks/dynamic_threads.py --rounds 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune import confirm, machine, planning, stats
from autotune.launch import LaunchPlan, MeasureSettings
from autotune.orchestrate import run_plan

# The child as autotune ran it before: its compile settings without cpp.dynamic_threads.
PER_THREAD = ("import runpy; from autotune.child import convert; "
              "convert.inductor_configs = lambda: {'freezing': True}; "
              "runpy.run_module('autotune.child.worker', run_name='__main__', alter_sys=True)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnext101")
    p.add_argument("--precisions", default="fp32,bf16,int8")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=2.0)
    args = p.parse_args()
    here = machine.this_machine()
    threads = [int(t) for t in args.threads.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="dynamic-threads-") as scratch:
        for precision in args.precisions.split(","):
            def plan(folder: str, count: int, p: str = precision) -> LaunchPlan:
                knobs = ["backend=inductor", "memory_format=channels_last", f"precision={p}", f"omp_threads={count}"]
                return planning.make_plan(planning.BenchRequest.from_flags(  # no spaces: inductor's compile lines
                    args.model, knobs, 1, measure=MeasureSettings(duration_s=args.duration),
                    cache_dir=Path(scratch, p, folder.replace(" ", "-"))), here)

            built = {"shared": build(plan("shared", threads[-1]), shared=True)}
            built |= {f"per-thread {t}": build(plan(f"per-thread {t}", t), shared=False) for t in threads}
            for count in threads:
                contenders = [confirm.Contender(f"per-thread {count}", plan(f"per-thread {count}", count)),
                              confirm.Contender("shared", plan("shared", count))]
                measured = confirm.interleave(contenders, args.rounds, "latency_p50_ms", 1800, run_plan, progress)
                rows.append(row(precision, count, measured, built))
    print(f"\n{args.model}, batch 1, channels_last: {args.rounds} interleaved rounds of fresh processes per row")
    print("| precision | threads | per-thread artifact p50 ms | shared artifact p50 ms | shared vs per-thread "
          "(paired) | compile s: per-thread / shared |")
    print("|---|---|---|---|---|---|")
    for line in rows:
        print(line)


def build(plan: LaunchPlan, shared: bool) -> float:
    """Run the child once so that it compiles into the plan's folder; the compile's seconds."""
    if not shared:
        plan = replace(plan, instances=tuple(replace(i, command=per_thread(i.command)) for i in plan.instances))
    result = run_plan(plan, 1800)
    if not result.ok:
        sys.exit(f"building {plan.config.describe()} failed: {result.reason}")
    setup = result.summary()["instances"][0].get("setup", {})
    seconds = float(setup.get("compile_s", 0.0)) + float(setup.get("quantize_s", 0.0))
    print(f"built {plan.config.describe()} ({'shared' if shared else 'per-thread'}): {seconds:.0f} s",
          file=sys.stderr)
    return seconds


def per_thread(command: tuple[str, ...]) -> tuple[str, ...]:
    """The child's argv with `-m autotune.child.worker` run under the old compile settings."""
    at = command.index("autotune.child.worker")
    return (*command[:at - 1], "-c", PER_THREAD, *command[at + 1:])


def row(precision: str, count: int, measured: confirm.Rounds, built: dict[str, float]) -> str:
    medians = []
    for position in range(2):
        values = [v for v in measured.values(position) if v is not None]
        medians.append(f"{stats.median(values):.2f}" if values else "failed")
    compared = confirm.paired(measured.values(0), measured.values(1), "latency_p50_ms", 0.03)
    return (f"| {precision} | {count} | {medians[0]} | {medians[1]} | {compared.describe() if compared else 'n/a'} | "
            f"{built[f'per-thread {count}']:.0f} / {built['shared']:.0f} |")


def progress(event: Any) -> None:
    value = "FAILED " + event.result.reason if not event.result.ok else f"p50 {event.result.latency_p50_ms:.1f} ms"
    print(f"round {event.round + 1}/{event.rounds}: {event.contender.label}: {value}", file=sys.stderr)


if __name__ == "__main__":
    main()
