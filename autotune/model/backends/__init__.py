"""The backends, registered: every way autotune runs a model is one module implementing
`base.Backend`, and one line below. The knob table (its `backend` choices, each backend's own
knobs, which precisions go with which backend, which run under a preloaded malloc), the recipes,
the kernel probe, the artifacts and the cache all read this registry.
"""

from __future__ import annotations

from autotune.model.backends import inductor, llamacpp, onnxruntime, openvino, pytorch
from autotune.model.backends.base import Backend, Packages

__all__ = ["REGISTRY", "Backend", "Packages", "get", "installed", "not_installed", "of_runtime"]

REGISTRY: tuple[Backend, ...] = (
    pytorch.EAGER,
    pytorch.TORCHSCRIPT,
    inductor.INDUCTOR,
    openvino.OPENVINO,
    onnxruntime.ONNXRUNTIME,
    llamacpp.LLAMACPP,
)
NAMES = tuple(b.name for b in REGISTRY)
TORCH_BACKENDS = tuple(b.name for b in REGISTRY if not b.peer)  # PyTorch's own ways to run a model
PEER_BACKENDS = tuple(b.name for b in REGISTRY if b.peer)  # the runtimes a model is converted to
RUNTIME_OF = {b.name: b.runtime for b in REGISTRY}


def get(name: str) -> Backend:
    """The backend `backend=name` runs (a name the knob table checked)."""
    return next(b for b in REGISTRY if b.name == name)


def of_runtime(runtime: str) -> Backend:
    """The backend that runs the kernel probe's operations for `runtime`: its first registered."""
    return next(b for b in REGISTRY if b.runtime == runtime)


def missing(name: str) -> tuple[str, ...]:
    """The modules `name` needs that this environment lacks (none for PyTorch's backends)."""
    packages = get(name).packages
    return packages.missing() if packages else ()


def installed(name: str) -> bool:
    return not missing(name)


def not_installed(name: str) -> str:
    """What to say when `backend=name` is asked for and its runtime is missing."""
    packages = get(name).packages
    assert packages is not None
    return (f"backend={name} needs {packages.name}, and this environment lacks {', '.join(missing(name))}; "
            f"install it with {packages.install}")
