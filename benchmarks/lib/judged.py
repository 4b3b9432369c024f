"""What benchmarks/quality.py's parts share: one `autotune bench --json` whose quality is kept whatever
the guard says, a study's recorded trials with their quality and feasibility, and the cells that
print a figure and its interval."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from lib import common


def bench(out: Path, name: str, *argv: str) -> dict[str, Any]:
    """One `autotune bench --json` in `out` (its output in OUT/NAME.log): its timings, its quality and
    int8_fallback's layers kept, measured whatever its guard says (`--tolerance 1`)."""
    command = [sys.executable, "-m", "autotune", "bench", *argv, "--tolerance", "1", "--json"]
    common.say(f"$ autotune {' '.join(command[3:])}")
    done = subprocess.run(command, cwd=out, env=common.cli_env(out), capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    (out / f"{name}.log").write_text(f"{done.stdout}\n--- stderr\n{done.stderr}")
    try:
        document = json.loads(done.stdout)
        result = document["result"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return {"ok": False, "reason": common.last_line(done)}
    if not result.get("ok"):
        return {"ok": False, "reason": str(result.get("reason", ""))[:common.KEPT]}
    generation = result.get("generation") or {}
    quality = document.get("quality") or result.get("quality")
    common.say(f"{name}: quality {json.dumps(quality)}")
    kept = next((i["setup"]["int8_kept_fp32"] for i in result.get("instances", [])
                 if "int8_kept_fp32" in i.get("setup", {})), None)
    return {"ok": True, "latency_p50_ms": result.get("latency_p50_ms"), "tpot_ms": generation.get("tpot_p50_ms"),
            "ttft_ms": generation.get("ttft_p50_ms"), "quality": quality, "kept_fp32": kept}


def recorded(out: Path) -> dict[str, Any]:
    """The study in OUT/studies: every trial's knobs, quality, feasibility, latency and decode, and the
    confirmation's verdict and re-check."""
    from autotune.study import storage

    try:
        study = storage.find_study(out / "studies", None, None)
    except storage.StudyError:
        return {"trials": []}
    verdict = study.user_attrs.get("confirmation") or {}
    return {"trials": [{"number": t.number, "state": t.state.name, "knobs": t.user_attrs.get("config", ""),
                        "quality": t.user_attrs.get("quality"), "feasible": t.user_attrs.get("feasible"),
                        "latency_p50_ms": t.user_attrs.get("latency_p50_ms"),
                        "tpot_ms": (t.user_attrs.get("generation") or {}).get("tpot_p50_ms")}
                       for t in study.get_trials()],
            "message": verdict.get("message"), "recommended_trial": verdict.get("recommended_trial"),
            "rechecked": verdict.get("quality"), "quality_breach": verdict.get("quality_breach")}


def interval(pair: Any, digits: int = 2) -> str:
    return f"[{pair[0]:.{digits}f}, {pair[1]:.{digits}f}]" if isinstance(pair, (list, tuple)) and len(pair) == 2 \
        else "-"


def number(value: Any, form: str) -> str:
    return "-" if value is None else format(value, form)
