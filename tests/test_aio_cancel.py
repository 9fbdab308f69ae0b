"""A task cancelled while it awaits a write of `AsyncSessionStore` raises `CancelledError` only
once that write is settled (committed, or refused), so the store no longer changes once the
caller sees the cancellation; and a closed face refuses reads as it refuses writes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from eventlog import LogClosedError
from sessions import ForgottenError, LocalKeyProvider, SessionStore
from sessions.aio import AsyncSessionStore
from tests._held_worker import cancel_while_held, held_worker


def message(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


class Held:
    """A command that holds the store's group commit until `release` is set: the writes queued
    meanwhile wait behind it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> None:
        self.entered.set()
        assert self.release.wait(30), "the test never let the commit go"


@pytest.fixture
def face(tmp_path: Path) -> Iterator[AsyncSessionStore]:
    store = SessionStore.open(tmp_path / "store", sync=False)
    store.open_session("s")
    store.inject("s", message("first"))
    yield AsyncSessionStore(store)
    if not store.log.closed:
        store.close()


async def cancel_behind(face: AsyncSessionStore, write: Coroutine[Any, Any, object]) -> None:
    """Cancel a task awaiting `write` while the write is queued behind a held commit: the task
    stays pending, however many turns of the loop it is given, until that commit lets go, and
    then raises `CancelledError`."""
    held = Held()
    holder = asyncio.ensure_future(face._write(held))
    try:
        assert await asyncio.to_thread(held.entered.wait, 30), "the held command never ran"
        task = asyncio.ensure_future(write)
        await asyncio.sleep(0)  # the task runs up to its await: the write is queued
        await cancelled(face, held, task)
    finally:
        held.release.set()
    await holder


async def cancelled(face: AsyncSessionStore, held: Held, task: asyncio.Task[object]) -> None:
    assert face.store._group.waiting == 1
    task.cancel()
    for _ in range(20):  # turns of the loop, each of which could deliver the cancellation
        await asyncio.sleep(0)
    assert not task.done(), "the task gave up before its queued write was settled"
    held.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_cancelled_write_raises_only_once_it_has_committed(face: AsyncSessionStore) -> None:
    async def main() -> None:
        await cancel_behind(face, face.inject_many("s", [message("a"), message("b")]))
        # Committed before the cancellation was seen: the caller reads before it retries.
        assert [m["content"] for m in await face.messages("s")] == ["first", "a", "b"]
        assert face.store._group.waiting == 0
        await face.aclose()

    asyncio.run(main())


def test_a_cancelled_pop_raises_once_the_item_is_off(face: AsyncSessionStore) -> None:
    async def main() -> None:
        await cancel_behind(face, face.pop("s"))
        assert await face.messages("s") == []
        await face.aclose()

    asyncio.run(main())


def test_a_cancelled_write_that_is_refused_raises_the_cancellation(
    face: AsyncSessionStore,
) -> None:
    async def main() -> None:
        # refused (the session is unknown), it raises the cancellation, not the refusal
        await cancel_behind(face, face.inject("no-such-session", message("x")))
        assert [m["content"] for m in await face.messages("s")] == ["first"]
        assert not await face.exists("no-such-session")
        await face.aclose()

    asyncio.run(main())


def test_after_aclose_reads_and_writes_raise_log_closed(face: AsyncSessionStore) -> None:
    async def main() -> None:
        await face.aclose()
        with pytest.raises(LogClosedError):
            await face.inject("s", message("late"))
        with pytest.raises(LogClosedError, match="messages"):
            await face.messages("s")
        with pytest.raises(LogClosedError):
            await face.run(len, "abc")
        with pytest.raises(LogClosedError):
            face.call(len, "abc")

    asyncio.run(main())


def test_a_cancelled_run_write_raises_once_its_function_has_run(face: AsyncSessionStore) -> None:
    def two_in_one(store: SessionStore) -> int:
        with store.transaction():
            store.inject("s", message("a"))
            return store.inject("s", message("b"))

    async def main() -> None:
        async with held_worker(face) as release:
            task = asyncio.ensure_future(face.run_write(two_in_one, face.store))
            await cancel_while_held(task, release)
        assert [m["content"] for m in face.store.messages("s")] == ["first", "a", "b"]

    asyncio.run(main())


def test_a_cancelled_stepped_write_raises_once_it_has_run(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "sealed", sync=False, keys=LocalKeyProvider(bytes(32)))
    store.open_session("s")
    store.inject("s", message("secret"))
    face = AsyncSessionStore(store)

    async def main() -> None:
        async with held_worker(face) as release:
            task = asyncio.ensure_future(face.forget("s", "erasure request"))
            await cancel_while_held(task, release)
        with pytest.raises(ForgottenError):
            store.messages("s")
        await face.aclose()

    asyncio.run(main())


def test_run_write_outcome_gives_the_value_and_the_cancellation(face: AsyncSessionStore) -> None:
    def inject(store: SessionStore, text: str) -> int:
        store.inject("s", message(text))
        return store.length("s")

    async def main() -> tuple[int, bool]:
        async with held_worker(face) as release:
            task = asyncio.ensure_future(face.run_write_outcome(inject, face.store, "x"))
            for _ in range(5):
                await asyncio.sleep(0)
            task.cancel()
            release.set()
            return await task

    assert asyncio.run(main()) == (2, True)
