"""The session engine for asyncio code: `AsyncSessionStore` awaits each verb of a `SessionStore`.

Every call runs on a thread, never on the event loop, so an LMDB commit (an fsync) or a PostgreSQL
round trip never blocks other tasks. Reads run one at a time on one worker owned by the store, in
the order they were awaited: the engine's read cache is not shared between threads. Writes are
queued for the store's group commit in the order they were awaited and their futures awaited, so
concurrent tasks share durable commits with each other and with the store's other writers (see
`sessions/_group.py`); a write and a read awaited concurrently are not ordered between themselves.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sessions._store import SessionStore

T = TypeVar("T")


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
        """Run `function(*args, **kwargs)` on the store's worker thread and await its result."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._worker, functools.partial(function, *args, **kwargs)
        )

    async def _write(self, verb: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Queue the store's write verb `verb(*args, **kwargs)` for a shared durable commit and
        await its result (see the module doc)."""
        return await self.store._group.submit(functools.partial(verb, *args, **kwargs))

    def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `function(*args, **kwargs)` on the store's worker thread and wait for it: for
        blocking callers that share the store with asyncio code (never from the worker itself,
        nor from a coroutine)."""
        if threading.current_thread() in self._worker._threads:
            return function(*args, **kwargs)  # already on the worker (a nested call)
        return self._worker.submit(function, *args, **kwargs).result()

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

    # The verbs, each as its `SessionStore` namesake.

    async def open_session(self, session_id: str | None = None, **options: Any) -> str:
        return await self._write(self.store.open_session, session_id, **options)

    async def exists(self, session_id: object) -> bool:
        return await self.run(self.store.exists, session_id)

    async def inject(
        self,
        session_id: str,
        message: Mapping[str, Any],
        *,
        expected_length: int | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        await self._write(
            self.store.inject,
            session_id,
            message,
            expected_length=expected_length,
            idempotency_key=idempotency_key,
        )

    async def inject_many(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        expected_length: int | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        return await self._write(
            self.store.inject_many,
            session_id,
            messages,
            expected_length=expected_length,
            idempotency_key=idempotency_key,
        )

    async def messages(
        self,
        session_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        last: int | None = None,
    ) -> list[dict[str, Any]]:
        return await self.run(self.store.messages, session_id, after=after, limit=limit, last=last)

    async def length(self, session_id: str) -> int:
        return await self.run(self.store.length, session_id)

    async def pop(
        self, session_id: str, *, expected_length: int | None = None
    ) -> dict[str, Any] | None:
        return await self._write(self.store.pop, session_id, expected_length=expected_length)

    async def rewind(
        self, session_id: str, to_length: int, *, expected_length: int | None = None
    ) -> int:
        return await self._write(
            self.store.rewind, session_id, to_length, expected_length=expected_length
        )

    async def reset(self, session_id: str) -> None:
        await self._write(self.store.reset, session_id)

    async def fork(self, source_id: str, destination_id: str | None = None) -> str:
        return await self._write(self.store.fork, source_id, destination_id)

    async def fork_at(
        self, source_id: str, keep_first: int, destination_id: str | None = None
    ) -> str:
        return await self._write(self.store.fork_at, source_id, keep_first, destination_id)

    async def delete(self, session_id: str, *, reason: str | None = None) -> None:
        await self._write(self.store.delete, session_id, reason=reason)

    async def close_session(self, session_id: str, status: str | None = None) -> None:
        await self._write(self.store.close_session, session_id, status)

    async def snapshot(self, session_id: object) -> dict[str, Any] | None:
        return await self.run(self.store.snapshot, session_id)

    async def summary(self, session_id: object) -> dict[str, Any] | None:
        return await self.run(self.store.summary, session_id)

    async def list_sessions(
        self, *, cursor: str | None = None, limit: int = 50, status: str | None = None
    ) -> dict[str, Any]:
        return await self.run(self.store.list_sessions, cursor=cursor, limit=limit, status=status)
