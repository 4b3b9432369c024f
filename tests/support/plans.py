"""Launch plans whose instances are the fake benchmark child (fake_worker.py), one behaviour each."""

from __future__ import annotations

import sys
from pathlib import Path

from autotune.child.settings import MeasureSettings
from autotune.config.knobs import Config
from autotune.measure.plan import BenchSpec, InstancePlan, LaunchPlan

FAKE_WORKER = str(Path(__file__).parent / "fake_worker.py")
WINDOW_S = 0.3


def plan_of(*behaviours: str, env: dict[str, str] | None = None, window_s: float = WINDOW_S) -> LaunchPlan:
    instances = tuple(
        InstancePlan(i, (0,), 0, env or {}, (sys.executable, FAKE_WORKER, b)) for i, b in enumerate(behaviours)
    )
    return LaunchPlan(Config(), BenchSpec("fake", (1,), measure=MeasureSettings(duration_s=window_s)), "none",
                      instances)
