"""What the harness tells the measuring child, with the defaults both sides share.

The CLI's flags, the launch plan and the child's own argument parser all take their defaults from
here: one definition of the measurement protocol and of where compiled artifacts are cached.
"""

from __future__ import annotations

from dataclasses import dataclass

STUDIES_DIR = "studies"  # where studies live by default, relative to where autotune runs
CACHE_DIR = f"{STUDIES_DIR}/cache"  # compiled artifacts (artifacts/) and inductor's kernels, shared by every study
HELD = "held_s"  # in a child's setup record: the seconds it waited, built, for another plan's turn (--hold)


@dataclass(frozen=True)
class MeasureSettings:
    """The measurement protocol inside one child.

    Warmup runs until both `warmup` iterations and `warmup_s` seconds have passed (first-call
    costs such as tracing are recorded apart and never timed); then samples are taken until both
    `min_iterations` samples and `duration_s` seconds are reached.
    """

    warmup: int = 3
    warmup_s: float = 1.0
    duration_s: float = 2.0
    min_iterations: int = 10
