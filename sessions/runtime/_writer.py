"""The one thread that writes a store for the runtime, and group commit.

LMDB admits one write transaction at a time and binds it to the thread that began it. With
`asyncio.to_thread` every concurrent prompt would park a pool thread on the log's writer lock and
pay its own fsync. Here one dedicated thread owns every runtime write: jobs queue up while a commit
is in flight, and the next commit runs all of them, so one fsync acknowledges many prompts. A job's
future resolves only after the commit that holds it is durable. It never runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from eventlog import LogClosedError
from sessions._store import SessionStore
from sessions.runtime import _limits

T = TypeVar("T")
logger = logging.getLogger("sessionlog.runtime")


@dataclass
class _Job:
    fn: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # the waiter went away (its loop is closing): nobody to tell
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class Writer:
    """Runs store jobs (plain functions) on one thread, many per durable commit.

    A job must follow the engine's rule for commands: it decides (and may raise) before it appends,
    so a refused job leaves the shared transaction untouched. If a commit fails anyway, each job of
    that batch runs again in a transaction of its own, so one bad job fails alone.
    """

    def __init__(self, store: SessionStore, name: str) -> None:
        self.store = store
        self.commits = 0
        self.jobs = 0
        self.busy_s = 0.0
        """Time spent running jobs and committing them (fsync included), for benchmarks."""
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Queue `fn`; the future resolves with its result once its commit is durable."""
        if not self._thread.is_alive():
            raise LogClosedError("the runtime's writer has stopped")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Job(fn, loop, future))
        return future

    def stop(self) -> None:
        """Finish the jobs already queued, then end the thread."""
        self._queue.put(None)
        self._thread.join(_limits.shutdown_wait_s)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < _limits.writer_batch_jobs_max:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                    break
                batch.append(job)
            self._commit(batch)

    def _commit(self, batch: list[_Job]) -> None:
        outcomes: list[tuple[_Job, Any, BaseException | None]] = []
        started = time.perf_counter()
        try:
            with self.store.transaction():
                for job in batch:
                    try:
                        outcomes.append((job, job.fn(), None))
                    except Exception as exc:  # noqa: BLE001 - the refusal goes to its own caller
                        outcomes.append((job, None, exc))
        except Exception as failure:  # noqa: BLE001 - retried job by job: only the bad ones fail
            if len(batch) > 1:
                logger.warning("a group commit of %d jobs failed; retrying one by one", len(batch))
                for job in batch:
                    self._commit([job])
                return
            outcomes = [(batch[0], None, failure)]
        else:
            self.commits += 1
            self.jobs += len(batch)
        self.busy_s += time.perf_counter() - started
        for job, value, error in outcomes:
            _tell(job, value, error)


def _tell(job: _Job, value: Any, error: BaseException | None) -> None:
    try:
        job.loop.call_soon_threadsafe(_settle, job.future, value, error)
    except RuntimeError:  # the loop is closed: its waiters are gone with it
        logger.debug("a runtime job finished after its event loop closed")


async def outcome(future: asyncio.Future[T]) -> tuple[T, bool]:
    """A queued job's result, waited for through cancellation: once queued, the job commits or
    fails regardless, and the caller must know which before it gives up. Returns the result and
    whether the caller was cancelled meanwhile."""
    interrupted = False
    while True:
        try:
            return await asyncio.shield(future), interrupted
        except asyncio.CancelledError:
            interrupted = True
        except Exception:
            if interrupted:  # nothing was written; the cancellation is what the caller asked for
                raise asyncio.CancelledError from None
            raise
