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
            batch.finish()  # cancelled, the task waits until its queued write has committed
            with pytest.raises(asyncio.CancelledError):
                await task
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


# Reads and other calls on the worker (`AsyncSessionStore.run`), handed back the same way


def test_a_read_hands_back_its_result_and_its_error(store: SessionStore) -> None:
    store.inject("a", message("hello"))

    def stops() -> None:
        raise StopIteration  # a future cannot hold it: it must not stall the loop's other reads

    async def main() -> None:
        face = AsyncSessionStore(store)
        try:
            both = await asyncio.gather(face.messages("a"), face.length("a"), face.exists("zz"))
            assert [m["content"] for m in both[0]] == ["hello"] and both[1:] == [1, False]
            with pytest.raises(ValueError, match="bad"):
                await face.run(lambda: int("bad"))
            results = await asyncio.gather(
                face.run(stops), face.length("a"), return_exceptions=True
            )
            assert isinstance(results[0], RuntimeError) and "StopIteration" in str(results[0])
            assert results[1] == 1
        finally:
            face._worker.shutdown(wait=True)

    asyncio.run(main())


def test_a_read_cancelled_before_the_worker_reaches_it_does_not_run(store: SessionStore) -> None:
    import threading

    ran: list[str] = []
    held = threading.Event()

    async def main() -> None:
        face = AsyncSessionStore(store)
        try:
            first = asyncio.create_task(face.run(held.wait, 30))  # keeps the worker busy
            second = asyncio.create_task(face.run(ran.append, "ran"))
            await asyncio.sleep(0.01)
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            held.set()
            assert await first is True
            await face.run(ran.append, "next")
        finally:
            face._worker.shutdown(wait=True)

    asyncio.run(main())
    assert ran == ["next"]


class _CountingTurns(asyncio.SelectorEventLoop):
    turns = 0

    def _run_once(self) -> None:
        self.turns += 1
        super()._run_once()  # type: ignore[misc]


def test_a_read_wakes_its_task_in_the_turn_that_receives_it(store: SessionStore) -> None:
    """The worker's result reaches the awaiting task through the loop's door and wakes it in
    that turn of the loop, not in a callback scheduled for the next: one turn per read."""
    reads = 100

    async def main(loop: _CountingTurns) -> int:
        face = AsyncSessionStore(store)
        try:
            await face.length("a")  # the first opens the door
            before = loop.turns
            for _ in range(reads):
                await face.length("a")
            return loop.turns - before
        finally:
            face._worker.shutdown(wait=True)

    loop = _CountingTurns()
    try:
        turns = loop.run_until_complete(main(loop))
    finally:
        loop.close()
    assert reads <= turns < reads * 1.5, turns
