"""This host's own timing spread: the floor a measuring window's spread is judged against.

A cloud VM's windows spread 10-30% (IQR over median) with nothing else running: neighbours in other
VMs leave no trace in this one's counters, so that spread is the host's normal state, not a
disturbance. A fixed limit on the spread flagged most of a search's windows there and sent them to
be measured again for nothing (issue 68). So the spread a window may have is this host's own:

- every window measured with no sign of anything else on the machine (other processes' CPU, steal,
  a child starved of CPU: `replicates.disturbed_reason`) adds its spread here; each instance of a
  window is its own distribution, so a window's spread is the median of its instances' spreads;
- the floor is the `QUANTILE` of the last `KEPT` such spreads: a window wider than it is wider than
  this host's undisturbed windows are in 19 of 20; below `MIN_WINDOWS` windows there is no floor
  yet, and a spread alone flags nothing (the decisions under spread still read each window's
  interval, `pruning.clear_under_spread`);
- the spreads are kept per host (its name, CPU model and cores) in the cache folder, like the
  kernel probe: a later search, and `autotune doctor`, start from them.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from autotune.host.machine import host_name
from autotune.model import cpu, schema
from autotune.model.files import NotAFile, read_text, write_atomically

QUANTILE = 0.95  # of the undisturbed windows' spreads: the floor
MIN_WINDOWS = 8  # undisturbed windows before a floor is said
KEPT = 400  # the most recent undisturbed windows kept (a host's spread can change: a new neighbour)

SCHEMA = schema.record({"spreads": schema.list_of(schema.number)},
                       {"host": schema.text, "updated_at": schema.text})


@dataclass(frozen=True)
class Floor:
    """The spreads of this host's undisturbed windows, oldest first, and where they are kept."""

    spreads: tuple[float, ...] = ()
    path: Path | None = field(default=None, compare=False)

    @property
    def threshold(self) -> float | None:
        """The spread above which a window is wider than this host's own (None: too few windows yet)."""
        if len(self.spreads) < MIN_WINDOWS:
            return None
        ordered = sorted(self.spreads)
        return ordered[min(len(ordered) - 1, math.ceil(QUANTILE * len(ordered)) - 1)]

    def adding(self, spreads: Iterable[float]) -> Floor:
        """With `spreads` (new undisturbed windows) added, the oldest beyond `KEPT` dropped."""
        new = tuple(s for s in spreads if math.isfinite(s) and s >= 0)
        return Floor((self.spreads + new)[-KEPT:], self.path) if new else self

    def describe(self) -> str:
        """One line for `doctor` and the search's summary."""
        if self.threshold is None:
            return (f"not known yet ({len(self.spreads)} of the {MIN_WINDOWS} undisturbed windows it needs; "
                    "a search measures them)")
        ordered = sorted(self.spreads)
        return (f"{self.threshold:.1%} IQR/median ({QUANTILE:.0%} of {len(ordered)} undisturbed windows "
                f"spread less; their median {ordered[len(ordered) // 2]:.1%})")


@dataclass(frozen=True)
class Kept:
    """This host's floor where it is kept, for a series of measurements: read afresh before each
    judgement (another search on this host may have added to it meanwhile) and taught each
    undisturbed window as it comes, whether the window was a search trial's or a confirmation's."""

    cache_dir: Path
    cores: int

    def threshold(self) -> float | None:
        return here(self.cache_dir, self.cores).threshold

    def learn(self, spreads: Iterable[float]) -> None:
        new = list(spreads)
        if new:
            save(here(self.cache_dir, self.cores).adding(new))


def here(cache_dir: Path, cores: int) -> Floor:
    """This host's floor, kept in the cache folder (not the probe's shared folder: a test suite's
    fake windows would teach every other test, and the real searches, a fake floor)."""
    return load(path(Path(cache_dir) / "floor", host_name(), cores))


def path(folder: Path, host: str, cores: int) -> Path:
    """Where this host's floor is kept in `folder`: one file per host name, CPU and cores."""
    ident = {"host": host, "cpu_model": cpu.cpuinfo()[0], "cores": cores}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"floor-{digest}.json"


def load(where: Path) -> Floor:
    """The floor kept at `where`; an empty one where none is kept or the file cannot be used (it is
    rewritten by the next `save`): a floor is evidence gathered again, never worth refusing a search."""
    try:
        data = schema.loads(read_text(where), SCHEMA)
    except (FileNotFoundError, NotAFile, OSError, UnicodeDecodeError, schema.SchemaError):
        return Floor((), where)
    return Floor(tuple(float(s) for s in data["spreads"])[-KEPT:], where)


def save(floor: Floor, host: str | None = None) -> None:
    """Keep `floor` where it was loaded from; a folder that cannot be written keeps nothing (the
    search goes on with the floor in memory)."""
    if floor.path is None:
        return
    text = json.dumps({"host": host or host_name(), "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "spreads": [round(s, 5) for s in floor.spreads]})
    try:
        floor.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(floor.path, text)
    except OSError:
        pass
