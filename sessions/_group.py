"""Group commit: the writers of one process share durable commits.

Every write that is not already inside a transaction joins one queue per store: the store's verbs
called from threads, the asyncio face (`sessions.aio`), the delegation runtime and the HTTP
service. The first caller that finds no commit in progress leads: it waits, briefly, until as
many commands are queued as the previous batch held (the writers it woke are on their way back),
runs them one after another in one transaction, taking in any that arrive meanwhile, commits once,
and hands each caller its result. A refused command fails only its own caller and leaves nothing
behind: the engine's commands refuse before they write, so none needs a savepoint of its own, and
should one raise after writing, the batch runs again with a savepoint per command. Callers that
arrive after the batch is closed wait and form the next one, led by the first of them. Every
caller gets its result only after the commit holding its events is durable, so nothing
acknowledged can be lost to a crash; the shared commit pays the disk's sync once for the whole
batch (on PostgreSQL, one round trip of `COMMIT` for the batch instead of one per command).

A thread caller waits on a bare lock and may be handed the lead; the callers of a batch are woken
one by the other, in a chain. A coroutine (`submit`) never blocks its event loop: it awaits a
future, and when the lead falls to it, a thread of the queue's own leads that batch (how the two
hand work to each other: `sessions/_handoff.py`). Commands run on the leading thread, inside the
caller's own `contextvars` context.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from eventlog import EventLog, LogClosedError, OutcomeUnknownError
from sessions._handoff import Bell, Door, Outcome, door, hand_over

_T = TypeVar("_T")
_P = ParamSpec("_P")
logger = logging.getLogger("sessionlog.group")

BATCH_MAX = 256
"""Commands one shared commit carries at most; the rest wait for the next. The bound keeps one
commit's latency, and what one failed commit takes down, small."""

GATHER_S = 0.001
"""How long a leader waits, at most, for the writers of the previous shared commit to queue their
next commands before it runs its batch. They were all woken at once, and without this wait the
first of them back would commit alone while the others queue behind it, halving the commands per
commit. The leader waits before it runs anything rather than running what is queued while the
others arrive: every call into LMDB or zstd lets go of the interpreter's lock, and a thread on its
way back takes it each time, so a batch run among returning writers cost twice the CPU of one run
after them (16 writer threads: 50 against 34 to 43 µs a command, measured). A writer with nobody
beside it never waits (its previous commit held only its own command)."""


class _Slot:
    """One queued command and, once its batch has committed, its outcome."""

    __slots__ = (
        "command",
        "context",
        "done",
        "door",
        "error",
        "future",
        "lead",
        "next",
        "result",
        "settled",
        "solo",
        "stamp",
        "woken",
    )

    def __init__(
        self,
        command: Callable[[], Any],
        stamp: dict[str, Any] | None,
        solo: bool,
        future: Outcome[Any] | None,
        door: Door | None = None,
    ) -> None:
        self.command = command
        self.stamp = stamp
        self.solo = solo
        self.context = contextvars.copy_context()
        self.future = future
        """The awaiting coroutine's future; None for a thread caller."""
        self.door = door
        """Where its outcome goes to the coroutine's loop (see `sessions/_handoff.py`)."""
        self.result: Any = None
        self.error: BaseException | None = None
        self.woken = threading.Lock()
        """A thread caller's: held until the slot is woken, once, to lead or because its batch is
        over (a bare lock is the cheapest way to park a thread and wake it)."""
        if future is None:
            self.woken.acquire()
        self.lead = False
        self.next: _Slot | None = None
        """The next thread caller of its batch to wake, once this one is awake (see `_finish`)."""
        self.done = False
        self.settled = False
        """Its outcome is known: committed, or an error of its own."""


class Ticket(Generic[_T]):
    """A queued command, to `GroupCommit.wait` for."""

    __slots__ = ("slot",)

    def __init__(self, slot: _Slot) -> None:
        self.slot = slot


class GroupCommit:
    """The queue of one store's commands waiting for a shared commit (see the module doc)."""

    def __init__(self, log: EventLog) -> None:
        self._log = log
        self._start()
        self.commits = 0
        """Commits this queue has run that held more than one command (for tests and benches)."""
        self.shared = 0
        """Commands those shared commits carried."""
        self.busy_s = 0.0
        """Time spent running batches and committing them (the sync included), for benches."""
        _queues.add(self)

    def _start(self) -> None:
        """The queue's state, empty; also what a child made by fork() starts from, since the
        threads that held its locks or led its batch are not in the child (its writes then meet
        the log's own refusal of a store used across fork(), instead of waiting forever)."""
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._gathering = False
        self._awaited = 1
        self._last_batch = 1
        self._queue: list[_Slot] = []
        self._leading = False
        self._closed = False
        self._driver: Bell | None = None
        """The thread that leads the batches whose lead falls to a coroutine (started when one
        first does)."""
        self._leader: int | None = None
        """The thread running a batch now, if any."""

    @property
    def waiting(self) -> int:
        """Commands queued and not yet taken into a commit."""
        with self._lock:
            return len(self._queue)

    def run(
        self, command: Callable[[], _T], *, stamp: dict[str, Any] | None = None, solo: bool = False
    ) -> _T:
        """`command()` in a shared durable commit; its result, or its error, once committed.
        `stamp` marks the command's first event (`Transaction.stamp_next_append`); `solo` gives
        it a commit of its own (a big import)."""
        if self._leader == threading.get_ident():
            # A command of the batch, or a subscriber hearing its commit, writes again from the
            # leader's thread: it cannot wait for the batch it is part of, so it commits alone.
            slot = _Slot(command, stamp, solo, None)
            self._alone(slot)
            return self._outcome(slot)  # type: ignore[no-any-return]
        return self.wait(self.enqueue(command, stamp=stamp, solo=solo))

    def enqueue(
        self, command: Callable[[], _T], *, stamp: dict[str, Any] | None = None, solo: bool = False
    ) -> Ticket[_T]:
        """Queue `command` without waiting: commands run in the order they were queued. The same
        thread must then `wait` for the ticket (the lead may fall to it), and soon: the callers
        after it in its commit are woken only once it is (`_park`), so tickets are waited for in
        the order they were queued."""
        slot = _Slot(command, stamp, solo, None)
        self._join(slot)
        return Ticket(slot)

    def wait(self, ticket: Ticket[_T]) -> _T:
        """The result of a queued command, or its error, once the commit holding it is durable
        (leading that commit if the lead falls to this caller)."""
        slot = ticket.slot
        interrupted = None if slot.lead else self._park(slot)
        if not slot.done:
            self._lead()
        if interrupted is not None:
            raise interrupted
        return self._outcome(slot)  # type: ignore[no-any-return]

    def submit(
        self, command: Callable[[], _T], *, stamp: dict[str, Any] | None = None, solo: bool = False
    ) -> asyncio.Future[_T]:
        """From a coroutine: queue `command` (as `run` does) and return a future of the running
        loop that resolves once the commit holding it is durable. No thread waits for it; when
        the lead falls to it, the queue's own thread leads its batch."""
        loop = asyncio.get_running_loop()
        future: Outcome[_T] = Outcome(loop=loop)
        slot = _Slot(command, stamp, solo, future, door(loop))
        if self._join(slot):
            self._drive()
        return future

    def close(self) -> None:
        """Refuse new commands, wait until the queued ones are committed or refused, and stop the
        queue's own thread. Called by the store's `close`."""
        with self._lock:
            self._closed = True
            while self._leading and self._leader != threading.get_ident():
                self._idle.wait()
            driver, self._driver = self._driver, None
        if driver is not None:
            driver.ring(lead=False)

    def _park(self, slot: _Slot) -> BaseException | None:
        """Wait until `slot` is woken, then wake the next caller of its batch: woken one after
        another, each by the one before it, the callers take the interpreter's lock in turn
        instead of all fighting for it at once (a wake-up that finds it held costs a second
        thread switch). An interruption (a signal's exception, Ctrl-C) does not end the wait: the
        command is queued and commits or fails regardless, the callers after it are woken by
        this one, and the lead may fall to it; the first interruption is returned, to be raised
        once the command's outcome is settled."""
        interrupted: BaseException | None = None
        while True:
            try:
                slot.woken.acquire()
                break
            except BaseException as exc:  # noqa: BLE001 - raised by `wait` once settled
                interrupted = interrupted or exc
        if slot.next is not None:
            slot.next.woken.release()
        return interrupted

    def _join(self, slot: _Slot) -> bool:
        """Queue `slot`; whether the lead fell to it."""
        with self._lock:
            if self._closed:
                raise LogClosedError(f"the log {self._log.description} is closed")
            self._queue.append(slot)
            if not self._leading:
                self._leading = slot.lead = True
            elif self._gathering and len(self._queue) >= self._awaited:
                self._arrived.notify()  # the leader waits for this many before it runs them
        return slot.lead

    @staticmethod
    def _outcome(slot: _Slot) -> Any:
        if slot.error is not None:
            raise slot.error
        return slot.result

    def _drive(self) -> None:
        """Lead the next batch on the queue's own thread (its first command is a coroutine's)."""
        if self._driver is None:
            self._driver = Bell(self._lead)
        self._driver.ring()

    def _lead(self) -> None:
        """Take the queue, commit it, then hand the lead to the next waiter, if any."""
        deadline = time.monotonic() + GATHER_S
        with self._lock:
            wanted = min(self._last_batch, BATCH_MAX)
            if wanted > 1 and self._queue and not self._queue[0].solo:
                self._gather(wanted, deadline)
            batch = self._take(BATCH_MAX)
        self._leader = threading.get_ident()
        started = time.perf_counter()
        try:
            self._commit(batch, wanted, deadline)
        except BaseException as exc:  # the leader was interrupted: nothing unsettled committed
            for slot in batch:
                if not slot.settled:
                    slot.error = exc
            raise
        finally:
            self._last_batch = len(batch)
            self.busy_s += time.perf_counter() - started
            self._leader = None
            self._finish(batch)

    def _take(self, room: int) -> list[_Slot]:
        """Up to `room` commands off the head of the queue (the lock held): a solo one alone,
        and none after a solo one."""
        queue = self._queue
        end = min(len(queue), room)
        if not end:
            return []
        end = 1 if queue[0].solo else next((k for k in range(1, end) if queue[k].solo), end)
        taken, self._queue = queue[:end], queue[end:]
        return taken

    def _finish(self, batch: list[_Slot]) -> None:
        """Wake the batch's callers and hand the lead on (or end it). The first thread caller is
        woken after the queue's lock is released (each one woken goes straight for that lock to
        queue its next command, and would only block on it again), and wakes the next (`_park`)."""
        follower = first = None
        with self._lock:
            for slot in reversed(batch):
                slot.done = True
                if slot.future is None and not slot.lead:  # the one that led is awake already
                    slot.next, first = first, slot
            if self._queue:
                follower = self._queue[0]
                follower.lead = True
                if follower.future is not None:
                    self._drive()
            else:
                self._leading = False
                if self._closed:  # only `close` waits for the queue to go idle
                    self._idle.notify_all()
        for slot in batch:
            if slot.future is not None:
                hand_over(slot.future, slot.door, slot.result, slot.error)
        if first is not None:
            first.woken.release()
        if follower is not None and follower.future is None:
            follower.woken.release()

    def _gather(self, awaited: int, deadline: float) -> None:
        """Wait (the lock held) until `awaited` commands are queued, or until `deadline`."""
        self._awaited = awaited
        while len(self._queue) < awaited:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._gathering = True
            try:
                self._arrived.wait(left)
            finally:
                self._gathering = False

    def _more(self, batch: list[_Slot], wanted: int, deadline: float) -> bool:
        """Add to `batch` the commands queued since it was taken, waiting for one until
        `deadline` if none is (a writer of the previous batch still on its way back: see
        `GATHER_S`); whether any came. A solo command waits for a commit of its own."""
        with self._lock:
            # Woken for every second command still missing, not for each: a wake-up costs a
            # thread switch, and the commands already queued then run in one go.
            self._gather(max(1, (wanted - len(batch)) // 2), deadline)
            if not self._queue:
                return False
            if self._queue[0].solo:
                return False
            batch.extend(self._take(min(BATCH_MAX, wanted) - len(batch)))
            return True

    def _commit(self, batch: list[_Slot], wanted: int, deadline: float) -> None:
        if batch[0].solo or (len(batch) == 1 and wanted == 1):
            self._alone(batch[0])
            return
        try:
            self._together(batch, wanted, deadline, savepoints=False)
        except _Tangled:
            # A command raised after it had written: only a savepoint undoes it alone. The batch
            # runs again from the start, each command in a savepoint of its own.
            self._again(batch, savepoints=True)
        except OutcomeUnknownError:
            raise  # the batch may have committed: run again, it could be written twice
        except Exception:  # noqa: BLE001 - retried command by command: only the bad ones fail
            self._again(batch, savepoints=None)

    def _again(self, batch: list[_Slot], *, savepoints: bool | None) -> None:
        """Run `batch` again after its shared commit failed (nothing of it was kept): in one
        commit with a savepoint per command, or (`None`, or when that fails too) each command in
        a commit of its own, so a failure that one of them causes reaches only its own caller."""
        for slot in batch:
            slot.result = slot.error = None
        if savepoints:
            try:
                self._together(batch, len(batch), 0.0, savepoints=True)
                return
            except OutcomeUnknownError:
                raise  # as in `_commit`: it may have committed
            except Exception:  # noqa: BLE001 - the commit itself failed: one by one then
                for slot in batch:
                    slot.result = slot.error = None
        logger.warning("a group commit of %d commands failed; retrying one by one", len(batch))
        for slot in batch:
            self._alone(slot)

    def _together(
        self, batch: list[_Slot], wanted: int, deadline: float, *, savepoints: bool
    ) -> None:
        """Run the commands of `batch` in one transaction, taking in those queued meanwhile
        until it holds `wanted` (waiting for them until `deadline`), and commit it.

        The engine's commands decide, and raise, before they write anything, so a command that
        raised having written nothing needs no savepoint: the transaction is as if it never ran.
        Without `savepoints`, each runs straight in the shared transaction, and one that raised
        after writing aborts it (`_Tangled`); with them, each runs in a savepoint of its own."""
        done = 0
        with self._log.transaction() as tx:
            while True:
                for slot in batch[done:]:
                    if savepoints:
                        self._savepoint(slot)
                        continue
                    before = tx.writes
                    try:
                        slot.result = slot.context.run(_stamped, tx, slot)
                    except Exception as exc:  # the refusal goes to its own caller
                        if tx.writes != before:
                            raise _Tangled from exc
                        slot.error = exc
                done = len(batch)
                if done >= wanted or not self._more(batch, wanted, deadline):
                    break
        self.commits += 1
        self.shared += len(batch)
        for slot in batch:
            slot.settled = True

    def _savepoint(self, slot: _Slot) -> None:
        try:
            with self._log.transaction() as savepoint:
                slot.result = slot.context.run(_stamped, savepoint, slot)
        except Exception as exc:  # noqa: BLE001 - the refusal goes to its own caller
            slot.error = exc

    def _alone(self, slot: _Slot) -> None:
        try:
            with self._log.transaction() as tx:
                slot.result = slot.context.run(_stamped, tx, slot)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's own thread
            slot.error = exc
        slot.settled = True


_queues: weakref.WeakSet[GroupCommit] = weakref.WeakSet()


def _restart_after_fork() -> None:
    for group in list(_queues):
        closed = group._closed
        group._start()
        group._closed = closed


os.register_at_fork(after_in_child=_restart_after_fork)


class _Tangled(Exception):
    """A command of a batch run without savepoints raised after it had written."""


def _stamped(tx: Any, slot: _Slot) -> Any:
    """Run the slot's command, its first event stamped with the slot's `stamp`, if any."""
    if slot.stamp is None:
        return slot.command()
    tx.stamp_next_append(slot.stamp)
    try:
        return slot.command()
    finally:
        tx.stamp_next_append(None)


async def outcome(future: asyncio.Future[_T]) -> tuple[_T, bool]:
    """A queued command's result, waited for through cancellation: once queued, the command
    commits or fails regardless, and the caller must know which before it gives up. Returns the
    result and whether the caller was cancelled meanwhile."""
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


class _Grouping(Protocol):
    log: EventLog
    _group: GroupCommit


def grouped(verb: Callable[_P, _T]) -> Callable[_P, _T]:
    """Make a store's write verb join the group commit when called outside a transaction (inside
    one it runs there, as before)."""

    @functools.wraps(verb)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        store: _Grouping = args[0]  # type: ignore[assignment]  # not `cast`: a call per verb
        if store.log.current_transaction() is not None:  # `in_transaction`, a call shorter
            return verb(*args, **kwargs)
        return store._group.run(lambda: verb(*args, **kwargs))

    return run
