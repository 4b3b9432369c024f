"""Warm start: a new study on a host class where other studies ran starts with what won there.

What wins on a host class carries across models and batch sizes more often than not (int8 through
the runtime that runs it best, the allocator, the OpenMP runtime); a cold search spends its first
dozen trials finding that again. So a study that holds no trial yet looks at the other studies of
its storage (and, for the default SQLite files, the other `studies/*.db`) that ran on this host
class with the same objective, and takes from each what won: the trial its confirmation recommended
and the references it could not tell apart from it (the best expert recipe or peer, undecided or
shown equivalent: on another model either may be the faster), or, unconfirmed, its best feasible
trial. A recipe is taken as the recipe, its knobs alone (proposed under its name, so the comparisons
with the recipes still find it). The `MOST` fastest of those configurations (by their
speedup over their own baseline), where this study's space can sample them exactly, are proposed
right after the baseline, before the experts' recipes (`proposals.Proposer.warm`), each enqueued
into Optuna like every fixed proposal and recorded as such (`warm_start`: the study and trial it
came from). They are trials like any other: they count toward --trials and are measured here.
`--no-warm-start` starts cold.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import AutotuneError, ConfigError
from autotune.config.knobs import Config
from autotune.config.space import SearchSpace, config_of_params
from autotune.study import records, storage

MOST = 3  # configurations a study starts with
FILES = 50  # the most recent other study files read (each is opened: a folder of hundreds stays quick)
ATTR = "warm_start"  # on an enqueued trial: where its configuration won


@dataclass(frozen=True)
class Winner:
    """A configuration that won in another study on this host class."""

    study: str
    trial: int
    config: Config
    speedup: float | None
    confirmed: bool  # its study's confirmation recommended it
    tied: str = ""  # else a reference the confirmation could not tell from the one it recommended: how it stood

    def to_json(self) -> dict[str, Any]:
        """What a warm-started trial records of where its configuration won (`ATTR`)."""
        return {"study": self.study, "trial": self.trial, "config": self.config.describe(), "speedup": self.speedup,
                "confirmed": self.confirmed, **({"tied": self.tied} if self.tied else {})}

    def describe(self) -> str:
        how = f"{self.tied} against its confirmed winner" if self.tied else \
            "confirmed" if self.confirmed else "best, unconfirmed"
        fast = f", {self.speedup:.2f}x its baseline" if self.speedup else ""
        return f"study {self.study}'s trial {self.trial} ({how}{fast})"


def winners(study: optuna.Study, url: str, studies_dir: Path, host_class: Mapping[str, Any],
            space: SearchSpace) -> list[Winner]:
    """What won in other studies of this host class and objective, the `MOST` fastest that this
    study's space samples exactly; none for a study that measured more than its baseline (a resumed
    search keeps the start it had)."""
    trials = study.get_trials(deepcopy=False)
    if any(t.state.is_finished() and not t.user_attrs.get("baseline") for t in trials):
        return []
    objective = study.user_attrs.get("objective")
    found: dict[str, Winner] = {}
    for other in _others(study.study_name, url, studies_dir):
        attrs = other.user_attrs
        if attrs.get(records.HOST_CLASS) != dict(host_class) or attrs.get("objective") != objective:
            continue
        for winner in _winners(other):
            if not _fits(space, winner.config):
                continue
            kept = found.get(winner.config.identity())
            if kept is None or (winner.speedup or 0) > (kept.speedup or 0):
                found[winner.config.identity()] = winner
    return sorted(found.values(), key=lambda w: -(w.speedup or 0))[:MOST]


def note(chosen: Sequence[Winner]) -> list[str]:
    """What a warm start will measure, for the search's notes (none without one)."""
    if not chosen:
        return []
    return [f"warm start: the first {len(chosen)} trials after the baseline measure what won on this host class: "
            + "; ".join(f"{w.config.describe()} from {w.describe()}" for w in chosen)
            + " (--no-warm-start to start cold)"]


def summary(trials: Sequence[FrozenTrial], best: FrozenTrial | None) -> dict[str, Any] | None:
    """What the warm start gave a search: the trials it enqueued and where they came from, whether
    the best trial is one of them, and at which trial the best configuration was first measured
    (a cold search of the same space would have to find it by sampling: benchmarks/RESULTS.md
    counts both). None when the study did not start warm."""
    warm = [t for t in trials if ATTR in t.user_attrs]
    if not warm:
        return None
    first = None
    if best is not None:
        wanted = records.identity(best)
        first = min((t.number for t in trials if "config" in t.user_attrs and records.identity(t) == wanted),
                    default=best.number)
    return {"enqueued": [{"trial": t.number, **t.user_attrs[ATTR]} for t in warm],
            "best_from_warm_start": best is not None and any(records.identity(t) == records.identity(best)
                                                             for t in warm if "config" in t.user_attrs),
            "best_first_measured_at": first}


TIED = ("undecided", "equivalent")  # a reference's status against the recommended trial: not told apart


def _winners(study: optuna.Study) -> list[Winner]:
    """What won in `study`: the trial its confirmation recommended and the references (best recipe,
    best peer) it could not tell apart from it, else its best feasible trial; never the baseline
    (the defaults win nothing to start from)."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    confirmation = study.user_attrs.get("confirmation") or {}
    recommended = confirmation.get("recommended_trial")
    chosen = [t for t in trials if t.number == recommended]
    confirmed = bool(chosen)
    tied: dict[int, str] = {}
    if confirmed:
        tied = {int(ref["trial"]): str(ref["status"]) for ref in (confirmation.get("against_recipe"),
                                                                   confirmation.get("against_peer"))
                if isinstance(ref, dict) and ref.get("status") in TIED and ref.get("trial") != recommended}
        chosen += [t for t in trials if t.number in tied]
    else:
        chosen = records.best_trials(study)[:1]
    found = (_winner(study, t, confirmed and t.number not in tied, tied.get(t.number, "")) for t in chosen)
    return [w for w in found if w is not None]


def _winner(study: optuna.Study, chosen: FrozenTrial, confirmed: bool, tied: str = "") -> Winner | None:
    if chosen.user_attrs.get("baseline") or not chosen.params:
        return None
    try:
        config = config_of_params(chosen.params)
    except (ConfigError, ValueError, KeyError):
        return None
    if not config.values:
        return None
    speedup = records.speedup(chosen, "speedup_latency" if study.user_attrs.get("objective") == "latency"
                              else "speedup_throughput", study.user_attrs)
    return Winner(study.study_name, chosen.number, config, speedup, confirmed, tied)


def _fits(space: SearchSpace, config: Config) -> bool:
    """Whether this study's space samples exactly `config`'s knobs from its parameters (a knob it
    does not offer, or a value outside its range, is no configuration to start with); a recipe's
    knobs alone, as the search runs a recipe."""
    probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    with storage.quiet_optuna():
        probe.enqueue_trial(space.params(config))
        try:
            return space.sample(probe.ask(), only=config) == config
        except (ConfigError, ValueError):
            return False


def _others(name: str, url: str, studies_dir: Path) -> Iterator[optuna.Study]:
    """The other studies of this storage, and of the other study files in `studies_dir` (the most
    recent `FILES`); a file that is no study database, or cannot be read, is passed over unread
    (`storage.check_existing`: Optuna would make a study database of it): not this search's to judge."""
    urls = [url]
    if url.startswith(storage.SQLITE):
        this = Path(url[len(storage.SQLITE):]).resolve()
        files = sorted((p for p in Path(studies_dir).glob("*.db") if p.resolve() != this and p.is_file()),
                       key=lambda p: p.stat().st_mtime, reverse=True)[:FILES]
        urls += [f"{storage.SQLITE}{p.resolve()}" for p in files]
    for where in urls:
        try:
            if where != url:
                storage.check_existing(where)
                storage.check_intact(where)
            with storage.storage_errors(where):
                names = optuna.get_all_study_names(where)
                studies = [storage.load(other, where) for other in names if (where, other) != (url, name)]
        except (AutotuneError, OSError):
            continue
        yield from studies
