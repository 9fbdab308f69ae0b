"""The distribution's headless Chromium driven by Playwright, for the viewer's browser tests.

The browser is the one the system's package manager installed (`chromium` on PATH); Playwright
never downloads one. Without it the browser tests are deselected with one line saying how to
install it, unless `SESSIONLOG_REQUIRE_BROWSER=1` is set (`.ci/run` sets it and installs the
browser), where they fail instead (`tests/_require.py`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from tests import _require

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "var" / "screenshots"

LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


_NO_CHROMIUM = (
    "the viewer's browser tests need the distribution's Chromium on PATH "
    "(Debian/Ubuntu: apt-get install -y chromium); .ci/run installs it"
)


def _chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)


def probe() -> str | None:
    """None when the browser tests can run here; else why not."""
    return None if _chromium() else _NO_CHROMIUM


def chromium_path() -> str:
    return _chromium() or _require.missing("BROWSER", _NO_CHROMIUM)


def launch(playwright: Any) -> Any:
    # Playwright must not look for (or fetch) browsers of its own.
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    return playwright.chromium.launch(executable_path=chromium_path(), args=LAUNCH_ARGS)


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
