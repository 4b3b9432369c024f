"""The one interface every backend implements: PyTorch's own ways to run a model (eager, TorchScript,
AOTInductor) and the runtimes a model is converted to (OpenVINO, ONNX Runtime) alike.

A backend says what it needs installed (`packages`), which precisions it runs, the knobs of its
own (sampled only with it), how it builds an artifact from a model and loads one back, the recipes
its users run, and how the kernel probe runs its runtime's operations. Everything else (the knob
table, the search space's conditions, the recipes, the probe, the cache) reads these, so adding a
runtime is one module and a line in the registry (`autotune.model.backends`).

A backend that generates text (`--task generate`) names that other concern in `generation`: the
module that builds its generator and the packages that module needs, so each concern requires only
its own (forward OpenVINO needs openvino and nncf; only its generation needs openvino-genai).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.model.kernels import Kernel
from autotune.model.knobdefs import Knob, KnobValue, ModelSettings, Precision

# A probe kernel made ready: the call to time at a thread count, and what the runtime says it ran in.
Ready = tuple[Callable[[int], Callable[[], Any]], str]
OPS = ("conv", "matmul")  # the kernel probe's operations (`autotune.model.kernels`)


@dataclass(frozen=True)
class Packages:
    """What a backend needs installed beyond torch: the distributions (the first is the runtime
    itself, whose version keys its artifacts), the modules they provide, and the extra that installs them."""

    name: str
    extra: str
    distributions: tuple[str, ...]
    modules: tuple[str, ...]

    @property
    def install(self) -> str:
        return f"pip install 'autotune[{self.extra}]' (or: pip install {' '.join(self.distributions)})"

    def missing(self) -> tuple[str, ...]:
        """The modules this environment lacks (found without importing them: OpenVINO's import alone
        takes a second)."""
        return tuple(m for m in self.modules if importlib.util.find_spec(m) is None)

    def versions(self) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        for name in self.distributions:
            try:
                found[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                found[name] = None
        return found


@dataclass(frozen=True)
class Generation:
    """A backend's text generation: the module of `autotune.model.generate` that builds its generator
    (`build(Build, setup) -> Generator`, the contract `autotune.model.generate.base` states), what it
    needs installed (None: PyTorch's own), and whether it converts the model's `save_pretrained`
    folder (a peer) or runs the module itself (PyTorch)."""

    module: str
    packages: Packages | None = None
    reads_folder: bool = True

    def version(self) -> str | None:
        """Its runtime's version (its first distribution's); None for PyTorch's own or where it is
        not installed: what it converts is keyed by it."""
        return self.packages.versions()[self.packages.distributions[0]] if self.packages else None


@dataclass(frozen=True)
class Quantized:
    """How precision=int8 gets its graph (`quantize.quantized_export` on the calibration batches,
    bound by `deploy`), and what names those batches in the artifact's key. Batches the caller gave
    (`given`) are saved beside the artifact; a caller who gave none gets the ones saved for this very
    model, knobs and inputs (`rebind` binds the same quantizer to them), so that it loads the artifact
    they made: the one the study measured. Conversion makes it (`autotune.model.convert`); a backend's
    `build` takes it."""

    export: Callable[[Any, Any, Path, dict[str, Any]], Any]  # (model, example, folder, description) -> ExportedProgram
    calibration: str
    load: Callable[[Path], Any]  # a quantized graph `torch.export.save`d -> ExportedProgram
    batches: Sequence[Any] = ()  # the calibration batches, which OpenVINO's and ONNX Runtime's quantizers observe
    given: bool = True  # the caller's own batches; False: the example alone, for want of any
    rebind: Callable[[Sequence[Any]], Quantized] | None = None


class Backend:
    """A way to run a model. Subclasses set the class attributes and override what differs."""

    name: str = ""  # what `backend=` takes
    runtime: str = "torch"  # whose kernels run it: the kernel probe's runtime
    label: str = "PyTorch"  # how notes name that runtime
    summary: str = ""  # what it does, in a phrase: the `backend` knob's help
    precisions: tuple[Precision, ...] = ("fp32",)
    generates: tuple[Precision, ...] = ()  # the precisions it generates text with (--task generate); () none
    generation: Generation | None = None  # how it generates text, where it does
    packages: Packages | None = None  # what running a model (not generating) needs; None: PyTorch's own
    knobs: tuple[Knob, ...] = ()  # its own settings (`own` adds their condition)
    suffix: str = ""  # its artifact's file suffix ("" where it saves none)
    preloaded_malloc: bool = True  # may run under a malloc preloaded with LD_PRELOAD
    int8_remedy: str = ""  # how its int8 conversion avoids saturated 16-bit sums, where the probe finds them
    compiled_for: tuple[str, ...] = ()  # the knobs each of whose values is a compile of its own (a search predicts one)

    @property
    def peer(self) -> bool:
        """Another runtime than PyTorch: what a user would pick instead, a peer of the search."""
        return self.runtime != "torch"

    def own(self, knob: Knob) -> Knob:
        """`knob` applying only with this backend (and whatever else its condition says)."""
        from dataclasses import replace

        return replace(knob, only_when=(("backend", (self.name,)), *knob.only_when), model=True)

    # -- building and loading ----------------------------------------------------------------------

    def compiles(self, knobs: ModelSettings) -> bool:
        """Whether `knobs` make it save an artifact that every process loads."""
        return bool(self.suffix)

    def artifact_kind(self) -> str:
        """The artifact file's name prefix."""
        return self.name

    def version(self) -> str | None:
        """Its runtime's version (its first distribution's), None for PyTorch's own or where it is
        not installed: a runtime's artifacts are keyed by it."""
        return self.packages.versions()[self.packages.distributions[0]] if self.packages else None

    def saved_knobs(self, knobs: ModelSettings) -> dict[str, Any]:
        """The knobs its artifact is keyed by."""
        raise NotImplementedError

    def described(self, knobs: ModelSettings) -> dict[str, Any]:
        """What else its artifact's key holds (a runtime's version, a thread count baked in)."""
        return {}

    def build(self, model: Any, example: Any, knobs: ModelSettings, setup: dict[str, Any], path: Path,
              described: dict[str, Any], quantized: Quantized | None) -> Any:
        """Save the artifact at `path` (with `described` beside it); returns a callable to run
        instead where the model cannot be saved (recorded in `setup`), else None."""
        raise NotImplementedError

    def rebuildable(self, folder: Path, meta: dict[str, Any], quantized: Quantized | None) -> bool:
        """Whether `build` can make the artifact without the model (from what is kept in `folder`)."""
        return False

    def load(self, path: Path, knobs: ModelSettings, example: Any) -> Any:
        """The artifact at `path`, ready to call like the module it came from."""
        raise NotImplementedError

    def files(self, path: Path) -> tuple[Path, ...]:
        """Every file of the artifact at `path` but its description (OpenVINO's weights beside its .xml)."""
        return (path,)

    # -- what a search runs --------------------------------------------------------------------------

    def recipes(self, cores: int) -> tuple[tuple[str, dict[str, KnobValue]], ...]:
        """The recipes its users run, by name: the knobs each sets (the backend itself included)."""
        return ()

    def generation_recipes(self, cores: int) -> tuple[tuple[str, dict[str, KnobValue]], ...]:
        """The recipes its users run to generate text (--task generate), by name."""
        return ()

    # -- the kernel probe ----------------------------------------------------------------------------

    def probe_ops(self, precision: Precision) -> tuple[str, ...]:
        """The probe's operations this runtime runs `precision` on."""
        return OPS

    def probe_kernel(self, kernel: Kernel, remedy: bool) -> Ready:
        """The probe's `kernel` made ready in this runtime (`remedy`: int8 with `int8_remedy`).
        Only the first registered backend of a runtime is asked: the probe measures runtimes."""
        raise NotImplementedError
