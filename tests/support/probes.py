"""Kernel probes made up for tests: a CPU where every precision runs (`everything_runs`), or one
that refuses some (`probe` with per-kernel overrides), without running the probe's child."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.host.capabilities import Probe
from autotune.model.backends.probe import all_kernels

# GOP/s a made-up CPU reaches per precision at 1 thread (twice that at 2): int8 4x fp32, bf16 2x.
SPEED = {"fp32": 100.0, "bf16": 200.0, "int8": 400.0, "int8_dynamic": 250.0, "int8_weight_only": 100.0}


def kernel(runtime: str, precision: str, op: str, **overrides: Any) -> dict[str, Any]:
    gops = SPEED[precision]
    return {"runtime": runtime, "precision": precision, "op": op, "runs": True, "error": "",
            "rel_error": 0.0 if precision == "fp32" else 0.004, "exact_error": None, "saturates": None,
            "remedy": "", "ran_as": "", "gops": {"1": gops, "2": 2 * gops}} | overrides


def probe(overrides: Mapping[str, Mapping[str, Any]] | None = None, bandwidth: float = 30.0) -> Probe:
    """A probe of every kernel, `overrides` ("runtime:precision:op" -> fields) changing some."""
    changed = overrides or {}
    kernels = [kernel(k.runtime, k.precision, k.op, **changed.get(k.name, {})) for k in all_kernels()]
    return Probe.from_json({"threads": [1, 2], "kernels": kernels, "measured_at": "2026-12-06T12:00:00",
                            "bandwidth": {"1": {"copy_gbs": bandwidth / 2, "triad_gbs": bandwidth / 2},
                                          "2": {"copy_gbs": bandwidth, "triad_gbs": bandwidth}}})


def everything_runs() -> Probe:
    return probe()


def failing(name: str, error: str) -> dict[str, dict[str, Any]]:
    return {name: {"runs": False, "error": error, "gops": {}, "rel_error": None}}


def refusing(bf16: bool = False, int8: bool = False) -> dict[tuple[str, str], str]:
    """What `capabilities.refusals` gives on a CPU whose probe refuses bf16 (slow) and/or int8 (failed)."""
    from autotune.model.backends import REGISTRY

    refused = {}
    for backend in REGISTRY:
        for precision in backend.precisions:
            if bf16 and precision == "bf16":
                refused[(backend.name, precision)] = "it measured 32.3x slower than fp32 in its probe (conv)"
            if int8 and precision.startswith("int8"):
                refused[(backend.name, precision)] = "its probe failed: RuntimeError: no int8 here"
    return refused
