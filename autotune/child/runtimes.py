"""The runtimes other than PyTorch that a model can be converted to (backend=openvino,
onnxruntime): whether this environment has them, their versions, and how to install them. Found
without importing them (OpenVINO's import alone takes a second)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Runtime:
    """A backend's runtime: the distributions it needs (the first is the runtime itself, whose
    version keys its artifacts) and the command that installs them."""

    backend: str
    name: str
    distributions: tuple[str, ...]
    modules: tuple[str, ...]

    @property
    def install(self) -> str:
        return f"pip install 'autotune[{self.backend}]' (or: pip install {' '.join(self.distributions)})"


RUNTIMES = {
    # NNCF quantizes for OpenVINO; onnx and onnxscript are what torch.onnx.export(dynamo=True) needs.
    "openvino": Runtime("openvino", "OpenVINO", ("openvino", "nncf"), ("openvino", "nncf")),
    "onnxruntime": Runtime("onnxruntime", "ONNX Runtime", ("onnxruntime", "onnx", "onnxscript"),
                           ("onnxruntime", "onnx", "onnxscript")),
}


def missing(backend: str) -> tuple[str, ...]:
    """The modules `backend` needs that this environment lacks (none for PyTorch's backends)."""
    runtime = RUNTIMES.get(backend)
    return tuple(m for m in runtime.modules if importlib.util.find_spec(m) is None) if runtime else ()


def installed(backend: str) -> bool:
    return not missing(backend)


def version(backend: str) -> str | None:
    """The runtime's version (its first distribution's), None when it is not installed."""
    try:
        return importlib.metadata.version(RUNTIMES[backend].distributions[0])
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Every runtime's distributions and their versions (None: not installed), for `doctor`."""
    found: dict[str, str | None] = {}
    for runtime in RUNTIMES.values():
        for name in runtime.distributions:
            try:
                found[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                found[name] = None
    return found


def not_installed(backend: str) -> str:
    """What to say when `backend` is asked for and its runtime is missing."""
    runtime = RUNTIMES[backend]
    return (f"backend={backend} needs {runtime.name}, and this environment lacks {', '.join(missing(backend))}; "
            f"install it with {runtime.install}")
