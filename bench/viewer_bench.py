"""Viewer benchmarks (`python -m bench --suite viewer`): the session viewer in the distribution's
headless Chromium (Playwright, `test` extra) against a `sessionlog serve` on loopback.

- ``viewer_first_screen``: load the viewer on a session of 100,000 messages until its first
  message is on screen (page, modules, sign-in check, the session's header, one page of
  messages), vs the same on a session of 100 messages in the same store: the page fetches only
  what is on screen, so the ratio should be near 1. Target: under one second per open.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import _scaffold
from bench._timing import Result, Sample, Stopwatch, Target, compare
from sessions import SessionStore

ROOT = Path(__file__).resolve().parent.parent
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    messages: int  # messages in the big session
    small: int  # messages in the baseline session
    opens: int  # page loads per round


FULL = Sizes(rounds=7, messages=100_000, small=100, opens=5, budget_s=120)
QUICK = Sizes(rounds=3, messages=20_000, small=100, opens=2, budget_s=30)

Context = _scaffold.Context[Sizes]


def _build(path: Path, sizes: Sizes) -> None:
    with SessionStore.open(path, sync=False) as store:
        for sid, count in (("big", sizes.messages), ("small", sizes.small)):
            store.open_session(sid)
            for start in range(0, count, 10_000):
                batch = range(start, min(start + 10_000, count))
                store.inject_many(sid, [{"role": "user", "content": f"m {n}"} for n in batch])


@contextmanager
def _server(path: Path, key: str) -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "SESSIONLOG_API_KEYS": f"admin={key}", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "sessionlog", "--store", str(path), "serve"]
    process = subprocess.Popen(
        [*command, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/v1/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def _opens(browser: Any, url: str, key: str, sid: str, count: int) -> Sample:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{url}/#token={key}")  # signs in: the token stays in this tab's sessionStorage
    page.wait_for_selector("table.sessions tbody tr")
    with Stopwatch() as watch:
        for _ in range(count):
            page.goto(f"{url}/#/s/{sid}")
            page.wait_for_selector("article[data-index='0']")
            page.goto("about:blank")
    page.close()
    return watch.sample(count)


def viewer_first_screen(ctx: Context) -> list[Result]:
    from playwright.sync_api import sync_playwright

    sizes = ctx.sizes
    path = ctx.tmp / "viewer"
    _build(path, sizes)
    key = secrets.token_urlsafe(32)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("bench --suite viewer needs the distribution's chromium on PATH")
    with _server(path, key) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=LAUNCH_ARGS)
        try:

            def opens(sid: str) -> Sample:
                return _opens(browser, url, key, sid, sizes.opens)

            result = compare(
                name="viewer_first_screen",
                description=f"viewer opens a {sizes.messages:,}-message session to its first screen",
                unit="opens/s",
                baseline=lambda: opens("small"),
                subject=lambda: opens("big"),
                baseline_description=f"the same on a {sizes.small}-message session",
                rounds=sizes.rounds,
                target=Target("absolute", 1.0),
                budget_s=sizes.budget_s,
                progress=ctx.progress,
            )
        finally:
            browser.close()
    result.per = "open"
    result.notes = {"messages": sizes.messages, "baseline_messages": sizes.small}
    shutil.rmtree(path, ignore_errors=True)
    return [result]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "viewer_first_screen": viewer_first_screen,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    return _scaffold.run(BENCHMARKS, ctx, names)
