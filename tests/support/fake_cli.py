"""The real CLI with the fake benchmark child (fake_worker.py, beside this file) in place of the real one, for
tests that run `autotune` as a process of its own; everything else (flags, this machine, its host
class, the study, exit codes) is the real thing.

    python tests/support/fake_cli.py BEHAVIOUR AUTOTUNE_ARGS...      e.g. ok search --model resnet18 ...

BEHAVIOUR is the fake child's (fake_worker.py), or `hang-unless-defaults`: PyTorch's defaults measure,
every other configuration hangs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository, for `autotune` and `tests`
sys.path.insert(0, str(ROOT))

from autotune.config.knobs import Config  # noqa: E402
from autotune.measure import plan  # noqa: E402
from autotune.measure.plan import BenchSpec  # noqa: E402

FAKE = str(Path(__file__).parent / "fake_worker.py")


def fake_child(behaviour: str) -> Any:
    """`plan.worker_command` starting the fake child (its flags come in pairs, which it ignores)."""

    def command(python: str, bench: BenchSpec, config: Config) -> tuple[str, ...]:
        chosen = behaviour
        if behaviour == "hang-unless-defaults":  # the baseline measures, the next trial never ends
            chosen = "hang-early" if config.values else "ok"
        return (sys.executable, FAKE, chosen, "--model", bench.model)

    return command


if __name__ == "__main__":
    from autotune.cli.main import main

    plan.worker_command = fake_child(sys.argv[1])
    main(sys.argv[2:])
