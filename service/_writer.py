"""Group commit: every write of the service runs on one writer thread, and the commands that
arrive together share one durable commit.

Each command runs in its own savepoint inside the batch's transaction, so a refused command undoes
only itself; a request is answered only after the commit that holds it is durable, so an answer
of 2xx always means the write survives a crash. The event loop never waits on LMDB or an fsync.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eventlog import LogClosedError
from service import _limits
from sessions import SessionStore

logger = logging.getLogger("sessionlog.service")


@dataclass
class _Job:
    run: Callable[[], Any]
    stamp: dict[str, Any] | None
    solo: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = None
    done: bool = field(default=False)


class Writer:
    """`await writer.submit(fn)` runs `fn()` on the writer thread and returns its result once the
    commit holding it is durable. `stamp` marks the command's first event (idempotency keys);
    `solo` runs a command in a transaction of its own (big imports)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="sessionlog-writer", daemon=True)
        self._closed = False
        self._thread.start()

    async def submit(
        self, run: Callable[[], Any], *, stamp: dict[str, Any] | None = None, solo: bool = False
    ) -> Any:
        if self._closed:
            raise LogClosedError("the service is stopping; nothing was written")
        loop = asyncio.get_running_loop()
        job = _Job(run, stamp, solo, loop, loop.create_future())
        self._queue.put(job)
        return await job.future

    def close(self) -> None:
        """Finish the queued commands, then stop the thread."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()

    def _loop(self) -> None:
        pending: _Job | None = None
        stop = False
        while not stop:
            job = pending if pending is not None else self._queue.get()
            pending = None
            if job is None:
                return
            batch = [job]
            while not job.solo and len(batch) < _limits.write_batch_commands_max:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                if more.solo:
                    pending = more
                    break
                batch.append(more)
            self._commit(batch)
            for done in batch:
                done.loop.call_soon_threadsafe(_settle, done)

    def _commit(self, batch: list[_Job]) -> None:
        log = self.store.log
        try:
            with log.transaction():
                for job in batch:
                    self._run_one(job)
        except BaseException as exc:  # noqa: BLE001 - the commit failed: nobody in it was written
            for job in batch:
                if job.error is None:
                    job.error = exc
                    job.result = None

    def _run_one(self, job: _Job) -> None:
        log = self.store.log
        try:
            with log.transaction() as savepoint:
                if job.stamp is not None:
                    savepoint.stamp_next_append(job.stamp)
                job.result = job.run()
                savepoint.stamp_next_append(None)
        except Exception as exc:  # noqa: BLE001 - a refused command undoes only its savepoint
            job.error = exc


def _settle(job: _Job) -> None:
    if job.future.done():  # the caller went away
        return
    if job.error is not None:
        job.future.set_exception(job.error)
    else:
        job.future.set_result(job.result)
