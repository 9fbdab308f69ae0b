"""Tests that need something from the machine (a PostgreSQL server, Chromium, strace, root for a
tmpfs). Such a test says so: the marker `needs("WHAT")`, a fixture listed in `FIXTURE_NEEDS`, or a
backend parameter "postgres". Each thing a collected test needs is probed once, at collection;
where it is missing, its tests are deselected (not run, and not counted as passed or skipped) and
the run ends with one line per thing saying how many and how to run them. Where the run requires
it (`.ci/run` sets `SESSIONLOG_REQUIRE_<WHAT>=1` for each) nothing is deselected, and a missing
thing fails every test that needs it."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NoReturn

import pytest

FIXTURE_NEEDS = {"viewer": "BROWSER", "small_disk": "TMPFS"}
"""Fixtures that bring something from the machine, and what."""


def required(what: str) -> bool:
    return os.environ.get(f"SESSIONLOG_REQUIRE_{what}") == "1"


def missing(what: str, reason: str) -> NoReturn:
    """Fail the calling test: `what` is not there (a test that needs it and was not deselected
    runs only where the run requires `what`, or where the probe found it)."""
    if required(what):
        pytest.fail(f"SESSIONLOG_REQUIRE_{what}=1 but {reason}")
    pytest.fail(f"{reason} (mark the test `needs({what!r})` to deselect it where it is missing)")


def needs_of(item: pytest.Item) -> set[str]:
    """What from the machine `item` needs."""
    found = {str(mark.args[0]) for mark in item.iter_markers("needs")}
    fixtures = getattr(item, "fixturenames", ())
    found.update(what for name, what in FIXTURE_NEEDS.items() if name in fixtures)
    callspec: Any = getattr(item, "callspec", None)
    if callspec is not None and any(
        isinstance(value, str) and value == "postgres" for value in callspec.params.values()
    ):
        found.add("POSTGRES")
    return found


def deselect_missing(
    config: pytest.Config, items: list[pytest.Item], probes: dict[str, Callable[[], str | None]]
) -> dict[str, tuple[int, str]]:
    """Deselect the items needing something the run does not require and `probes` do not find;
    returns, for each such thing, how many items went and why."""
    reasons: dict[str, str | None] = {}
    gone: dict[str, tuple[int, str]] = {}
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        absent = None
        for what in sorted(needs_of(item)):
            if required(what):
                continue
            if what not in reasons:
                reasons[what] = probes[what]()
            if reasons[what] is not None:
                absent = what
                break
        if absent is None:
            kept.append(item)
            continue
        dropped.append(item)
        count, _ = gone.get(absent, (0, ""))
        gone[absent] = (count + 1, str(reasons[absent]))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    return gone
