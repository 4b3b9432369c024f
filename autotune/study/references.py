"""The trials a verdict holds the winner against: the best expert recipe and the best peer.

A recipe trial records its name (`recipe`) and its knobs (`config`). Its backend says which of the
two it is: an expert recipe runs the model in PyTorch (a backend of `TORCH_BACKENDS`), a peer
recipe in another runtime a user would pick instead (`PEER_BACKENDS`: OpenVINO, ONNX Runtime).
Only recipe trials are references: a sampled OpenVINO trial is autotune's own tuning of that
runtime, a contender like any other, while the peer stands for what its runtime gives by its
documented path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.base.errors import ConfigError
from autotune.config.knobs import KNOBS, Config
from autotune.model.knobs import PEER_BACKENDS
from autotune.study import records


def backend_of(described: str, params: Mapping[str, Any] | None = None) -> str:
    """The backend a recorded configuration (`config`, as `Config.describe` wrote it) runs; for a
    description this autotune can no longer read, the trial's `params` say."""
    try:
        config = Config.from_assignments([] if described in ("", "defaults") else described.split())
    except ConfigError:
        return str((params or {}).get("backend", KNOBS["backend"].default))
    return str(config.get("backend"))


def runs_in_peer(described: str, params: Mapping[str, Any] | None = None) -> bool:
    """Whether a recorded configuration runs in another runtime than PyTorch (OpenVINO, ONNX Runtime)."""
    return backend_of(described, params) in PEER_BACKENDS


def is_peer(trial: FrozenTrial) -> bool:
    """Whether the trial ran in another runtime than PyTorch."""
    return runs_in_peer(str(trial.user_attrs.get("config", "defaults")), trial.params)


def best_recipe(study: optuna.Study, speedup: str) -> FrozenTrial | None:
    """The completed expert recipe (a PyTorch backend) with the largest `speedup` attribute
    (speedup_latency or speedup_throughput), or None when none completed."""
    return _best(study, speedup, peer=False)


def best_peer(study: optuna.Study, speedup: str) -> FrozenTrial | None:
    """The completed peer recipe (another runtime) with the largest `speedup` attribute, or None
    when none completed (its runtime is not installed, or it failed)."""
    return _best(study, speedup, peer=True)


def _best(study: optuna.Study, speedup: str, peer: bool) -> FrozenTrial | None:
    """By the speedup as the study knows it now (`records.speedup`: over a baseline measured again
    when it was noisy), so that recipes measured before and after the re-measure rank alike; only one
    within the study's limits (`feasible`), as no other can be recommended."""
    attrs = study.user_attrs
    ran = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
           if t.user_attrs.get("recipe") and speedup in t.user_attrs and is_peer(t) == peer
           and t.user_attrs.get("feasible", True)]
    return max(ran, key=lambda t: records.speedup(t, speedup, attrs) or 0.0, default=None)
