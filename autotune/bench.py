"""One configuration, planned and measured: the capability everything else is a loop over."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autotune import models
from autotune.errors import ConfigError
from autotune.knobs import Config
from autotune.launch import BenchSpec, LaunchPlan, plan_launch
from autotune.machine import Machine
from autotune.runner import RunResult, run_plan


@dataclass(frozen=True)
class BenchRequest:
    """What the user asked for, converted once from flags."""

    model: str
    config: Config
    batch_size: int = 1
    warmup: int = 3
    duration_s: float = 5.0
    min_iterations: int = 3
    cache_dir: Path = Path("studies/cache")

    @classmethod
    def from_flags(cls, model: str, assignments: Iterable[str], batch_size: int,
                   **options: object) -> BenchRequest:
        if batch_size < 1:
            raise ConfigError(f"--batch-size {batch_size} is not allowed; use 1 or more")
        return cls(model=model, config=Config.from_assignments(assignments),
                   batch_size=batch_size, **options)  # type: ignore[arg-type]


def make_plan(request: BenchRequest, machine: Machine) -> LaunchPlan:
    spec = models.resolve(request.model)
    bench = BenchSpec(
        model=spec.name, item_shape=spec.item_shape, batch_size=request.batch_size,
        warmup=request.warmup, duration_s=request.duration_s,
        min_iterations=request.min_iterations, cache_dir=str(request.cache_dir.resolve()),
    )
    binder = "numactl" if machine.described else None
    return plan_launch(request.config, bench, machine.topology, machine.libs, sys.executable,
                       binder=binder, parent_env=dict(os.environ))


def run(plan: LaunchPlan, timeout_s: float) -> RunResult:
    return run_plan(plan, timeout_s)
