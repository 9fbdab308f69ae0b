"""Holding the worker thread of an `AsyncSessionStore` busy, so that what is submitted to it
meanwhile waits behind: for tests of what a caller cancelled while it waits sees."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from sessions.aio import AsyncSessionStore


@asynccontextmanager
async def held_worker(face: AsyncSessionStore) -> AsyncIterator[threading.Event]:
    """Hold `face`'s worker until the event yielded is set (at the latest on leaving)."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        assert release.wait(30), "the test never let the worker go"

    holder = asyncio.ensure_future(face.run(hold))
    try:
        assert await asyncio.to_thread(entered.wait, 30), "the worker never took the hold"
        yield release
    finally:
        release.set()
        await holder


async def cancel_while_held(task: asyncio.Future[Any], release: threading.Event) -> None:
    """Cancel `task`, whose write waits behind the held worker: it must stay pending, however
    many turns of the loop it is given, until the worker is let go, and then raise
    `CancelledError`."""
    for _ in range(5):  # the task runs up to its await: the write is submitted
        await asyncio.sleep(0)
    task.cancel()
    for _ in range(20):  # turns of the loop, each of which could deliver the cancellation
        await asyncio.sleep(0)
    assert not task.done(), "the task gave up before its submitted write was settled"
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
