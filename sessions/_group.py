"""Group commit: concurrent writers of one process share durable commits.

A command called outside any transaction joins a queue. The first caller that finds no commit in
progress leads: it takes every queued command, runs each in its own savepoint of one transaction
(a refused command undoes only itself and raises only to its own caller), commits once, and hands
each caller its result. Callers that arrived meanwhile wait and form the next batch, led by the
first of them. Every caller returns only after the commit holding its events is durable, so a
caller acknowledges nothing that a crash could still lose; the shared commit just pays the disk's
sync once for the whole batch instead of once per command.

Commands run on the leader's thread, inside the caller's own `contextvars` context.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast

from eventlog import EventLog

_T = TypeVar("_T")
_P = ParamSpec("_P")

BATCH_MAX = 256
"""Commands one shared commit carries at most; the rest wait for the next."""

GATHER_S = 0.001
"""How long a leader waits, at most, for the writers of the previous shared commit to queue their
next commands. They were all woken at once, and without this wait the first of them back would
commit alone while the others queue behind it, halving the commands per commit. A writer with
nobody beside it never waits (its previous commit held only its own command)."""


class _Slot:
    """One queued command and, once its batch has committed, its outcome."""

    __slots__ = ("command", "context", "done", "error", "lead", "result", "settled", "woken")

    def __init__(self, command: Callable[[], Any]) -> None:
        self.command = command
        self.context = contextvars.copy_context()
        self.result: Any = None
        self.error: BaseException | None = None
        self.woken = threading.Lock()
        """Held until the slot is woken, once: to lead, or because its batch is over (a bare
        lock is the cheapest way to park a thread and wake it)."""
        self.woken.acquire()
        self.lead = False
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
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._gathering = False
        self._last_batch = 1
        self._queue: list[_Slot] = []
        self._leading = False
        self._leader: int | None = None
        """The thread running a batch now, if any."""
        self.commits = 0
        """Commits this queue has run that held more than one command (for tests and benches)."""
        self.shared = 0
        """Commands those shared commits carried."""

    @property
    def waiting(self) -> int:
        """Commands queued and not yet taken into a commit."""
        with self._lock:
            return len(self._queue)

    def run(self, command: Callable[[], _T]) -> _T:
        """`command()` in a shared durable commit; its result, or its error, once committed."""
        if self._leader == threading.get_ident():
            # A command of the batch, or a subscriber hearing its commit, writes again from the
            # leader's thread: it cannot wait for the batch it is part of, so it commits alone.
            with self._log.transaction():
                return command()
        return self.wait(self.enqueue(command))

    def enqueue(self, command: Callable[[], _T]) -> Ticket[_T]:
        """Queue `command` without waiting: commands run in the order they were queued. Some
        thread must then `wait` for the ticket (the lead may fall to it)."""
        slot = _Slot(command)
        with self._lock:
            self._queue.append(slot)
            if not self._leading:
                self._leading = slot.lead = True
            elif self._gathering:
                self._arrived.notify()
        return Ticket(slot)

    def wait(self, ticket: Ticket[_T]) -> _T:
        """The result of a queued command, or its error, once the commit holding it is durable
        (leading that commit if the lead falls to this caller)."""
        slot = ticket.slot
        if not slot.lead:
            slot.woken.acquire()
        if not slot.done:
            self._lead()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[no-any-return]

    def _lead(self) -> None:
        """Take the queue, commit it, then hand the lead to the next waiter, if any."""
        with self._lock:
            self._gather()
            batch, self._queue = self._queue[:BATCH_MAX], self._queue[BATCH_MAX:]
            self._last_batch = len(batch)
        self._leader = threading.get_ident()
        try:
            self._commit(batch)
        except BaseException as exc:  # the leader was interrupted: nothing unsettled committed
            for slot in batch:
                if not slot.settled:
                    slot.error = exc
            raise
        finally:
            self._leader = None
            with self._lock:
                for slot in batch:
                    slot.done = True
                    if not slot.lead:  # the one that led is awake already
                        slot.woken.release()
                if self._queue:
                    follower = self._queue[0]
                    follower.lead = True
                    follower.woken.release()
                else:
                    self._leading = False

    def _gather(self) -> None:
        """Wait (holding the lock between waits) until as many commands are queued as the last
        batch held, or `GATHER_S` has passed."""
        wanted = min(self._last_batch, BATCH_MAX)
        if len(self._queue) >= wanted:
            return
        deadline = time.monotonic() + GATHER_S
        self._gathering = True
        try:
            while len(self._queue) < wanted:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._arrived.wait(left)
        finally:
            self._gathering = False

    def _commit(self, batch: list[_Slot]) -> None:
        if len(batch) == 1:
            self._alone(batch[0])
            return
        try:
            with self._log.transaction():
                for slot in batch:
                    self._savepoint(slot)
        except Exception:  # noqa: BLE001 - retried command by command: only the bad ones fail
            # The shared commit failed (nothing of it is kept): each command tries again alone,
            # so a failure that one of them causes reaches only its own caller.
            for slot in batch:
                slot.result = slot.error = None
                self._alone(slot)
            return
        self.commits += 1
        self.shared += len(batch)
        for slot in batch:
            slot.settled = True

    def _savepoint(self, slot: _Slot) -> None:
        try:
            with self._log.transaction():
                slot.result = slot.context.run(slot.command)
        except Exception as exc:  # noqa: BLE001 - the refusal goes to its own caller
            slot.error = exc

    def _alone(self, slot: _Slot) -> None:
        try:
            with self._log.transaction():
                slot.result = slot.context.run(slot.command)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's own thread
            slot.error = exc
        slot.settled = True


class _Grouping(Protocol):
    log: EventLog
    _group: GroupCommit


def grouped(verb: Callable[_P, _T]) -> Callable[_P, _T]:
    """Make a store's write verb join the group commit when called outside a transaction (inside
    one it runs there, as before)."""

    @functools.wraps(verb)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        store = cast(_Grouping, args[0])
        if store.log.in_transaction:
            return verb(*args, **kwargs)
        return store._group.run(lambda: verb(*args, **kwargs))

    return run
