"""The session engine for asyncio code: `AsyncSessionStore` awaits each verb of a `SessionStore`.

Every call runs on a thread, never on the event loop, so an LMDB commit (an fsync) or a PostgreSQL
round trip never blocks other tasks. Reads run one at a time on one worker owned by the store, in
the order they were awaited: the engine's read cache is not shared between threads. Writes are
queued for the store's group commit in the order they were awaited and their futures awaited, so
concurrent tasks share durable commits with each other and with the store's other writers (see
`sessions/_group.py`); a write and a read awaited concurrently are not ordered between themselves.

A write once queued commits or is refused whatever its caller does next. So a task cancelled
while it awaits a write is not let go at once: it waits for that outcome, then raises
`CancelledError` (a write refused meanwhile raises the cancellation, not the refusal). When the
caller sees the cancellation the store no longer changes under it, and it can read what is there
before it retries. The same holds for the verbs that commit on the worker, in steps, and for a
function of the caller's own that writes (`run_write`). A read cancelled before the worker
reaches it does not run. Once `aclose` has
run, every verb raises `LogClosedError`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, ParamSpec, TypeVar

from eventlog import LogClosedError
from sessions._group import outcome
from sessions._handoff import Door, Outcome, door, hand_over
from sessions._store import SessionStore

T = TypeVar("T")
P = ParamSpec("P")
Verb = Callable[Concatenate[SessionStore, P], T]
Awaited = Callable[Concatenate["AsyncSessionStore", P], Coroutine[Any, Any, T]]


def _on_worker(verb: Verb[P, T]) -> Awaited[P, T]:
    """The awaited namesake of the store's read `verb`, run on the store's worker."""

    async def awaited(self: AsyncSessionStore, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.run(verb, self.store, *args, **kwargs)

    return _named(awaited, verb)


def _steps_on_worker(verb: Verb[P, T]) -> Awaited[P, T]:
    """The awaited namesake of a write `verb` that commits on its own, in steps, outside the
    group commit (forgetting, sweeping, re-wrapping keys, truncating the log): run on the
    store's worker, and settled before a cancellation is raised (`run_write`)."""

    async def awaited(self: AsyncSessionStore, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.run_write(verb, self.store, *args, **kwargs)

    return _named(awaited, verb)


def _writes(verb: Verb[P, T]) -> Awaited[P, T]:
    """The awaited namesake of the store's write `verb`: it joins the store's group commit."""

    async def awaited(self: AsyncSessionStore, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._write(verb, self.store, *args, **kwargs)

    return _named(awaited, verb)


def _named(awaited: Awaited[P, T], verb: Verb[P, T]) -> Awaited[P, T]:
    awaited.__name__ = verb.__name__
    awaited.__qualname__ = f"AsyncSessionStore.{verb.__name__}"
    return awaited


def _answer(future: Outcome[T], gate: Door | None, job: Callable[[], T]) -> None:
    """Run `job` on the worker and hand its outcome to the coroutine awaiting `future`."""
    if future.cancelled():  # its caller gave up before the worker got here
        return
    try:
        value = job()
    except BaseException as exc:  # noqa: BLE001 - every outcome belongs to its caller
        hand_over(future, gate, None, exc)
    else:
        hand_over(future, gate, value, None)


def _raised(settled: tuple[T, bool]) -> T:
    """The value of a settled write (`outcome`), or its caller's cancellation, raised now."""
    value, cancelled = settled
    if cancelled:
        raise asyncio.CancelledError
    return value


def _name_of(function: Callable[..., Any]) -> str:
    return getattr(function, "__name__", None) or type(function).__name__


def _new_worker() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="sessionlog-aio")


class AsyncSessionStore:
    """Await the verbs of `store`; `await AsyncSessionStore.open(path)` opens one."""

    def __init__(self, store: SessionStore, *, worker: ThreadPoolExecutor | None = None) -> None:
        self.store = store
        """The blocking store underneath (use it only from `run`)."""
        self._worker = worker or _new_worker()

    @classmethod
    async def open(cls, path: str | os.PathLike[str], **options: Any) -> AsyncSessionStore:
        """Open (creating if missing) the store at `path` (see `SessionStore.open`)."""
        worker = _new_worker()
        loop = asyncio.get_running_loop()
        opener = functools.partial(SessionStore.open, path, **options)
        try:
            store = await loop.run_in_executor(worker, opener)
        except BaseException:
            worker.shutdown(wait=False)
            raise
        return cls(store, worker=worker)

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `function(*args, **kwargs)` on the store's worker thread and await its result.
        The result comes back as a queued write's does (`sessions/_handoff.py`), waking the task
        in the turn of the loop that receives it. Cancelled before the worker reaches it, the
        call does not run."""
        return await self._submit(function, args, kwargs)

    async def run_write(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`run` for a function that writes in a transaction of its own (several verbs that
        must commit together, reads they depend on included): once submitted it runs, and
        commits or fails, whatever its caller does next, and a cancelled caller raises
        `CancelledError` only once it has, as the write verbs do."""
        return _raised(await self.run_write_outcome(function, *args, **kwargs))

    async def run_write_outcome(
        self, function: Callable[..., T], *args: Any, **kwargs: Any
    ) -> tuple[T, bool]:
        """`run_write`, returning the function's value and whether the caller was cancelled
        meanwhile instead of raising: for a caller that must first account for what was written
        (update its own copy of the state) and then raise the cancellation itself."""
        return await outcome(self._submit(function, args, kwargs))

    def _submit(
        self, function: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Outcome[T]:
        """Submit `function(*args, **kwargs)` to the worker; the future of its outcome."""
        loop = asyncio.get_running_loop()
        future: Outcome[T] = Outcome(loop=loop)
        job = functools.partial(function, *args, **kwargs)
        try:
            self._worker.submit(_answer, future, door(loop), job)
        except RuntimeError:  # the worker was stopped by `aclose`
            raise LogClosedError(f"{_name_of(function)}: the store is closed") from None
        return future

    async def _write(self, verb: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Queue the store's write verb `verb(*args, **kwargs)` for a shared durable commit and
        await its result; cancelled, it raises only once the write is settled (see the module
        doc)."""
        queued = self.store._group.submit(functools.partial(verb, *args, **kwargs))
        return _raised(await outcome(queued))

    def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `function(*args, **kwargs)` on the store's worker thread and wait for it: for
        blocking callers that share the store with asyncio code (never from the worker itself,
        nor from a coroutine)."""
        if threading.current_thread() in self._worker._threads:
            return function(*args, **kwargs)  # already on the worker (a nested call)
        try:
            pending = self._worker.submit(function, *args, **kwargs)
        except RuntimeError:  # the worker was stopped by `aclose`
            raise LogClosedError(f"{_name_of(function)}: the store is closed") from None
        return pending.result()

    async def aclose(self) -> None:
        """Close the store (after every call already awaited) and stop the worker."""
        try:
            await self.run(self._close)
        finally:
            self._worker.shutdown(wait=False)

    def _close(self) -> None:
        self.store.close()  # every queued write is committed or refused first

    async def __aenter__(self) -> AsyncSessionStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # The verbs, each the awaited namesake of its `SessionStore` verb.
    async def open_session(self, session_id: str | None = None, **options: Any) -> str:
        return await self._write(self.store.open_session, session_id, **options)

    exists = _on_worker(SessionStore.exists)
    inject = _writes(SessionStore.inject)
    inject_many = _writes(SessionStore.inject_many)
    messages = _on_worker(SessionStore.messages)
    length = _on_worker(SessionStore.length)
    pop = _writes(SessionStore.pop)
    rewind = _writes(SessionStore.rewind)
    reset = _writes(SessionStore.reset)
    fork = _writes(SessionStore.fork)
    fork_at = _writes(SessionStore.fork_at)
    delete = _writes(SessionStore.delete)
    close_session = _writes(SessionStore.close_session)
    snapshot = _on_worker(SessionStore.snapshot)
    summary = _on_worker(SessionStore.summary)
    list_sessions = _on_worker(SessionStore.list_sessions)
    forget = _steps_on_worker(SessionStore.forget)
    rotate_keys = _steps_on_worker(SessionStore.rotate_keys)
    sweep = _steps_on_worker(SessionStore.sweep)
    truncate_log = _steps_on_worker(SessionStore.truncate_log)
