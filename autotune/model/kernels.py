"""The kernel probe's operations and the arithmetic around them: the inputs every runtime gets, the
quantization the int8 conversions apply, the exact integer sums an int8 kernel must match, the
relative error, the timing, the memory bandwidth, and a model's FLOP. Each runtime runs them in its
backend module (`Backend.probe_kernel`); `autotune.model.backends.probe` measures them all.

- conv: a 3x3 convolution, 256 to 256 channels on 14x14 at batch 1 (a ResNet stage-3 conv);
- matmul: 128 tokens through a 768 x 3072 Linear (BERT-base's feed-forward layer).

Activations are in [0, 1) (after a ReLU, as int8 quantizes them: uint8) and weights in [-1, 1), so
that int8's integers fill their ranges: where a CPU without VNNI sums u8 x s8 pairs in 16 bits, the
sums saturate, and `Quantized.exact` shows it. torch is imported inside functions.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

CONV = (256, 256, 3, 14)  # in channels, out channels, kernel size, height = width
MATMUL = (128, 768, 3072)  # rows (tokens), in features, out features
OPS = ("conv", "matmul")
SECONDS = 0.15  # timed per kernel and thread count, after two untimed calls
MIN_CALLS = 3
STREAM_FLOATS = 32 * 2**20  # 128 MiB per array: far beyond any L3 cache
EXACT = 1e-4  # relative error against exact integer arithmetic above which a u8 x s8 kernel saturates
FULL, REDUCED = 255, 127  # uint8 activation levels: the quantizers' default range, and reduce_range's


@dataclass(frozen=True)
class Kernel:
    runtime: str
    precision: str
    op: str

    @property
    def name(self) -> str:
        return f"{self.runtime}:{self.precision}:{self.op}"


def work(op: str) -> int:
    """Multiply-adds times two (FLOP, or integer OP) of one call of `op`."""
    if op == "conv":
        cin, cout, k, hw = CONV
        return 2 * cin * cout * k * k * hw * hw
    rows, inner, out = MATMUL
    return 2 * rows * inner * out


# -- inputs ----------------------------------------------------------------------------------------


@functools.cache
def inputs(op: str) -> tuple[Any, Any]:
    """Activations in [0, 1) (after a ReLU, as int8 quantizes them: uint8) and weights in [-1, 1),
    fixed by a seed: every runtime sees the same numbers."""
    import torch

    generator = torch.Generator().manual_seed(57)
    cin, cout, k, hw = CONV
    rows, inner, out = MATMUL
    x_shape, w_shape = ((1, cin, hw, hw), (cout, cin, k, k)) if op == "conv" else ((rows, inner), (out, inner))
    return torch.rand(x_shape, generator=generator), torch.rand(w_shape, generator=generator) * 2 - 1


def fp32(op: str) -> Any:
    import torch

    x, w = inputs(op)
    with torch.no_grad():
        return torch_op(op, x, w)


def torch_op(op: str, x: Any, w: Any) -> Any:
    import torch

    if op == "conv":
        return torch.nn.functional.conv2d(x, w, padding=CONV[2] // 2)
    return torch.nn.functional.linear(x, w)


@dataclass(frozen=True)
class Quantized:
    """`inputs` quantized as the int8 conversions do: uint8 activations per tensor (zero point 0),
    int8 weights per output channel (symmetric, within +-`w_max`)."""

    qx: Any
    x_scale: float
    qw: Any
    w_scales: Any

    def exact(self, op: str) -> Any:
        """What an exact integer kernel returns, dequantized (float64 sums of the integers)."""
        y = torch_op(op, self.qx.double(), self.qw.double()) * self.x_scale
        scales = self.w_scales.double()
        return y * (scales[None, :, None, None] if op == "conv" else scales[None, :])


def quantized(op: str, x_levels: int = FULL, w_max: int = 127) -> Quantized:
    import torch

    x, w = inputs(op)
    x_scale = 1.0 / x_levels
    qx = torch.clamp(torch.round(x / x_scale), 0, x_levels).to(torch.uint8)
    w_scales = w.abs().reshape(w.shape[0], -1).amax(dim=1) / w_max
    shape = (-1, *([1] * (w.dim() - 1)))
    qw = torch.clamp(torch.round(w / w_scales.reshape(shape)), -w_max, w_max).to(torch.int8)
    return Quantized(qx, x_scale, qw, w_scales)


def rel_error(output: Any, reference: Any) -> float:
    import torch

    out = torch.as_tensor(output).double().reshape(reference.shape)
    ref = reference.double()
    return float((out - ref).norm() / ref.norm())


def seconds_per_call(call: Callable[[], Any]) -> float:
    """The median of calls timed for at least SECONDS (and MIN_CALLS), after two untimed ones."""
    call()
    call()
    samples: list[float] = []
    end = time.perf_counter() + SECONDS
    while time.perf_counter() < end or len(samples) < MIN_CALLS:
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2]


@contextlib.contextmanager
def threads_kept() -> Iterator[None]:
    """torch's thread count as it was, after kernels that set their own: a measuring process checks
    int8 saturation (`saturation.saturates`) on one thread, then must run the model at the count it was
    launched with (left at one, resnext101 int8 at 2 threads took 85 ms instead of 45)."""
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def bandwidth(threads: Sequence[int]) -> dict[str, dict[str, float]]:
    """STREAM's copy (b = a) and triad (a = b + s * c) in GB/s at each thread count."""
    import torch

    a, b, c = (torch.ones(STREAM_FLOATS) for _ in range(3))
    size = STREAM_FLOATS * a.element_size()
    found = {}
    with threads_kept():
        for t in threads:
            torch.set_num_threads(t)
            copy = seconds_per_call(lambda: b.copy_(a))
            triad = seconds_per_call(lambda: torch.add(b, c, alpha=3.0, out=a))
            found[str(t)] = {"copy_gbs": 2 * size / copy / 1e9, "triad_gbs": 3 * size / triad / 1e9}
    return found


def model_flops(forward: Callable[[Any], Any], batch: Any) -> float:
    """The FLOP of one call of an eager model on `batch`, by torch's FLOP counter (matmuls and
    convolutions): the work a search's winner is set against the probe's peaks."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        forward(batch)
    return float(counter.get_total_flops())


