"""What a study keeps of its confirmations: every verdict in order, the latest as `confirmation`,
and how each reader names the one it shows ("confirmation 2 of 3").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna


def record(study: optuna.Study, verdict: Mapping[str, Any]) -> dict[str, Any]:
    """Keep `verdict` as the study's next confirmation: `confirmation_N` (N = 1, 2, ... in order)
    stays, and `confirmation` is always the latest, numbered, so that confirming until one passes
    leaves every earlier verdict in the study."""
    numbered = {**verdict, "number": count(study.user_attrs) + 1}
    study.set_user_attr(f"confirmation_{numbered['number']}", numbered)
    study.set_user_attr("confirmations", numbered["number"])
    study.set_user_attr("confirmation", numbered)
    return numbered


def count(attrs: Mapping[str, Any]) -> int:
    """How many confirmations a study has had (one, for a study from before they were all kept)."""
    return int(attrs.get("confirmations", 1 if attrs.get("confirmation") else 0))


def kept(study: optuna.Study) -> list[dict[str, Any]]:
    """Every verdict the study kept, in order; a study from before they were kept has its one."""
    attrs = study.user_attrs
    found = [attrs[f"confirmation_{n}"] for n in range(1, count(attrs) + 1) if f"confirmation_{n}" in attrs]
    return found or ([attrs["confirmation"]] if attrs.get("confirmation") else [])


def number(attrs: Mapping[str, Any]) -> int | None:
    """Which confirmation the study's latest is (None: it has none)."""
    latest = attrs.get("confirmation")
    return int(latest.get("number", 1)) if latest else None


def which(attrs: Mapping[str, Any]) -> str:
    """'confirmation 2 of 3': the one shown (the latest) among all the study has had."""
    return f"confirmation {number(attrs)} of {count(attrs)}"


def heading(significant: bool, shown: int, of: int) -> str:
    """'Confirmed: ' or 'Not confirmed: ', naming which (`shown`) of the study's `of` confirmations it is."""
    named = f" (confirmation {shown} of {of})" if of > 1 else ""
    return f"{'Confirmed' if significant else 'Not confirmed'}{named}: "


def recommended(verdict: Mapping[str, Any]) -> int:
    """The trial a verdict recommends (what `export` writes): the winner, the expert recipe it is
    equivalent to (the simpler) or that is faster, or the peer that is faster; undecided at the cap,
    the better estimate (search/against_recipe.py); a verdict from before recipes were compared
    recommends its winner."""
    return int(verdict.get("recommended_trial", verdict["winner_trial"]))


# How the outcomes of a verdict read, against whom: beats, slower, equivalent, undecided.
OUTCOME_WORDS = {"beats": "beats", "slower": "is slower than", "equivalent": "is equivalent to",
                 "undecided": "is undecided against"}


def outcomes(verdict: Mapping[str, Any]) -> str:
    """The verdict's outcome against each reference in a line ("" for a verdict from before they
    were four): 'the winner beats the baseline; is equivalent to the expert recipe (trial 3); is
    undecided against the best peer (trial 7) after 20 rounds'."""
    if "outcome" not in verdict or verdict["outcome"] is None:
        return ""
    after = f" after {verdict['rounds']} rounds"
    first = "the winner" if verdict["significant"] else "the closest candidate"
    said = [f"{first} {_word(verdict['outcome'], 'the baseline', after)}"]
    for key, named in (("against_recipe", "the expert recipe"), ("against_peer", "the best peer")):
        found = verdict.get(key) or {}
        if found.get("status") in OUTCOME_WORDS:
            whom = f"{named} (trial {found['trial']})"
            said.append(_word(found["status"], whom, after))
    return "; ".join(said)


def _word(outcome: str, whom: str, after: str) -> str:
    return f"{OUTCOME_WORDS[outcome]} {whom}{after if outcome == 'undecided' else ''}"


def buckets_of(verdict: Mapping[str, Any], trial: int) -> dict[str, float]:
    """Per sequence-length bucket, trial `trial`'s p50 ms over the verdict's rounds ({} when the
    verdict did not run it, or ran no buckets): the baseline, a candidate, or the expert recipe or
    peer it was compared with."""
    if trial == verdict.get("baseline_trial"):
        return dict(verdict.get("baseline_buckets") or {})
    rows = [*verdict.get("candidates", []),
            *(found["against_baseline"] for kind in ("against_recipe", "against_peer")
              if (found := verdict.get(kind)) and "against_baseline" in found)]
    return next((dict(row.get("buckets") or {}) for row in rows if row.get("trial") == trial), {})


def buckets_sentence(verdict: Mapping[str, Any], trial: int) -> str:
    """'trial 18 per bucket, median p50 over the 10 rounds: 32 tokens 9.05 ms, ...' ('' without
    buckets): the speed a deployment of `trial` should serve each bucket at."""
    found = buckets_of(verdict, trial)
    return (f"trial {trial} per bucket, median p50 over the {verdict['rounds']} rounds: "
            + ", ".join(f"{length} tokens {ms:.2f} ms" for length, ms in found.items())) if found else ""
