"""What the runtimes a model is converted to share (OpenVINO, ONNX Runtime: the peers): the
model converted through the runtime's official path, saved once as an artifact, and run by that
runtime behind a callable that takes and returns torch tensors, so that a user's program does not
change when the winner is another runtime. What is saved depends only on the model, the inputs, the
precision, the runtime and the CPU; the runtime's settings apply when it is loaded, so every
setting loads the same file.

torch and the runtimes are imported inside functions.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from autotune.model.artifacts import DescriptionError, description, save_artifact
from autotune.model.backends.base import Backend, Quantized
from autotune.model.batches import split
from autotune.model.errors import ApplyError, failed_op
from autotune.model.knobdefs import ModelSettings

CONVERT_FAILED = "could not convert the model"  # how a converter's refusal is told, child to harness
Run = Callable[[list[Any]], list[Any]]  # numpy arrays in the model's input order -> its outputs, flat


class Converter(Backend):
    """A backend that converts the model to another runtime. Subclasses say how it is saved (`save`)
    and how the runtime runs the saved file with the knobs' settings (`runner`)."""

    preloaded_malloc = False  # set True where the runtime tolerates a malloc preloaded with LD_PRELOAD

    def saved_knobs(self, knobs: ModelSettings) -> dict[str, Any]:
        """The runtime's settings apply when it loads the file, so one file serves them all (bf16 too:
        a runtime's inference precision loads the fp32 file)."""
        precision = "fp32" if knobs.precision == "bf16" else knobs.precision
        saved: dict[str, Any] = {"backend": self.name, "precision": precision}
        if knobs.int8_fallback:  # each count of layers kept its own file; 0 keys as before the knob existed
            saved["int8_fallback"] = knobs.int8_fallback
        return saved

    def described(self, knobs: ModelSettings) -> dict[str, Any]:
        return {"runtime": self.version()}

    def build(self, model: Any, example: Any, knobs: ModelSettings, setup: dict[str, Any], path: Path,
              described: dict[str, Any], quantized: Quantized | None) -> Any:
        """Convert `model` (quantized on the calibration batches for int8) and save it; the output's
        structure goes into the description first, which is written with the file."""
        batches = quantized.batches if quantized else ()
        described["outputs"] = output_spec(model, example)

        def write(tmp: Path) -> None:
            with quiet_stdout():
                self.save(model, example, knobs, tmp, path, batches, setup, described)

        save_artifact(path, write, described)
        return None

    def save(self, model: Any, example: Any, knobs: ModelSettings, tmp: Path, path: Path,
             calibration: Sequence[Any], setup: dict[str, Any], described: dict[str, Any]) -> None:
        """Write the converted model to `tmp`, which becomes `path`; what it records of itself goes
        into `setup`, and what its description keeps into `described` (written after it)."""
        raise NotImplementedError

    def runner(self, path: Path, knobs: ModelSettings, threads: int) -> Run:
        raise NotImplementedError

    def load(self, path: Path, knobs: ModelSettings, example: Any) -> Any:
        """The saved model run by its runtime with the knobs' settings and this process's thread count,
        called like the module it came from (keyword inputs in any order: the runtimes take them in
        the example's)."""
        import torch
        from torch.utils import _pytree

        try:
            spec = _pytree.treespec_loads(description(path)["outputs"])
        except (DescriptionError, ValueError, KeyError, TypeError):
            raise ApplyError(f"the description of {path} is missing or damaged; delete {path.name} and run again "
                             f"to convert the model anew") from None
        run = self.runner(path, knobs, torch.get_num_threads())
        return Converted(run, spec, tuple(example) if isinstance(example, dict) else ())


def output_spec(model: Any, example: Any) -> str:
    """How the model's output tensors nest (a tensor, a tuple, a dict ...), as torch's pytree
    serialises it: the runtimes return a flat list, which is put back into this shape."""
    import torch
    from torch.utils import _pytree

    args, kwargs = split(example)
    with torch.no_grad():
        output = model(*args, **kwargs)
    spec = _pytree.tree_structure(output)
    try:
        return _pytree.treespec_dumps(spec)
    except Exception:
        raise ApplyError(f"the model returns {type(output).__name__}, whose structure cannot be saved with a "
                         f"converted model; let it return a tensor, a tuple, a list or a dict of tensors") from None


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """The converters print progress on stdout; it belongs with the rest of their talk, on stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def failed_at(exc: BaseException) -> str:
    """The operator a converter stopped at, as the quantizer's failures are told."""
    return failed_op(exc)


def flat(batch: Any) -> list[Any]:
    """The batch's tensors in the order the converted model takes them (positional, then by keyword)."""
    import torch
    from torch.utils import _pytree

    return [t for t in _pytree.tree_leaves(split(batch)) if isinstance(t, torch.Tensor)]


def flat_numpy(batch: Any) -> list[Any]:
    return [t.detach().contiguous().numpy() for t in flat(batch)]


class Converted:
    """A converted model called like the original: torch tensors in, torch tensors out, nested as
    the original returned them."""

    def __init__(self, run: Run, spec: Any, names: tuple[str, ...] = ()) -> None:
        self.run, self.spec, self.names = run, spec, names

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.utils import _pytree

        if kwargs and self.names and set(kwargs) == set(self.names):
            kwargs = {name: kwargs[name] for name in self.names}
        arrays = flat_numpy(kwargs if kwargs and not args else args[0] if len(args) == 1 else args)
        outputs = [torch.from_numpy(array) for array in self.run(arrays)]
        return _pytree.tree_unflatten(outputs, self.spec)
