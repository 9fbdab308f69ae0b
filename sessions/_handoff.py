"""Handing work between an event loop and the thread that commits for it (`sessions/_group.py`).

A coroutine's write is led by the group commit's own thread and its outcome goes back to the
coroutine's loop: two thread switches per awaited write, kept as cheap as they can be. The loop
rings the thread through a bare queue (`Bell`), which, unlike a pipe, keeps the interpreter's
lock, so the thread runs once the loop has gone to sleep. The outcome comes back through a pipe
of the loop's own that the loop watches (`Door`), and wakes the awaiting task in that same turn
of the loop (`Outcome`): the task runs, queues its next write and rings, and the loop sleeps
again. Through `call_soon_threadsafe` the same took two turns, each polling the loop's selector,
and its self-pipe two reads. Nothing here ever blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")
logger = logging.getLogger("sessionlog.group")


class Outcome(asyncio.Future[_T]):
    """The future of a queued write. Its done callbacks, the awaiting task's wake-up above all,
    run in the turn of the loop that receives the outcome (`settle`), not one turn later as an
    asyncio future schedules them. Resolved or cancelled any other way, it schedules them as any
    future does."""

    _waiting: tuple[tuple[Callable[[Any], object], contextvars.Context], ...] = ()

    def add_done_callback(
        self, fn: Callable[[Any], object], /, *, context: contextvars.Context | None = None
    ) -> None:
        context = contextvars.copy_context() if context is None else context
        if self.done():
            self.get_loop().call_soon(fn, self, context=context)
        else:
            self._waiting += ((fn, context),)

    def remove_done_callback(self, fn: Callable[[Any], object], /) -> int:
        kept = tuple((f, context) for f, context in self._waiting if f != fn)
        removed, self._waiting = len(self._waiting) - len(kept), kept
        return removed

    def set_result(self, result: _T, /) -> None:
        super().set_result(result)
        self._schedule()

    def set_exception(self, exception: type | BaseException, /) -> None:
        super().set_exception(exception)
        self._schedule()

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False
        self._schedule()
        return True

    def _schedule(self) -> None:
        waiting, self._waiting = self._waiting, ()
        for fn, context in waiting:
            self.get_loop().call_soon(fn, self, context=context)

    def settle(self, value: Any, error: BaseException | None) -> None:
        """Resolve it and run its callbacks now: called by its loop in a callback of its own,
        outside any task (a task woken here must not be entered from inside another)."""
        if self.done():  # the waiter went away (cancelled, or its loop is closing)
            return
        if isinstance(error, StopIteration):  # a future refuses it, as a coroutine's return would
            converted = RuntimeError(f"the call raised StopIteration: {error!r}")
            converted.__cause__ = error
            error = converted
        if error is not None:
            super().set_exception(error)
        else:
            super().set_result(value)
        waiting, self._waiting = self._waiting, ()
        for fn, context in waiting:
            try:
                context.run(fn, self)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:  # noqa: BLE001 - reported as the loop reports a callback's
                self.get_loop().call_exception_handler(
                    {"message": f"Exception in callback {fn!r}", "exception": exc, "future": self}
                )


class Door:
    """The pipe through which committing threads hand one event loop its outcomes. Its
    descriptors close when it is garbage: once its loop is closed (`door` forgets it then) and
    no queued write still holds it, so no thread can write to a descriptor closed under it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._read, self._write = os.pipe()
        self._release = weakref.finalize(self, _close_pipe, self._read, self._write)
        os.set_blocking(self._read, False)
        self._lock = threading.Lock()
        self._pending: list[tuple[Outcome[Any], Any, BaseException | None]] = []
        try:
            loop.add_reader(self._read, self._deliver)
        except BaseException:
            self._release()
            raise

    def post(self, future: Outcome[Any], value: Any, error: BaseException | None) -> None:
        """Hand `future` its outcome (from any thread)."""
        with self._lock:
            first = not self._pending  # else a byte is on its way already, and this rides along
            self._pending.append((future, value, error))
        if first:  # outside the lock: the loop, woken, takes it at once
            os.write(self._write, b"\0")  # a byte or two at most is ever in the pipe

    def _deliver(self) -> None:
        try:
            os.read(self._read, 4096)
        except BlockingIOError:  # woken with nothing to read: what is pending is delivered anyway
            pass
        with self._lock:
            pending, self._pending = self._pending, []
        for future, value, error in pending:
            future.settle(value, error)


def _close_pipe(read: int, write: int) -> None:
    os.close(read)
    os.close(write)


_doors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Door | None] = (
    weakref.WeakKeyDictionary()
)
_doors_lock = threading.Lock()


def door(loop: asyncio.AbstractEventLoop) -> Door | None:
    """The running `loop`'s door, opened on its first write; None if the loop cannot watch a
    pipe (its outcomes then go through `call_soon_threadsafe`). Opening one forgets those of
    loops closed since, so that a program running many loops in turn keeps few pipes open."""
    try:
        return _doors[loop]
    except KeyError:
        pass
    except TypeError:  # a loop that cannot be weakly referenced goes without a door
        return None
    with _doors_lock:
        for other in [other for other in _doors if other.is_closed()]:
            del _doors[other]
        try:
            opened: Door | None = Door(loop)
        except NotImplementedError:  # a loop without `add_reader` (Windows' proactor)
            opened = None
        _doors[loop] = opened
        return opened


def hand_over(
    future: Outcome[Any], door: Door | None, value: Any, error: BaseException | None
) -> None:
    """Hand a coroutine its outcome on its own loop (from the committing thread)."""
    if door is not None:
        door.post(future, value, error)
        return
    try:
        future.get_loop().call_soon_threadsafe(future.settle, value, error)
    except RuntimeError:  # the loop is closed: its waiters are gone with it
        logger.debug("a queued write finished after its event loop closed")


class Bell:
    """What a queue's own thread waits on for the next batch it must lead; `ring(lead=False)`
    stops it. A bare queue, not a pipe: writing to a pipe lets go of the interpreter's lock, and
    the woken thread would take it while the loop still finishes its turn, each then waiting for
    the other."""

    def __init__(self, lead: Callable[[], None]) -> None:
        self._rings: queue.SimpleQueue[bool] = queue.SimpleQueue()
        thread = threading.Thread(target=self._run, args=(lead,), name="sessionlog-commit")
        thread.daemon = True
        thread.start()

    def ring(self, *, lead: bool = True) -> None:
        self._rings.put(lead)

    def _run(self, lead: Callable[[], None]) -> None:
        while self._rings.get():
            try:
                lead()
            except BaseException:  # each caller of the batch has it already; lead on
                logger.exception("a batch led for coroutines was interrupted")


def _forget_after_fork() -> None:
    """In a child made by fork(): the doors' pipes are the parent's, and their locks may be
    held by threads that are not in the child."""
    global _doors_lock
    _doors_lock = threading.Lock()
    for found in list(_doors.values()):
        if found is not None:
            found._release()
    _doors.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
