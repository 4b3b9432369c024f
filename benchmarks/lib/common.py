"""What every benchmark shares: its command line (`--out`, `--quick`), running `autotune` from this
checkout in a folder of its own, and the line under each RESULTS.md table that says how it was made
(command, commit, host, date)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
KEPT = 300  # characters of a failure's reason kept, from its start (where it says what failed)
MODEL = "resnext101"  # what the README's first command tunes
QUICK_MODEL = "resnet18"
# `autotune search` flags of a quick run: a small space, one replicate, short windows, one candidate
# confirmed in the fewest rounds that can be significant.
QUICK_CONFIRM_ROUNDS = 5
QUICK_MEASURE = ("--space", "quick", "--replicates", "1", "--duration", "0.5", "--warmup-time", "0.3",
                 "--confirm-top", "1")
QUICK_SEARCH = (*QUICK_MEASURE, "--confirm-rounds", str(QUICK_CONFIRM_ROUNDS))


def parser(doc: str | None, quick: str) -> argparse.ArgumentParser:
    """A benchmark's parser: its module docstring (with its examples) as the description, `--out`
    and `--quick` (`quick` says what the quick run does)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_out_and_quick(p, quick)
    return p


def add_out_and_quick(p: argparse.ArgumentParser, quick: str) -> None:
    p.add_argument("--out", type=Path, help="where everything goes: logs, studies, the JSON and the markdown "
                   "table (default: a new temporary folder)")
    p.add_argument("--quick", action="store_true", help=f"a short run through the whole pipeline: {quick}")


def fill(args: argparse.Namespace, full: dict[str, Any], quick: dict[str, Any]) -> None:
    """Each option of `full` left out (None) gets the full run's value, or with --quick the quick one's."""
    for name, value in full.items():
        if getattr(args, name) is None:
            setattr(args, name, quick.get(name, value) if args.quick else value)


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help=f"what to tune (default {MODEL}; {QUICK_MODEL} with --quick)")


def out_folder(out: Path | None, prefix: str) -> Path:
    """`--out` made and resolved; without it a new temporary folder, kept (stderr names it)."""
    folder = (out or Path(tempfile.mkdtemp(prefix=prefix))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    say(f"results in {folder}")
    return folder


def write_table(out: Path, name: str, table: str | Sequence[str]) -> None:
    """A table for RESULTS.md (its text or its lines): OUT/NAME.md, and stdout."""
    text = table if isinstance(table, str) else "\n".join(table) + "\n"
    (out / f"{name}.md").write_text(text)
    print(text, flush=True)


def write_json(out: Path, name: str, found: Any) -> None:
    (out / f"{name}.json").write_text(json.dumps(found, indent=2, default=str) + "\n")


def cli_env(folder: Path) -> dict[str, str]:
    """This checkout's autotune and benchmarks.models first, and a TMPDIR of the folder's own (inductor
    builds its precompiled headers under it whatever TORCHINDUCTOR_CACHE_DIR says: a new one builds
    them again, as for a new user)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    (folder / "tmp").mkdir(parents=True, exist_ok=True)  # AOTInductor's loader fails in a TMPDIR that is not there
    return {**os.environ, "PYTHONPATH": path, "TMPDIR": str(folder / "tmp")}


def autotune(folder: Path, *argv: str, log: str) -> int:
    """`autotune ARGV` from this checkout in `folder`, its output in folder/log; its exit code."""
    say(f"{folder.name}: $ autotune {shlex.join(argv)} (log: {folder / log})")
    with open(folder / log, "wb") as out:
        done = subprocess.run([sys.executable, "-m", "autotune", *argv], cwd=folder, env=cli_env(folder),
                              stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False)
    say(f"{folder.name}: autotune {argv[0]} exited {done.returncode}")
    return done.returncode


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    """A failed process's reason: its last line on stderr, cut to KEPT characters."""
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}, no output"])[-1][:KEPT]


def say(text: str) -> None:
    print(f"[{clock()}] {text}", file=sys.stderr, flush=True)


def clock() -> str:
    return datetime.datetime.now().strftime("%H:%M:%S")


def command_line() -> str:
    """How this benchmark was started, as RESULTS.md quotes it."""
    return shlex.join([".venv/bin/python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def provenance(folder: Path) -> dict[str, str]:
    """The command, commit, host and date of a run whose autotune processes run in `folder`."""
    return {"command": command_line(), "commit": commit(), "host": host(cli_env(folder)),
            "date": datetime.date.today().isoformat()}


def provenance_line(found: dict[str, Any]) -> str:
    return f"Command: `{found['command']}` · commit {found['commit']} · host: {found['host']} · {found['date']}"


def commit() -> str:
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return (git("rev-parse", "--short", "HEAD") or "unknown") + (" (with uncommitted changes)" if dirty else "")


def host(env: dict[str, str]) -> str:
    """CPU model, cores and the ISA flags that decide which precisions can win, as `autotune doctor` sees them."""
    done = subprocess.run([sys.executable, "-m", "autotune", "doctor", "--json"], env=env, capture_output=True,
                          text=True, check=False)
    try:
        seen = json.loads(done.stdout)
    except json.JSONDecodeError:
        return f"unknown (autotune doctor exited {done.returncode})"
    return host_line(seen)


def host_line(seen: dict[str, Any]) -> str:
    """`autotune doctor --json`'s report as the results file names a host: the ISA flags it has and lacks, and
    the peer runtimes' package versions."""
    flags = seen.get("isa", {})
    isa = " ".join(flag for flag, present in flags.items() if present) or "no listed ISA extension"
    lacks = " ".join(flag for flag, present in flags.items() if not present)
    versions = [f"{name} {version}" for info in (seen.get("runtimes") or {}).values()
                for name, version in info.get("versions", {}).items() if version]
    limits = " ".join(f"{k}={v}" for k, v in (seen.get("isa_limits") or {}).items())
    return (f"{seen.get('cpu_model')}, {seen.get('physical_cores')} cores ({seen.get('logical_cpus')} CPUs, "
            f"{seen.get('usable_physical_cores')} usable), {isa}" + (f", no {lacks}" if lacks else "")
            + (f", limited by {limits}" if limits else "")
            + f"; torch {seen.get('torch')}" + "".join(f", {v}" for v in versions))
