"""The benchmark child: build one model as the knobs say, warm up, wait at the barrier, measure.

Kept small and free of the harness: it imports torch only inside `main()`, never imports optuna or
the CLI, and sends its result as a JSON file (never by printing). Protocol with the runner:
write a line to `--ready-fd` once warm, read `go` from stdin, measure, write `--result`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import os
import re
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

EXIT_BENCH_ERROR = 3  # a failure the worker understood and described in its result file


class BenchError(Exception):
    """A configuration that cannot run (e.g. an op without an mkldnn kernel), with the reason."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="autotune.worker")
    p.add_argument("--model", required=True)
    p.add_argument("--item-shape", required=True)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--mkldnn", choices=("on", "off"), default="off")
    p.add_argument("--weight-cache", choices=("on", "off"), default="off")
    p.add_argument("--dataloader-workers", type=int, default=0)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--warmup-time", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--min-iterations", type=int, default=10)
    p.add_argument("--cache-dir", default="studies/cache")
    p.add_argument("--result", required=True)
    p.add_argument("--ready-fd", type=int, default=-1)
    return p.parse_args(argv)


def die_with_parent() -> None:
    """Ask the kernel to kill this process if autotune dies, so no benchmark outlives it."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(1)


def write_json(path: str, payload: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


class SyntheticImages:
    """Fixed-size uint8 images through the usual preprocessing: resize, center crop, normalize."""

    def __init__(self, item_shape: tuple[int, ...], pool: int = 8) -> None:
        import torch

        channels, height, width = item_shape
        generator = torch.Generator().manual_seed(0)
        raw_h, raw_w = height * 375 // 224, width * 500 // 224
        self.images = [torch.randint(0, 256, (channels, raw_h, raw_w), dtype=torch.uint8,
                                     generator=generator) for _ in range(pool)]
        self.resize = height * 256 // 224
        self.crop = (height, width)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        import torch
        from torchvision.transforms.v2 import functional as F

        image = F.resize(self.images[index % len(self.images)], [self.resize], antialias=True)
        image = F.center_crop(image, list(self.crop))
        image = F.to_dtype(image, torch.float32, scale=True)
        return F.normalize(image, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])


def build_model(args: argparse.Namespace, example: Any, setup: dict[str, Any]) -> Any:
    """The model as the knobs say, returning a forward function over dense float batches."""
    import torchvision

    start = time.perf_counter()
    model = torchvision.models.get_model(args.model, weights=None).eval()
    setup["build_s"] = time.perf_counter() - start
    mkldnn = args.mkldnn == "on"
    if mkldnn:
        from torch.utils import mkldnn as mkldnn_utils

        start = time.perf_counter()
        model = mkldnn_utils.to_mkldnn(model)
        setup["mkldnn_convert_s"] = time.perf_counter() - start
        probe_mkldnn(model, example)
    if args.weight_cache == "on":
        model = cached_model(model, args, example, setup)

    def forward(batch: Any) -> Any:
        if mkldnn:
            return model(batch.to_mkldnn()).to_dense()
        return model(batch)

    return forward


def cached_model(model: Any, args: argparse.Namespace, example: Any, setup: dict[str, Any]) -> Any:
    """Seed recipe 2.c: a saved TorchScript file, loaded back so weights are laid out once.

    Without mkldnn: trace + freeze. With mkldnn: script (a frozen or traced mkldnn module cannot
    be saved: its weights are opaque tensors; scripted mkldnn modules save dense weights and
    reorder them once at load).
    """
    import torch

    path = weight_cache_path(args, torch.__version__)
    setup["weight_cache_file"] = str(path)
    setup["weight_cache_hit"] = path.exists()
    if not path.exists():
        start = time.perf_counter()
        with torch.no_grad():
            if args.mkldnn == "on":
                scripted = torch.jit.script(model)
            else:
                scripted = torch.jit.freeze(torch.jit.trace(model, example, check_trace=False))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.jit.save(scripted, str(tmp))
        os.replace(tmp, path)
        setup["trace_s"] = time.perf_counter() - start
    start = time.perf_counter()
    loaded = torch.jit.load(str(path))
    setup["weight_cache_load_s"] = time.perf_counter() - start
    return loaded


def weight_cache_path(args: argparse.Namespace, torch_version: str) -> Path:
    """Keyed by everything that changes the saved file."""
    key = json.dumps([args.model, args.item_shape, args.batch_size, "float32", args.mkldnn,
                      torch_version])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(args.cache_dir, "weights", f"{args.model}-{digest}.pt")


def explain(exc: BaseException) -> str:
    """One line for a failure inside the model."""
    if isinstance(exc, BenchError):
        return str(exc)
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first}"


def probe_mkldnn(model: Any, example: Any) -> None:
    """Run once with a module stack, so an op without an mkldnn kernel is named with its module."""
    import torch

    stack: list[str] = []
    names = {id(m): f"{n or 'model'} ({type(m).__name__})" for n, m in model.named_modules()}

    def enter(module: Any, inputs: Any) -> None:
        stack.append(names[id(module)])

    def leave(module: Any, inputs: Any, output: Any) -> None:
        stack.pop()

    handles = []
    for module in model.modules():
        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        with torch.no_grad():
            model(example.to_mkldnn()).to_dense()
    except Exception as exc:
        text = str(exc)
        op = re.search(r"aten::\w+", text)
        where = f" in module {stack[-1]}" if stack else ""
        detail = (text.strip().splitlines() or [""])[0][:160]
        raise BenchError(
            f"mkldnn: {op.group(0) if op else 'an operator'}{where} has no mkldnn (oneDNN layout) "
            f"kernel ({detail}); use mkldnn=off for this model"
        ) from exc
    finally:
        for handle in handles:
            handle.remove()


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

    return {
        "openmp_library": symbol_owner("omp_get_max_threads"),
        "malloc_library": symbol_owner("malloc"),
        "torch_threads": torch.get_num_threads(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "torch_version": torch.__version__,
        "mkldnn": args.mkldnn == "on",
        "weight_cache": args.weight_cache == "on",
        "dataloader_workers": args.dataloader_workers,
        "pid": os.getpid(),
        "env": {k: v for k, v in os.environ.items()
                if re.match(r"^(OMP_|KMP_|MKL_|MALLOC_CONF|LD_PRELOAD|TCMALLOC_)", k)},
    }


def cpu_seconds() -> float:
    """CPU time of this process and its children so far (DataLoader workers included)."""
    import psutil

    me = psutil.Process()
    total = float(sum(me.cpu_times()[:2]))
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a worker that just exited
            total += sum(child.cpu_times()[:2])
    return total


def warm_up(args: argparse.Namespace, forward: Any, batches: Any) -> int:
    """Untimed iterations until both the count and the time are reached."""
    count = 0
    deadline = time.perf_counter() + args.warmup_time
    while count < args.warmup or time.perf_counter() < deadline:
        forward(next(batches))
        count += 1
    return count


def measure(args: argparse.Namespace, forward: Any, batches: Any) -> dict[str, Any]:
    """Timed loop over a common window: forward latency per batch, end-to-end items per second."""
    import torch

    latencies_ms: list[float] = []
    iterations_ms: list[float] = []
    items = 0
    with torch.no_grad():
        cpu_before = cpu_seconds()
        start = time.perf_counter()
        deadline = start + args.duration
        while time.perf_counter() < deadline or len(latencies_ms) < args.min_iterations:
            t_fetch = time.perf_counter()
            batch = next(batches)
            t0 = time.perf_counter()
            forward(batch)
            t1 = time.perf_counter()
            latencies_ms.append((t1 - t0) * 1e3)
            iterations_ms.append((t1 - t_fetch) * 1e3)
            items += batch.shape[0]
        window = time.perf_counter() - start
        cpu_s = cpu_seconds() - cpu_before
    return {"latencies_ms": latencies_ms, "iterations_ms": iterations_ms, "items": items,
            "window_s": window, "throughput_ips": items / window, "cpu_s": cpu_s}


def wait_for_go(ready_fd: int) -> None:
    if ready_fd < 0:
        return
    os.write(ready_fd, b"ready\n")
    os.close(ready_fd)
    if sys.stdin.readline().strip() != "go":
        sys.exit(1)  # the runner went away or aborted the run


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    die_with_parent()
    setup: dict[str, Any] = {}
    import torch

    shape = tuple(int(n) for n in args.item_shape.split("x"))
    dataset: Any = SyntheticImages(shape)  # map-style by protocol; the stubs want a subclass
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, num_workers=args.dataloader_workers,
        persistent_workers=args.dataloader_workers > 0,
    )
    batches = iter(loader)
    example = next(batches)
    try:
        forward = build_model(args, example, setup)
        with torch.no_grad():
            start = time.perf_counter()
            forward(example)
            setup["first_forward_s"] = time.perf_counter() - start
            warmup_start = time.perf_counter()
            setup["warmup_iterations"] = warm_up(args, forward, batches)
            setup["warmup_s"] = time.perf_counter() - warmup_start
    except Exception as exc:  # the model's own failure is this configuration's result
        write_json(args.result, {"status": "error", "reason": explain(exc)})
        return EXIT_BENCH_ERROR
    wait_for_go(args.ready_fd)
    result = measure(args, forward, batches)
    del batches, loader  # stop DataLoader workers so their peak RSS is counted below
    result.update(
        status="ok",
        setup=setup,
        runtime=runtime_report(args),
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        loader_peak_rss_mb=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    )
    write_json(args.result, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
