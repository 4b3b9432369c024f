"""A search's live progress for people: each trial as it starts and ends, what its instances are
doing, the best so far and the time left.
"""

from __future__ import annotations

from typing import Any

from autotune.cli import display


class SearchProgress:
    """One line per finished trial (stderr), a live status line while a trial runs on a terminal:
    which replicate, and what its processes are doing (`run_started`, `phase`)."""

    def __init__(self, objective: str, quiet: bool = False, replicates: int = 1, warm: bool = False) -> None:
        self.objective = objective
        self.quiet = quiet
        self.replicates, self.warm = replicates, warm
        self._status: Any = None
        self._head = self._tail = ""
        self._runs = 0

    def __call__(self, event: Any) -> None:
        if self.quiet:
            return
        if event.kind == "start":
            self._start(event)
        elif event.kind == "baseline":
            display.err.print(f"note: {event.note}", markup=False, highlight=False, soft_wrap=True)
        else:
            self._stop()
            display.err.print(self._line(event), markup=False, highlight=False, soft_wrap=True)

    def _start(self, event: Any) -> None:
        if not display.err.is_terminal:
            return
        what = "baseline (PyTorch defaults)" if not event.config.values else event.config.describe()
        self._head, self._tail = f"trial {event.number} ({event.finished + 1}/{event.total}): {what}", _remaining(event)
        self._runs = 0
        self._status = display.err.status(self._text(""))
        self._status.start()

    def run_started(self) -> None:
        """The trial starts its next run: one replicate, or all of them in one warmed process."""
        self._runs += 1
        self.phase(0, "starting")

    def phase(self, index: int, phase: str) -> None:
        """What instance `index` of the running trial is doing (`children.PhaseCallback`)."""
        if self._status is not None and index == 0:  # instances move together: the first speaks for all
            self._status.update(self._text(phase))

    def _text(self, phase: str) -> str:
        return "  ".join(part for part in (self._head, _replicate(self._runs, self.replicates, self.warm),
                                           phase, self._tail) if part)

    def _stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _line(self, event: Any) -> str:
        head = f"trial {event.number:>3} [{event.finished}/{event.total}]"
        outcome = event.outcome
        state = outcome.state.name
        if state == "COMPLETE":
            text = _values(self.objective, outcome.values)
            if outcome.duplicate_of is not None:
                text += f" (same config as trial {outcome.duplicate_of})"
            elif outcome.measurement is not None:
                m = outcome.measurement
                text += f" ±{m.spread:.0%} IQR, {len(m.runs)} runs" + (f" NOISY ({m.noisy_reason})" if m.noisy else "")
        elif state == "PRUNED":
            text = f"pruned: {outcome.reason}"
        elif outcome.undecided is not None:
            text = f"UNDECIDED: {outcome.reason}"
        else:
            text = f"FAILED: {outcome.reason}"
        if outcome.retry_of is not None:
            text += f" (retry of trial {outcome.retry_of})"
        best = ""
        if event.best is not None:
            speed = event.speedups.get("speedup_" + ("throughput" if self.objective == "throughput"
                                                    else "latency")) or 1.0
            best = f" | best: trial {event.best.number} {_values(self.objective, event.best.values)} ({speed:.2f}x)"
        config = event.config.describe() if event.config.values else "baseline (PyTorch defaults)"
        config = f"recipe {event.recipe}: {config}" if event.recipe else config
        return f"{head} {text} | {config}{best} | {_remaining(event)}"

    def close(self) -> None:
        self._stop()


def _replicate(runs: int, planned: int, warm: bool) -> str:
    """Which replicate the trial's `runs`-th run measures (warm: the first measures all planned)."""
    if runs == 0:
        return ""
    if warm and planned > 1 and runs == 1:
        return f"replicates 1-{planned} (one warmed process):"
    number = runs + (planned - 1 if warm and planned > 1 else 0)
    return f"replicate {number} (extra: noisy):" if number > planned else f"replicate {number}/{planned}:"


def _values(objective: str, values: Any) -> str:
    if objective == "latency":
        return f"{values[0]:.2f} ms"
    if objective == "throughput":
        return f"{values[0]:.2f} items/s"
    return f"{values[0]:.2f} ms, {values[1]:.2f} items/s"


def _remaining(event: Any) -> str:
    """Elapsed time of this session, and the time left at this session's pace (a resumed study's
    earlier trials took none of this session's time)."""
    elapsed = display.clock(event.elapsed_s)
    done = event.finished - event.finished_before
    left = event.elapsed_s / done * max(event.total - event.finished, 0) if done > 0 else None
    return f"elapsed {elapsed}" + (f", ~{display.clock(left)} left" if left is not None else "")
