"""One configuration, planned and measured: the capability everything else is a loop over."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autotune import models
from autotune.errors import ConfigError
from autotune.knobs import Config
from autotune.launch import BenchSpec, LaunchPlan, MeasureSettings, plan_launch
from autotune.machine import Machine


@dataclass(frozen=True)
class BenchRequest:
    """What the user asked for, converted once from flags."""

    model: str
    config: Config
    batch_size: int = 1
    measure: MeasureSettings = field(default_factory=MeasureSettings)
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
        measure=request.measure, cache_dir=str(request.cache_dir.resolve()),
    )
    binder = "numactl" if machine.described else None
    return plan_launch(request.config, bench, machine.topology, machine.libs, sys.executable,
                       binder=binder, parent_env=dict(os.environ))


def plan_from_exported(env: Mapping[str, str], machine: Machine,
                       measure: MeasureSettings | None = None) -> LaunchPlan:
    """An exported configuration planned again for `machine` from its recorded knobs
    (AUTOTUNE_MODEL, AUTOTUNE_BATCH_SIZE, AUTOTUNE_KNOBS)."""
    try:
        batch_size = int(env.get("AUTOTUNE_BATCH_SIZE", "1"))
    except ValueError:
        raise ConfigError(f"AUTOTUNE_BATCH_SIZE={env['AUTOTUNE_BATCH_SIZE']!r} is not a number; export again") from None
    request = BenchRequest(model=env.get("AUTOTUNE_MODEL", ""), batch_size=batch_size,
                           config=Config.from_assignments(env.get("AUTOTUNE_KNOBS", "").split()),
                           measure=measure or MeasureSettings())
    return make_plan(request, machine)
