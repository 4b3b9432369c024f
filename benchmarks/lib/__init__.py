"""What the benchmarks import: modules, not scripts (benchmarks/README.md lists the scripts).

A benchmark runs as `.venv/bin/python benchmarks/NAME.py`, which puts benchmarks/ first on the
import path, so it imports these as `from lib import common`.
"""
