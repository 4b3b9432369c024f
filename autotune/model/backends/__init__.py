"""The backends, registered: every way autotune runs a model is one module implementing
`base.Backend`, and one line below. The knob table (its `backend` choices, each backend's own
knobs, which precisions go with which backend, which run under a preloaded malloc), the recipes,
the kernel probe, the artifacts and the cache all read this registry.
"""

from __future__ import annotations

from autotune.model.backends import inductor, llamacpp, onnxruntime, openvino, pytorch
from autotune.model.backends.base import Backend, Generation, Packages

__all__ = ["REGISTRY", "Backend", "Generation", "Packages", "generating", "get", "installed", "needs", "not_installed",
           "of_runtime"]

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


def generating() -> tuple[Backend, ...]:
    """The backends that generate text, in the registry's order (read when called, so a backend
    registered later is among them)."""
    return tuple(b for b in REGISTRY if b.generation is not None)


def needs(name: str, generates: bool = False) -> Packages | None:
    """What `backend=name` needs installed to run a model, or with `generates` to generate text
    (None: nothing beyond torch). Each concern needs only its own packages."""
    backend = get(name)
    if generates:
        return backend.generation.packages if backend.generation else None
    return backend.packages


def missing(name: str, generates: bool = False) -> tuple[str, ...]:
    """The modules `name` needs (for generating text with `generates`) that this environment lacks."""
    packages = needs(name, generates)
    return packages.missing() if packages else ()


def installed(name: str, generates: bool = False) -> bool:
    return not missing(name, generates)


def not_installed(name: str, generates: bool = False) -> str:
    """What to say when `backend=name` is asked for and what it needs is missing."""
    packages = needs(name, generates)
    assert packages is not None
    task = " to generate text" if generates else ""
    return (f"backend={name} needs {packages.name}{task}, and this environment lacks "
            f"{', '.join(missing(name, generates))}; install it with {packages.install}")
