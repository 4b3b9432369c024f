"""This CPU's model name and instruction-set flags: what decides whether bf16, int8 (or an artifact
compiled elsewhere) can run here. Read by the child and the parent alike."""

from __future__ import annotations

import functools
import platform
import re
from pathlib import Path

ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# The x86 int8 kernels oneDNN picks (and torchao's x86 quantizer assumes: full uint8 range) need VNNI or AMX.
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


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


def has_bf16() -> bool:
    return any(flag in cpuinfo()[1] for flag in BF16_FLAGS)


def has_int8() -> bool:
    return any(flag in cpuinfo()[1] for flag in INT8_FLAGS)


# Flag families a compiler may emit instructions from: an artifact is keyed by all of them.
KERNEL_FLAG_PREFIXES = ("avx", "amx", "fma", "f16c", "bmi", "sse", "vpclmul", "gfni", "vaes")


def isa() -> tuple[str, ...]:
    """The flags that change which instructions a compiled artifact may contain."""
    return tuple(sorted(flag for flag in cpuinfo()[1] if flag.startswith(KERNEL_FLAG_PREFIXES)))
