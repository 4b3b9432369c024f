"""A real browser for the report's tests: headless Debian chromium, and whether plotly drew a plot."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

BROWSER_TIMEOUT_S = 120


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    browser = shutil.which("chromium")
    assert browser, "chromium is not installed; `./setup.sh --test` installs it (apt-get install chromium)"
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                           "--virtual-time-budget=15000", *args], capture_output=True, text=True,
                          timeout=BROWSER_TIMEOUT_S)


def drawn(dom: str, div_id: str) -> bool:
    """Plotly drew into the div: its plot container and main SVG are inside it (absent before scripts run)."""
    return re.search(rf'<div id="{div_id}"[^>]*>\s*<div class="plot-container plotly"[^>]*>\s*'
                     rf'<div class="[^"]*svg-container"[^>]*>\s*<svg class="main-svg"', dom) is not None
