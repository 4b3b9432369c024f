"""This CPU's model name and instruction-set flags, and the instruction-set limits the environment
sets: what a compiled artifact (and a host class, and the kernel probe) is keyed by. Which
precisions run here, and how fast, is not read off these flags: the kernel probe measures it
(`autotune.model.backends.probe`, `autotune.host.capabilities`)."""

from __future__ import annotations

import functools
import os
import platform
import re
from pathlib import Path

ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
# What the environment can limit the instruction set to (oneDNN's JIT, OpenVINO's CPU plugin, ATen's
# kernels and inductor's code, MKL's fp32 matmuls): `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
# MKL_ENABLE_INSTRUCTIONS=AVX2` makes an AVX-512 machine run what an AVX2 one does, but for ONNX
# Runtime's own kernels (MLAS), which read the CPU's flags and take no such limit.
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


@functools.lru_cache(maxsize=1)
def cpuinfo() -> tuple[str, frozenset[str]]:
    """CPU model name and feature flags from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown", frozenset()
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    return (model.group(1).strip() if model else "unknown",
            frozenset(flags.group(1).split()) if flags else frozenset())


def isa_limits() -> dict[str, str]:
    """The instruction-set limits this environment sets, as set."""
    return {name: os.environ[name] for name in ISA_LIMITS if os.environ.get(name)}


# Flag families a compiler may emit instructions from: an artifact is keyed by all of them.
KERNEL_FLAG_PREFIXES = ("avx", "amx", "fma", "f16c", "bmi", "sse", "vpclmul", "gfni", "vaes")


def isa() -> tuple[str, ...]:
    """The flags that change which instructions a compiled artifact may contain, and the limits
    the environment puts on them (`NAME=VALUE`, none unless set)."""
    flags = sorted(flag for flag in cpuinfo()[1] if flag.startswith(KERNEL_FLAG_PREFIXES))
    return (*flags, *(f"{name}={value}" for name, value in sorted(isa_limits().items())))
