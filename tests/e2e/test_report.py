"""`autotune report` on a real short search, opened in a real browser (headless Debian chromium):
every plot is drawn once the page's scripts ran, and a screenshot is kept in test-artifacts/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.browser import chromium, drawn
from tests.support.cli import QUICK_SEARCH, autotune

pytestmark = pytest.mark.e2e

ARTIFACTS = ROOT / "test-artifacts"  # git-ignored; CI keeps the folder
PLOTS = ("history", "importance", "marginals-latency_p50_ms", "forest", "tradeoff")
def test_the_report_of_a_real_search_draws_every_plot_in_a_browser(tmp_path: Path) -> None:
    searched = autotune(tmp_path, "search", *QUICK_SEARCH, "--trials", "4", "--confirm-top", "1",
                        "--confirm-rounds", "5")
    assert searched.returncode == 0, searched.stderr
    made = autotune(tmp_path, "report", "-o", "report.html")
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[-1] == "wrote report.html"
    page = tmp_path / "report.html"
    assert not any(drawn(page.read_text(), plot) for plot in PLOTS)  # only the scripts draw them
    dom = chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert [plot for plot in PLOTS if not drawn(dom.stdout, plot)] == []
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-e2e.png"
    shot.unlink(missing_ok=True)
    taken = chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,4000", page.as_uri())
    assert taken.returncode == 0 and shot.stat().st_size > 0, taken.stderr[-2000:]
    shutil.copy(page, ARTIFACTS / "report-e2e.html")
