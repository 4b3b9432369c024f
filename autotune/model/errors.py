"""The two failures a configuration can have inside the child and in `autotune.apply`, and the
operator a conversion's failure is about (`failed_op`)."""

from __future__ import annotations

import re
import traceback

LOAD_FAILED = "cannot load the model file"  # how a .pt/.pt2 that torch cannot load is reported, child to harness


class ApplyError(Exception):
    """A configuration that cannot run here or answers wrongly; the message says why and what to do."""


class WrongAnswers(ApplyError):
    """The converted model's output differs from eager fp32 beyond the tolerance."""


def failed_op(exc: BaseException) -> str:
    """The operator a quantization failure is about: named in the message (aten.conv2d,
    aten::conv2d, quantized ops), the model's line torch.export stopped at, else the quantizer's
    pattern that raised (`_annotate_conv2d_...`)."""
    for text in (str(exc), *(str(c) for c in _causes(exc))):
        found = re.search(r"\b((?:aten|quantized_decomposed|onednn|torchao)(?:\.|::)\w+)", text)
        if found:
            return found.group(1).replace("::", ".")
        line = re.search(r'# File "([^"]+)", line (\d+), in (\w+), code: (.+)', text)
        if line:
            return f"`{line.group(4).strip()}` ({line.group(1).rsplit('/', 1)[-1]}:{line.group(2)}, in {line.group(3)})"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        pattern = re.match(r"_annotate_(\w+?)(?:_fusion_pattern|_binary_unary|_unary|_binary)?$", frame.name)
        if pattern:
            return f"aten.{pattern.group(1)} (the quantizer's {frame.name})"
    return "an operator it does not name"


def _causes(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    seen = exc.__cause__ or exc.__context__
    while seen is not None and len(found) < 5:
        found.append(seen)
        seen = seen.__cause__ or seen.__context__
    return found
