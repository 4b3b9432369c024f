"""Env files written by hand for a test: whole files of the current format (`envfile`), holding
what the test gives besides what every such file holds."""

from __future__ import annotations

from autotune.model import apply, envfile
from autotune.model.knobs import ModelKnobs


def hand_written(**variables: str) -> str:
    """A whole env file: the header, the variables every file sets (a one-process eager resnet18 by
    default), `variables` (NAME=value; they win), and the last line."""
    configuration = {envfile.MODEL_VAR: "resnet18", envfile.BATCH_SIZE_VAR: "1", envfile.knob_var("backend"): "eager",
                     envfile.BINDING_VAR: "none", envfile.INSTANCE_CPUS_VAR: "",
                     envfile.INSTANCE_NODES_VAR: ""} | variables
    return envfile.render("hand-written for a test", [], [], {}, configuration, [])


def with_line(text: str, line: str) -> str:
    """`text` (a whole env file) with `line` added before its last line, so that it stays whole."""
    return text.replace(envfile.END, f"{line}\n{envfile.END}")


def knob_vars(knobs: ModelKnobs) -> dict[str, str]:
    """The variables an export writes for these model knobs: the backend, and each other knob that is
    not at its default (a format-2 file sets a knob once, and only where it is set)."""
    defaults = apply.to_env(ModelKnobs())
    backend = envfile.knob_var("backend")
    return {var: value for var, value in apply.to_env(knobs).items() if var == backend or value != defaults[var]}
