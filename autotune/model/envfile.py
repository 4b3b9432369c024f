"""The env file, the one file a user keeps: its format and version, every variable it holds, writing
its lines and reading it back (without a shell), for `autotune export`, `autotune run`, `compare`,
`profile`, `cache` and `apply` alike.

Format 2 (`FORMAT`): a header line naming the format, comments, one `unset` line, `export` lines,
all values single-quoted, and a last line (`END`) that says the file is whole. It sets only what
applies to its configuration: the process's variables (OMP_NUM_THREADS, LD_PRELOAD, ...), then the
configuration autotune reads: its model and inputs, the backend, each other knob that is set, once,
as `AUTOTUNE_<KNOB>` (a knob not set stays at its default, as everywhere in autotune), and how its
instances are launched. Everything else autotune or a knob could set is on the `unset` line, so
that files sourced one after another never mix.

Format 1 (before format 2; no `AUTOTUNE_FORMAT`) held every model knob's variable and every knob
again in `AUTOTUNE_KNOBS`: it still loads. A file cut short is refused in one line: format 2 by its
missing last line, format 1 by its missing last variable. So is one autotune never wrote: a
variable set twice (which value runs would depend on who reads it), a name that is no variable's,
or a value holding a control character (a NUL cannot even reach a process's environment).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.model.files import read_text

FORMAT = 2
HEADER = "# autotune configuration"
END = "# end of the autotune configuration"  # the last line of a whole file (format 2)


def knob_var(name: str) -> str:
    """The variable a knob's value is exported as."""
    return f"AUTOTUNE_{name.upper()}"


# The variables autotune reads, one definition each.
FORMAT_VAR = "AUTOTUNE_FORMAT"
MODEL_VAR = "AUTOTUNE_MODEL"
BATCH_SIZE_VAR = "AUTOTUNE_BATCH_SIZE"
INPUT_SHAPE_VAR = "AUTOTUNE_INPUT_SHAPE"  # a model's item shape (not a transformers model's)
EXAMPLE_INPUTS_VAR = "AUTOTUNE_EXAMPLE_INPUTS"  # the inputs a study measured with (`--example-inputs`)
SEQ_LEN_VAR, TASK_VAR = "AUTOTUNE_SEQ_LEN", "AUTOTUNE_TASK"  # a transformers model's tokens per item and head
NEW_TOKENS_VAR = "AUTOTUNE_NEW_TOKENS"  # --task generate: tokens generated per request
SEQ_LENS_VAR = "AUTOTUNE_SEQ_LENS"  # the buckets a configuration was measured at
SEQ_LEN_WEIGHTS_VAR = "AUTOTUNE_SEQ_LEN_WEIGHTS"  # and their shares of the requests (for measuring it again)
TOLERANCE_VAR = "AUTOTUNE_TOLERANCE"  # what the guard allows, where the study set it
CALIBRATION_VAR = "AUTOTUNE_CALIBRATION_BATCHES"  # what the study calibrated int8 on (its input batches)
ARTIFACTS_VAR = "AUTOTUNE_ARTIFACTS"  # a folder of compiled artifacts: loaded when they match, else made
BINDING_VAR = "AUTOTUNE_BINDING"  # how the instances were bound to their CPUs
INSTANCE_CPUS_VAR = "AUTOTUNE_INSTANCE_CPUS"  # each instance's CPUs, `;` between instances
INSTANCE_NODES_VAR = "AUTOTUNE_INSTANCE_NUMA_NODES"  # and NUMA node
INSTANCE_INDEX_VAR = "AUTOTUNE_INSTANCE_INDEX"  # set by `autotune run` in each instance, not in the file
REPORT_VAR = "AUTOTUNE_APPLY_REPORT"  # set by `autotune run`: where apply says what it applied
LISTED_VAR = "AUTOTUNE_KNOBS"  # format 1: every knob again, `k=v` pairs
# What a whole format-1 file held (every one since the first export), and its last lines: the
# launch lines, one comment per instance, after every variable (the artifacts' folder included).
FORMAT1 = (MODEL_VAR, LISTED_VAR)
FORMAT1_LAUNCH = "# launch lines, as the trial ran them:"
FORMAT1_LAST = "#   instance "
# What every format-2 file holds: the backend always names what runs; the other knobs where set.
FORMAT2 = (FORMAT_VAR, MODEL_VAR, BATCH_SIZE_VAR, knob_var("backend"), BINDING_VAR, INSTANCE_CPUS_VAR,
           INSTANCE_NODES_VAR)
# Read only where set; a file that does not set them unsets them.
OPTIONAL = (INPUT_SHAPE_VAR, EXAMPLE_INPUTS_VAR, SEQ_LEN_VAR, TASK_VAR, NEW_TOKENS_VAR, SEQ_LENS_VAR,
            SEQ_LEN_WEIGHTS_VAR,
            TOLERANCE_VAR, CALIBRATION_VAR, ARTIFACTS_VAR, LISTED_VAR)


class EnvFileError(ValueError):
    """Text that is not an env file `autotune export` wrote; the message names the line."""


@dataclass(frozen=True)
class Parsed:
    env: dict[str, str]
    unset: tuple[str, ...]

    @property
    def format(self) -> int:
        return version(self.env)


def version(env: Mapping[str, str]) -> int:
    """The format an environment's configuration was written in (1: before formats were named)."""
    text = env.get(FORMAT_VAR, "1")
    return int(text) if text.isdigit() else 0


def quote(value: str) -> str:
    """Always single-quoted, so no value is ever expanded or split by the shell; a control
    character (a newline would end the line this format reads) cannot be carried at all."""
    if has_control(value):
        raise EnvFileError(f"{value!r} holds a control character (newline, CR, NUL, ...) that an env file "
                           f"cannot carry safely")
    return "'" + value.replace("'", "'\"'\"'") + "'"


def export_line(name: str, value: str) -> str:
    try:
        return f"export {name}={quote(value)}"
    except EnvFileError as exc:
        raise EnvFileError(f"cannot export {name}: {exc}") from None


def render(header: str, comments: Sequence[str], unset: Sequence[str], process: Mapping[str, str],
           configuration: Mapping[str, str], launch: Sequence[str]) -> str:
    """A whole format-`FORMAT` file: the header line (`header` after the format), `comments` (each a
    `#` line), the `unset` line, the process's variables, the configuration autotune reads (the
    format first), the `launch` comments, and the last line that says the file is whole. A value
    that cannot be carried raises EnvFileError naming it."""
    lines = [f"{HEADER}, format {FORMAT}: {header}", *comments, *([f"unset {' '.join(unset)}"] if unset else [])]
    lines += [export_line(name, value) for name, value in process.items()]
    lines.append("# the configuration autotune reads (`autotune.apply` in your program, `autotune run`):")
    lines += [export_line(name, value) for name, value in {FORMAT_VAR: str(FORMAT), **configuration}.items()]
    lines += [*launch, END]
    return "\n".join(comment(line) if line.startswith("#") else line for line in lines) + "\n"


def has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def comment(text: str) -> str:
    """A comment line that stays one comment line: control characters are shown escaped."""
    return "".join(repr(c)[1:-1] if ord(c) < 32 or ord(c) == 127 else c for c in text)


def read(path: str | os.PathLike[str]) -> Parsed:
    """The env file at `path`, whole and of a format this autotune reads; the EnvFileError it
    raises names the file, what was wrong with it and what to do."""
    name = os.fspath(path)
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not text"
        raise EnvFileError(f"cannot read env file {name}: {reason}; give a file made by `autotune export`") from None
    if not text.startswith(HEADER):
        raise EnvFileError(f"{name} is not an autotune env file; make one with `autotune export {name}`")
    try:
        parsed = parse(text)
        check_whole(parsed.env, text)
    except EnvFileError as exc:
        raise EnvFileError(f"{name}: {exc}; export it again") from None
    return parsed


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # what a shell takes as a variable's name


def parse(text: str) -> Parsed:
    """The `export` and `unset` lines of an env file (comments and blank lines ignored); a line
    autotune never writes (a variable set twice, a name no shell takes, a control character in a
    value) is refused, naming the line."""
    if not text.startswith(HEADER):
        raise EnvFileError("not an autotune env file (it does not start with the autotune header)")
    env: dict[str, str] = {}
    where: dict[str, int] = {}
    unset: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise EnvFileError(f"line {number}: {exc}") from None
        if words[0] == "unset":
            unset += [_name(word, number) for word in words[1:]]
        elif words[0] == "export" and len(words) == 2 and "=" in words[1]:
            key, _, value = words[1].partition("=")
            _check_export(_name(key, number), value, number, where.get(key))
            env[key], where[key] = value, number
        else:
            raise EnvFileError(f"line {number}: not an export or unset line: {comment(line[:80])!r}")
    return Parsed(env, tuple(unset))


def _name(word: str, number: int) -> str:
    if not NAME.match(word):
        raise EnvFileError(f"line {number}: {comment(word[:40])!r} is not a variable's name")
    return word


def _check_export(name: str, value: str, number: int, before: int | None) -> None:
    if before is not None:
        raise EnvFileError(f"line {number}: {name} is set a second time (first on line {before}); a file autotune "
                           f"writes sets each variable once")
    if has_control(value):
        raise EnvFileError(f"line {number}: the value of {name} holds a control character "
                           f"({comment(next(c for c in value if has_control(c)))}), which no environment carries")


def check_format(env: Mapping[str, str]) -> int:
    """The format of a configuration, refused where this autotune does not read it."""
    found = version(env)
    if found > FORMAT or found < 1:
        raise EnvFileError(f"{FORMAT_VAR}={env.get(FORMAT_VAR)!r} is a format this autotune does not read "
                           f"(it reads 1 to {FORMAT}); upgrade autotune, or export it with this one")
    return found


def check_whole(env: Mapping[str, str], text: str) -> None:
    """Refuse a file of a format this autotune does not read, one whose header and AUTOTUNE_FORMAT
    disagree, or one cut short: format 2 (its header says so) ends with `END` and sets what every
    such file sets (`FORMAT2`); format 1 set `FORMAT1` and ended with its launch lines. (An
    environment has no last line: variables set by hand are read as they are.)"""
    named = re.match(re.escape(HEADER) + r", format (\d+):", text)
    declared = int(named.group(1)) if named else 1
    if FORMAT_VAR in env and env[FORMAT_VAR] != str(declared):
        raise EnvFileError(f"its header says format {declared} but it sets {FORMAT_VAR}={env[FORMAT_VAR]!r} "
                           f"(edited by hand?)")
    found = check_format({**env, FORMAT_VAR: str(declared)})
    lines = [line for line in text.splitlines() if line.strip()]
    if found == 2:
        missing, ends = [var for var in FORMAT2 if var not in env], lines[-1] == END
        whole = f"ends with {END!r}"
    else:
        missing = [var for var in FORMAT1 if var not in env]
        ends = FORMAT1_LAUNCH in lines and lines[-1].startswith(FORMAT1_LAST)
        whole = "ends with its launch lines, one comment per instance"
    if missing or not ends:
        lacking = f" (it lacks {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})" if missing else ""
        raise EnvFileError(f"the configuration is cut short or edited{lacking}: a whole format-{found} file {whole}")
