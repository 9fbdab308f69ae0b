"""Tests that need something from the machine (a PostgreSQL server, Chromium, strace, root for a
tmpfs): locally they skip with one line saying what is missing; where the run requires them
(`.ci/run` sets `SESSIONLOG_REQUIRE_<WHAT>=1` for each) a missing one fails the test instead."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def required(what: str) -> bool:
    return os.environ.get(f"SESSIONLOG_REQUIRE_{what}") == "1"


def unavailable(what: str, reason: str) -> NoReturn:
    """Skip the calling test for want of `what`, or fail it when the run requires `what`."""
    if required(what):
        pytest.fail(f"SESSIONLOG_REQUIRE_{what}=1 but {reason}")
    pytest.skip(reason)
