"""The benchmark child: build one model as the knobs say, warm up, wait at the barrier, measure.

Kept small and free of the harness: it imports torch only inside `main()`, never imports optuna or
the CLI, and sends its result as a JSON file (never by printing). Protocol with the runner:

1. build the model, warm up, then write `ready` and a newline to `--ready-fd`; before it, lines
   `phase NAME` (`building`, `compiling`, `loading the compiled model`, `warming up`) say what the
   child is doing, for live progress; a runner may ignore them, and a child may send none. With
   `--hold`, between building and warming up: write `built` and a newline, and read a line from
   stdin: `warm` goes on, anything else (EOF included) means the run was aborted, exit 1 (a
   runner that builds two plans at a time lets each warm up and measure alone);
2. read `go START END` from stdin: the common measuring window, in CLOCK_MONOTONIC seconds
   (system-wide on Linux, so the runner's `time.monotonic()` and the child's agree); anything else
   (EOF included) means the run was aborted, and the child exits 1;
3. wait until START, time samples until END (and at least `--min-iterations` of them); with
   `--profile K`, profile K forward calls from START instead (`autotune.child.hotops`); with
   `--give-up-above-ms MS1,MS2,...`, stop at the k-th check (after k times `--give-up-after`
   seconds and `--give-up-iterations` samples) when the samples' median is above MSk, and say so
   in the result (`gave_up_above_ms`, `gave_up_windows`): a search's hopeless configuration
   (`autotune.search.pruning.GiveUp`);
4. write `done` and a newline to `--ready-fd` and close it, the end of the timed loop;
5. write `--result` and exit 0, at once: without Python's teardown (`exit_now`).

Without `--ready-fd` the child measures at once, for `--duration` seconds.
Peak RSS is reset after building (Linux `clear_refs`), so `peak_rss_mb` is what warmup and the
timed loop held and `setup_peak_rss_mb` what building and converting did.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import json
import math
import os
import re
import resource
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

from autotune.child.evaldata import SPLITS
from autotune.child.settings import CACHE_DIR, HELD, MeasureSettings
from autotune.child.timing import Window, limits, timed_loop, warm_up
from autotune.model.artifacts import installed_torch_version
from autotune.model.files import write_atomically
from autotune.model.knobdefs import value_text
from autotune.model.knobs import KNOBS, MODEL_KNOBS
from autotune.model.quantize import CALIBRATION_BATCHES

MEASURE = MeasureSettings()  # the defaults of the protocol's flags
EXIT_BENCH_ERROR = 3  # a failure the worker understood and described in its result file


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="autotune.child.worker")
    p.add_argument("--model", required=True)
    p.add_argument("--item-shape", required=True)
    p.add_argument("--example-inputs", default="", help="a torch.save file of inputs, items along dim 0")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-lens", default="", help="sequence-length buckets N,N,...: a round times one batch of each")
    p.add_argument("--seq-len-weights", default="", help="their shares of the requests, W,W,... (default: equal)")
    for name in MODEL_KNOBS:
        p.add_argument(f"--{name.replace('_', '-')}", choices=KNOBS[name].spellings() or None,  # int: knob parses
                       default=value_text(KNOBS[name].default))
    p.add_argument("--calibration-batches", type=int, default=CALIBRATION_BATCHES, help="int8: batches observed")
    p.add_argument("--tolerance", type=float, default=None, help="what the guard allows (default: the precision's)")
    p.add_argument("--import-path", default="", help="folder to import a model factory from")
    p.add_argument("--task", default="", help="an hf: model's head (default: sequence-classification)")
    p.add_argument("--probe", action="store_true", help="build, check one forward, write the result, exit")
    p.add_argument("--eval-data", default="", help="the user's data: calibration, and with --eval-split, quality")
    p.add_argument("--eval-split", default="", choices=("", *SPLITS),
                   help="with --probe: judge the configuration on this part of --eval-data beside fp32 eager")
    p.add_argument("--eval-metric", default="", help="MODULE:FUNCTION: the user's quality metric (with --eval-split)")
    p.add_argument("--eval-direction", default="higher", choices=("higher", "lower"), help="which way it is better")
    p.add_argument("--eval-import-path", default="", help="the folder MODULE is imported from")
    p.add_argument("--guard-records-only", action="store_true",
                   help="the guard records its figures and fails nothing (a quality limit on --eval-data judges)")
    p.add_argument("--dataloader-workers", type=int, default=0)
    p.add_argument("--warmup", type=int, default=MEASURE.warmup)
    p.add_argument("--warmup-time", type=float, default=MEASURE.warmup_s)
    p.add_argument("--duration", type=float, default=MEASURE.duration_s)
    p.add_argument("--min-iterations", type=int, default=MEASURE.min_iterations)
    p.add_argument("--give-up-above-ms", type=limits, default=(), help="MS[,MS...]: stop early when the median "
                   "latency so far is above the k-th MS at the k-th check (none: never)")
    p.add_argument("--give-up-after", type=float, default=0.0, help="seconds between checks (a window's)")
    p.add_argument("--give-up-iterations", type=int, default=1, help="samples each check needs at least, per window")
    p.add_argument("--cache-dir", default=CACHE_DIR)
    p.add_argument("--artifacts", default="", help="where compiled artifacts are kept (default: CACHE_DIR/artifacts)")
    p.add_argument("--result", required=True)
    p.add_argument("--ready-fd", type=int, default=-1)
    p.add_argument("--parent-pid", type=int, default=-1, help="autotune's pid: exit if it is already gone")
    p.add_argument("--hold", action="store_true", help="after building, say `built` and wait for `warm` on stdin")
    p.add_argument("--profile", type=int, default=0, help="profile this many forward calls instead of timing")
    p.add_argument("--trace", default="", help="with --profile: where the Chrome trace is written")
    args = p.parse_args(argv)
    if args.guard_records_only:
        args.tolerance = math.inf  # nothing is below 1 - inf: the figures are recorded, nothing fails
    return args


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill this process if autotune dies, so no benchmark outlives it; and
    exit now if it died before the request was made (autotune may itself be PID 1 in a container,
    so the parent is compared with autotune's pid, not with 1)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if parent_pid > 0 and os.getppid() != parent_pid:
        os._exit(1)


def write_json(path: str, payload: dict[str, Any]) -> None:
    write_atomically(path, json.dumps(payload))


def symbol_owner(symbol: str) -> str | None:
    """The shared library that this process resolves `symbol` to (what LD_PRELOAD changed)."""

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    libc = ctypes.CDLL(None)
    address = ctypes.cast(getattr(libc, symbol, None) or 0, ctypes.c_void_p).value
    if not address:
        return None
    info = DlInfo()
    dl = ctypes.CDLL(ctypes.util.find_library("dl") or None)
    if not dl.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return None
    return str(os.path.realpath(info.dli_fname.decode()))


def runtime_report(args: argparse.Namespace) -> dict[str, Any]:
    """What really ran: libraries, threads, affinity; tests check these against the plan."""
    import torch

    from autotune.child.sources import knobs_of  # loaded by now: the model was built through it

    return {
        "openmp_library": symbol_owner("omp_get_max_threads"),
        "malloc_library": symbol_owner("malloc"),
        "torch_threads": torch.get_num_threads(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "torch_version": torch.__version__,
        **asdict(knobs_of(args)),
        "dataloader_workers": args.dataloader_workers,
        "pid": os.getpid(),
        "env": {k: v for k, v in os.environ.items()
                if re.match(r"^(OMP_|KMP_|MKL_|MALLOC_CONF|LD_PRELOAD|TCMALLOC_)", k)},
    }


def wait_for_go(ready_fd: int, duration_s: float) -> Window:
    """Say `ready`, then the window the runner sends (step 2 of the protocol)."""
    if ready_fd < 0:
        now = time.monotonic()
        return Window(now, now + duration_s)
    os.write(ready_fd, b"ready\n")
    words = sys.stdin.readline().split()
    try:
        if words[0] == "go" and len(words) == 3:
            return Window(float(words[1]), float(words[2]))
    except (IndexError, ValueError):
        pass
    sys.exit(1)  # the runner went away or aborted the run


def wait_for_turn(ready_fd: int) -> None:
    """Say `built`, then wait until the runner says `warm` (`--hold`, step 1 of the protocol)."""
    if ready_fd < 0:
        return
    os.write(ready_fd, b"built\n")
    if sys.stdin.readline().strip() != "warm":
        sys.exit(1)  # the runner went away or aborted the run


def say_phase(ready_fd: int, phase: str) -> None:
    """What the child is doing now, for the runner's progress (step 1 of the protocol)."""
    if ready_fd >= 0:
        os.write(ready_fd, f"phase {phase}\n".encode())


def say_done(ready_fd: int) -> None:
    if ready_fd >= 0:
        os.write(ready_fd, b"done\n")
        os.close(ready_fd)


def start_peak_rss(clear_refs: str = "/proc/self/clear_refs") -> str:
    """Reset the peak RSS (VmHWM) to the current RSS, so that the peak measured from here on is what
    serving costs; the reason it could not, where `clear_refs` is not writable."""
    try:
        with open(clear_refs, "w") as f:
            f.write("5")
    except OSError as exc:
        return f"peak RSS includes building the model: cannot reset it ({exc.strerror or exc})"
    return ""


def outermost_missing(path: Path) -> Path | None:
    """The outermost of `path` and its parents that does not exist yet: the first folder this
    process would create on the way to `path` (None when `path` exists)."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


def remove_empty(path: Path, up_to: Path | None) -> None:
    """Remove `path` and its parents up to `up_to` while they are empty: the folders this process
    created and left unused, so that a configuration that failed leaves nothing behind. A folder
    something was written into (by this process or another) stays."""
    if up_to is None:
        return
    for folder in (path, *path.parents):
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == up_to:
            return


def peak_rss_mb() -> float:
    """This process's peak RSS since the last reset (VmHWM), or since it started (getrusage)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def release_setup_memory() -> None:
    """Free what building left behind (the eager reference model, traced graphs) before measuring,
    and hand glibc's freed heap back, so that it does not count as serving memory."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    die_with_parent(args.parent_pid)
    setup: dict[str, Any] = {}
    # Compiled kernels persist, one folder per torch version (so `autotune cache` can tell which ones
    # this torch can still use), and a repeated configuration does not compile again.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(args.cache_dir, "inductor", installed_torch_version())))
    inductor_cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    new_from = outermost_missing(inductor_cache)  # torch._dynamo's import creates the folder, needed or not
    import torch

    from autotune.child import rounds
    from autotune.child.build import build
    from autotune.child.inputs import dataset_of
    from autotune.child.sources import knobs_of
    from autotune.model import kernels
    from autotune.model.batches import explain
    from autotune.model.errors import ApplyError, WrongAnswers

    found = rounds.buckets_of(args)
    parts = rounds.per_length(args, found, not knobs_of(args).one_shape)  # a stream per bucket, or the one
    loaders = [torch.utils.data.DataLoader(
        dataset_of(part), batch_size=args.batch_size, num_workers=args.dataloader_workers,  # map-style by protocol
        persistent_workers=args.dataloader_workers > 0,
    ) for part in parts]
    streams = [iter(loader) for loader in loaders]
    examples = [next(stream) for stream in streams]
    batches = rounds.rounds(streams, [len(part.lengths) for part in parts] if found else [])
    build_from = time.perf_counter()
    try:
        say_phase(args.ready_fd, "building")

        def built(part: argparse.Namespace, example: Any, into: dict[str, Any]) -> Any:
            return build(part, example, into, on_phase=lambda phase: say_phase(args.ready_fd, phase))

        forward = built(args, examples[0], setup) if found is None else \
            rounds.build_mixed(parts, examples, found, knobs_of(args).one_shape, setup, built)
        if args.probe:
            from autotune.child import quality

            judged = {"quality": quality.evaluate(args, forward)} if args.eval_split else {}
            # what really ran goes with it: the harness checks every preloaded library was used
            write_json(args.result, {"status": "ok", "setup": setup, "runtime": runtime_report(args), **judged})
            return 0
        # PyTorch's defaults: the model's own work, once per study (a generating model's limit is bandwidth)
        if found is None and knobs_of(args).is_default and args.task != "generate":
            setup["flops_per_item"] = kernels.model_flops(forward, examples[0]) / args.batch_size
        release_setup_memory()
        setup_peak_mb, peak_note = peak_rss_mb(), start_peak_rss()
        if args.hold:
            held_from = time.perf_counter()
            wait_for_turn(args.ready_fd)
            setup[HELD] = time.perf_counter() - held_from
        say_phase(args.ready_fd, "warming up")
        with torch.no_grad():
            if found is not None and knobs_of(args).shapes == "dynamic":  # not eager: see rounds.fill
                setup.update(rounds.fill(forward, examples[-1], found.lengths[-1]))
            warmup_start = time.perf_counter()
            # the whole set-up, once: its parts (build_s, quantize_s inside compile_s, ...) nest
            setup["ready_s"] = warmup_start - build_from - setup.get(HELD, 0.0)
            setup["warmup_iterations"] = warm_up(args, forward, batches)
            setup["warmup_s"] = time.perf_counter() - warmup_start
    except Exception as exc:  # the model's own failure is this configuration's result
        reason = str(exc) if isinstance(exc, ApplyError) else explain(exc)
        # the guard's verdict on the converted model: every process that runs this model answers the same
        write_json(args.result, {"status": "error", "reason": reason, "wrong_answers": isinstance(exc, WrongAnswers),
                                 "setup": setup})
        remove_empty(inductor_cache, new_from)
        return EXIT_BENCH_ERROR
    window = wait_for_go(args.ready_fd, args.duration)
    if args.profile > 0:
        from autotune.child.hotops import profiled_loop

        result = profiled_loop(forward, batches, window.start, args.profile, args.trace)
    else:
        result = timed_loop(args, forward, batches, window)
    say_done(args.ready_fd)
    del batches, streams, loaders  # stop DataLoader workers so their peak RSS is counted below
    result.update(
        status="ok",
        setup=setup,
        runtime=runtime_report(args),
        peak_rss_mb=peak_rss_mb(),
        setup_peak_rss_mb=setup_peak_mb,
        peak_rss_note=peak_note,
        loader_peak_rss_mb=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    )
    write_json(args.result, result)
    return 0


def exit_now(code: int) -> NoReturn:
    """End the process without Python's teardown, once the result file is written and closed.
    Tearing down an interpreter that holds torch and a model (modules, tensors, thread pools) took
    0.7-1.5 s after resnext101 (benchmarks/RESULTS.md, "Exiting without teardown"), time the runner waits for in every
    process of a search and of its confirmation; it measures nothing. What teardown would stop
    (compile workers, DataLoader workers) is in this process's group, which the runner kills on
    the way out."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
