"""The handoff between an event loop and the group commit's own thread (`sessions/_handoff.py`).

What must hold: an awaited write's future behaves as any asyncio future for its callers (done
callbacks, `wait_for`, `gather`, `outcome`, cancellation), although its callbacks run in the turn
of the loop that receives the outcome; a cancelled caller's write still commits, and the next
one runs; a loop that cannot watch a pipe still gets its outcomes; many loops run in turn keep
few pipes open; a child made by fork() forgets the parent's pipes.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path
from typing import Any

import pytest

from sessions import LengthConflictError, SessionStore
from sessions import _handoff as handoff
from sessions._group import outcome
from sessions.aio import AsyncSessionStore
from tests.test_sessions_group import contents, hold_first_commit, message


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    opened = SessionStore.open(tmp_path / "store", sync=False)
    for sid in ("a", "b"):
        opened.open_session(sid)
    return opened


def test_a_cancelled_caller_still_commits_and_the_next_write_runs(store: SessionStore) -> None:
    async def main() -> None:
        face = AsyncSessionStore(store)
        try:
            batch = hold_first_commit(store)  # the next writes queue behind a held commit
            task = asyncio.create_task(face.inject("b", message("cancelled")))
            deadline = time.monotonic() + 30
            while store._group.waiting < 1:
                assert time.monotonic() < deadline, "the write never queued"
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            batch.finish()
            await face.inject("b", message("after"))
        finally:
            face._worker.shutdown(wait=True)

    asyncio.run(main())
    assert contents(store, "b") == ["cancelled", "after"]


def test_the_future_of_a_write_behaves_as_any_future(store: SessionStore) -> None:
    seen: list[Any] = []
    reported: list[dict[str, Any]] = []

    def write(text: str) -> Any:
        return store._group.submit(lambda: store.inject("b", message(text)) or text)

    def failing(_: object) -> None:
        raise RuntimeError("a callback that fails")

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        first = write("one")
        first.add_done_callback(lambda f: seen.append(f.result()))
        first.add_done_callback(failing)
        removed = write("two")
        removed.add_done_callback(failing)
        assert removed.remove_done_callback(failing) == 1
        assert await first == "one"
        assert await asyncio.wait_for(removed, 30) == "two"
        assert await asyncio.gather(write("three"), write("four")) == ["three", "four"]
        assert await outcome(write("five")) == ("five", False)
        done = asyncio.get_running_loop().create_future()
        first.add_done_callback(lambda f: done.set_result(f.result()))  # already done: soon
        assert await done == "one"
        with pytest.raises(LengthConflictError, match="not the expected 0"):
            await store._group.submit(lambda: store.inject("b", message("x"), expected_length=0))

    asyncio.run(main())
    assert seen == ["one"]
    assert [str(ctx["exception"]) for ctx in reported] == ["a callback that fails"]
    assert contents(store, "b") == ["one", "two", "three", "four", "five"]


class _NoReaders(asyncio.SelectorEventLoop):
    """A loop that cannot watch a descriptor, as Windows' proactor cannot."""

    def add_reader(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError


def test_a_loop_that_cannot_watch_a_pipe_still_gets_its_outcomes(store: SessionStore) -> None:
    async def main() -> None:
        face = AsyncSessionStore(store)
        try:
            for k in range(3):
                await face.inject("b", message(str(k)))
        finally:
            face._worker.shutdown(wait=True)

    loop = _NoReaders()
    try:
        loop.run_until_complete(main())
        assert handoff._doors[loop] is None
    finally:
        loop.close()
    assert contents(store, "b") == ["0", "1", "2"]


def open_descriptors() -> int:
    return len(os.listdir("/dev/fd"))


def test_many_loops_in_turn_keep_few_pipes_open(store: SessionStore) -> None:
    async def main(text: str) -> None:
        await store._group.submit(lambda: store.inject("b", message(text)))

    asyncio.run(main("warm"))
    gc.collect()
    before = open_descriptors()
    for k in range(40):
        asyncio.run(main(str(k)))
    gc.collect()
    assert open_descriptors() - before <= 4
    assert len(contents(store, "b")) == 41


def test_a_forked_child_forgets_the_parents_pipes(store: SessionStore) -> None:
    async def main() -> None:
        await store._group.submit(lambda: store.inject("b", message("parent")))
        assert handoff._doors.get(asyncio.get_running_loop()) is not None
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only when it holds no door of the parent's
            os._exit(0 if not handoff._doors else 5)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0

    asyncio.run(main())
