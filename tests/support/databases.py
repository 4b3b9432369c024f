"""A study's SQLite database as other programs can leave it: held locked, or damaged."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

HOLD = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


def hold_lock(db: Path, seconds: float) -> subprocess.Popen[str]:
    """A second process holding BEGIN EXCLUSIVE on the study, as optuna-dashboard or sqlite3 can."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with proc.stdout:
        assert proc.stdout.readline().strip() == "locked"
    return proc


def damage_pages(db: Path, seed: int = 1, pages: int = 3) -> None:
    """Random bytes over whole pages in the middle of a valid file; the header stays intact."""
    data = bytearray(db.read_bytes())
    size, rng = 4096, random.Random(seed)
    for page in rng.sample(range(2, len(data) // size), pages):
        data[page * size:(page + 1) * size] = rng.randbytes(size)
    db.write_bytes(bytes(data))
