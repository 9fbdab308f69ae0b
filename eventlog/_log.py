"""The event log: the front door that opens a store and hands out transactions, views and feeds.

Everything here is shared by every backend: the backend only stores bytes under keys. The log owns
the one writer at a time, the stack of nested transactions of each thread, delivery after commit,
and the handle's life (open, fork, close). What a transaction does is `eventlog/_transaction.py`;
reads are `eventlog/_view.py`; subscriptions `eventlog/_subscribe.py`; verify `eventlog/_verify.py`.
It never holds a read transaction across calls.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar, cast

from eventlog import _verify, limits
from eventlog._chain import RecordChecker
from eventlog._checks import ExpectedVersion, check_page, check_stream
from eventlog._codec import Envelope
from eventlog._handles import FORK_ADVICE, open_logs, open_on
from eventlog._lease import Lease
from eventlog._lease import check_name as check_lease_name
from eventlog._memory import MemoryStorage
from eventlog._open import open_storage
from eventlog._scratch import ScratchTxn
from eventlog._storage import Storage
from eventlog._subscribe import Subscription, Subscriptions, tail
from eventlog._transaction import ENDED, Carried, Projector, ScratchTransaction, Transaction
from eventlog._verify import VerifyReport
from eventlog._view import LogView
from eventlog.errors import (
    InvalidArgumentError,
    LogClosedError,
    StorageError,
    StoreBusyError,
    StoreFullError,
)
from eventlog.events import Event
from eventlog.limits import check_at_most

logger = logging.getLogger("sessionlog.eventlog")
_T = TypeVar("_T")


class EventLog:
    """An append-only, hash-chained event log.

    `EventLog.open(path)` is the durable LMDB log; `EventLog.memory()` is the in-memory reference
    log with the same behaviour. Use one instance per path per process, and never across `fork()`.
    """

    def __init__(self, storage: Storage, description: str) -> None:
        self._storage = storage
        self.description = description
        self._writer = threading.RLock()
        self._local = threading.local()
        self._subscriptions = Subscriptions(self._read_committed)
        self._closed = self._forked = False
        self._projector: Projector | None = None
        self._carried: Carried | None = None  # from the last commit (`Transaction.resume`)
        open_logs.add(self)

    def set_projector(self, projector: Projector | None) -> None:
        """Run `projector(tx, envelopes)` inside the transaction of every append, right after the
        events are written, so projection state commits (or aborts) with them (see `Projector`)."""
        with self._writer:
            self._projector, self._carried = projector, None

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        map_size: int = 64 * 1024 * 1024,
        sync: bool = True,
        readonly: bool = False,
        headroom_bytes: int = 2 * limits.transaction_bytes_max,
        format_version: int = 4,
    ) -> EventLog:
        """Open (creating if missing) the LMDB log in directory `path`.

        `format_version` is the on-disk format a new store is created with: 4 (one B-tree,
        `eventlog/_lmdb_tree.py`; records packed, `eventlog/_packing.py`; each `cluster_key`
        beside its stream's index), or for older readers 3 (every projection key in one region),
        2 (records as they are) or 1. An existing store keeps its own format whatever is asked;
        `export_log` + `import_log` into a new store moves a log from one format to another with
        the same records and hash chain.

        `sync=False` skips the fsync of each commit: much faster, and a power loss or kernel crash
        may then lose the most recent commits (never corrupt older ones). A process crash loses
        nothing either way.

        A `postgresql://` URL opens the PostgreSQL log instead (see `eventlog/_postgres.py`):
        `?schema=` picks the schema, `sync=False` commits without waiting for the server's flush.
        """
        storage, description = open_storage(
            path,
            map_size=map_size,
            sync=sync,
            readonly=readonly,
            headroom_bytes=headroom_bytes,
            format_version=format_version,
        )
        log = cls(storage, description)
        try:
            log._check_tail()
        except BaseException:
            log.close()
            raise
        return log

    @classmethod
    def memory(cls) -> EventLog:
        """A fresh in-memory log: the reference implementation, gone when the process exits."""
        return cls(MemoryStorage(), "memory")

    def _check_tail(self) -> None:
        """Open-time check of the newest record, so a damaged store fails at open, not later."""
        with self._storage.reader() as txn:
            head = txn.last_position()
            view = LogView(txn)
            if head > view.anchor[0]:
                view.read(after=head - 1, limit=1)

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            followers, self._subscriptions.followers = self._subscriptions.followers, []
            for subscription in followers:  # their threads read the store: stop them first
                subscription.close()
            self._closed = True
            self._subscriptions.live.clear()
            self._storage.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def outcome_may_be_unknown(self) -> bool:
        """Whether a commit can end in `OutcomeUnknownError` (on PostgreSQL: the connection was
        lost during COMMIT): only then is retrying a write safe just under an idempotency key.
        An LMDB or in-memory commit has happened when it returns, and wrote nothing when it
        raised."""
        return self._storage.outcome_may_be_unknown

    @property
    def in_transaction(self) -> bool:
        """Whether the calling thread is inside `transaction()` on this log."""
        return self._current() is not None

    def current_transaction(self) -> Transaction | None:
        """The calling thread's innermost open transaction on this log, or None: lets a command
        that would join it (`transaction(join=True)`) skip the block's own bookkeeping."""
        stack: list[Transaction] | None = getattr(self._local, "stack", None)
        return stack[-1] if stack else None

    _current = current_transaction

    def _check_usable(self) -> None:
        if self._closed:
            raise LogClosedError(f"the log {self.description} is closed")
        if self._forked:
            raise StorageError(
                f"the log {self.description} was open when this process forked: {FORK_ADVICE}"
            )

    # Transactions

    @contextmanager
    def transaction(self, *, join: bool = False, fold: bool = True) -> Iterator[Transaction]:
        """Group appends and projection writes into one atomic, durable commit.

        Nested blocks are savepoints: an exception leaving an inner block undoes only that block.
        With `join=True` a nested block simply runs in the enclosing transaction (no savepoint):
        for callers, like the engine's commands, that raise before they write anything.
        `fold=False` skips the projector's catch-up as an outermost transaction starts (see
        `_begin_outermost`): for the projection's own catch-up and rebuild, which must run on a
        projection of another layout, or a damaged one.
        """
        self._check_usable()
        current = self._current()
        if current is not None and join:
            yield current
            return
        if current is not None:
            child = Transaction(current._txn.child(), current, self._projector)
            with self._running(child):
                yield child
            child._merge_into_parent()
            return
        with self._writer:
            tx, sequence = self._begin_outermost(fold)
            with self._running(tx):
                yield tx
            self._carried = tx.carried(sequence)  # committed: the next may start from it
            self._deliver(tx)

    def _begin_outermost(self, fold: bool) -> tuple[Transaction, int | None]:
        """A new outermost write transaction (resumed from this process's last commit when that
        is the store's last) and its commit sequence. After another writer's commit (a bare log's,
        say) the projector first folds what it has not seen, in a commit of its own: commands
        decide on it, and one that is refused does not undo the fold."""
        while True:
            tx = Transaction(self._storage.begin_write(), None, self._projector)
            sequence, self._carried = tx.resume(self._carried), None
            if self._projector is None or tx.resumed or not fold:
                return tx, sequence
            try:
                self._projector(tx, [])
            except BaseException:
                tx._txn.abort()
                raise
            if not tx.writes:
                return tx, sequence  # nothing to fold: the block runs in this transaction
            with self._running(tx):
                pass  # commits the fold
            self._carried = tx.carried(sequence)

    @contextmanager
    def _running(self, tx: Transaction) -> Iterator[None]:
        """`tx` on this thread's stack for the block, then committed, or aborted if the block
        (or, for the outermost, the projector's last writes) raised or a write failed."""
        stack: list[Transaction] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append(tx)
        try:
            try:
                yield
                if tx._parent is None and tx.projector_state is not None:
                    tx.projector_state.before_commit(tx)
            except BaseException:
                tx._txn.abort()
                raise
            if tx._broken:
                tx._txn.abort()
                raise StorageError("a write inside this transaction failed; nothing was kept")
            tx._txn.commit()
        finally:
            stack.pop()
            tx._txn = ENDED  # the storage transaction is over; a kept handle must not reach it

    def append(
        self,
        stream: str,
        events: Sequence[Event],
        *,
        expected_version: int | ExpectedVersion,
        meta: dict[str, Any] | None = None,
        recorded_at: datetime | None = None,
    ) -> list[int]:
        """Append `events` to `stream`, all or none, and commit durably; returns their positions.

        Inside `with log.transaction()` the append joins that transaction instead.
        """
        return self._durably(
            lambda tx: tx.append(
                stream,
                events,
                expected_version=expected_version,
                meta=meta,
                recorded_at=recorded_at,
            )
        )

    def import_records(self, records: Sequence[bytes]) -> list[Envelope]:
        """`Transaction.import_records` in its own durable commit (or the caller's transaction):
        the records, taken byte for byte from another log, follow the head or nothing is written."""
        return self._durably(lambda tx: tx.import_records(records))

    def _durably(self, write: Callable[[Transaction], _T]) -> _T:
        """`write` in the caller's transaction, or in one of its own, committed durably and
        tried once more when the store was full (LMDB grows its map before the retry)."""
        current = self._current()
        if current is not None:
            return write(current)
        try:
            with self.transaction() as tx:
                return write(tx)
        except StoreFullError:
            pass  # LMDB has grown its map: once more, and a second failure is the caller's
        with self.transaction() as tx:
            return write(tx)

    @staticmethod
    def record_checker() -> RecordChecker:
        """A checker for the records of a whole log, from position 1 (see `RecordChecker`): lets
        an importer check a source completely before it writes anything."""
        return RecordChecker()

    # Reads

    @contextmanager
    def view(self) -> Iterator[LogView]:
        """A consistent read-only view; inside a transaction, the transaction itself."""
        self._check_usable()
        current = self._current()
        if current is not None:
            yield current
            return
        with self._storage.reader() as txn:
            yield LogView(txn)

    def lease(self, name: str) -> Lease:
        """Claim the lease `name` on this store until `release()` or until this process ends,
        however it ends: the claim is a lock the kernel (LMDB) or the server (PostgreSQL) drops
        with the process, never a clock. Another live holder, in this process or any other, makes
        it `LeaseHeldError` naming that holder. Appends do not check leases; callers that must be
        alone on a store (the runtime) take one first."""
        self._check_usable()
        return self._storage.lease(check_lease_name(name))

    @contextmanager
    def scratch(self) -> Iterator[tuple[LogView, Transaction]]:
        """A view of the log as committed now, and a transaction over the same snapshot whose
        projection space starts empty in a throwaway store: rebuild the projections into the
        transaction, then compare them with the view's. It cannot append; nothing it writes is
        kept. It holds one read transaction for the whole `with` block (on LMDB, pages freed by
        writers meanwhile are kept until it ends), so use it for checks, not on a hot path."""
        self._check_usable()
        from eventlog._lmdb import LmdbStorage

        with (
            tempfile.TemporaryDirectory(prefix="sessionlog-scratch-") as where,
            self._storage.reader() as txn,
        ):
            # The rebuilt state is no larger than the stored one, which fits in the store.
            room = 2 * self._storage.size_bytes() + 2 * limits.transaction_bytes_max
            space = LmdbStorage(where, map_size=room, sync=False, readonly=False, headroom_bytes=0)
            kv = space.begin_write()
            try:
                yield LogView(txn), ScratchTransaction(ScratchTxn(txn, kv), None, None)
            finally:
                kv.abort()
                space.close()

    @property
    def head(self) -> int:
        """The last position written (0 when the log is empty)."""
        with self.view() as view:
            return view.head

    @property
    def head_hash(self) -> bytes:
        """The hash of the last event (32 zero bytes when the log is empty)."""
        with self.view() as view:
            head = view.head
            cut, anchor_hash = view.anchor
            page = view.read(after=head - 1, limit=1) if head > cut else []
        return page[0].hash if page else anchor_hash

    @property
    def anchor(self) -> tuple[int, bytes]:
        """The last position truncated away and the chain hash stored there, from which the log
        verifies; (0, the genesis hash) when it was never truncated (see `truncate`)."""
        with self.view() as view:
            return view.anchor

    def truncate(self, before: int) -> tuple[int, bytes]:
        """Drop every event at a position below `before`, in one durable commit, and keep the
        chain hash at the cut as the log's anchor; returns the anchor (position, hash).

        Archive what you drop first (`read_records` gives the stored bytes, which an archive can
        verify on its own: its last hash is the anchor). Afterwards `verify` walks from the
        anchor and still names the first bad position after it; reading a dropped position
        raises `TruncatedError`; positions and stream versions carry on where they were, never
        reused. The space is reused by later writes; `compact_files` (LMDB) or the server's
        `VACUUM` (PostgreSQL) returns it. See `Transaction.truncate`."""
        self._check_usable()
        return self._durably(lambda tx: tx.truncate(before))

    def stream_version(self, stream: str) -> int:
        """The version of `stream`: the number of events in it, 0 when it does not exist."""
        with self.view() as view:
            return view.stream_version(stream)

    def read(
        self, *, after: int = 0, limit: int = limits.read_page_events_default
    ) -> list[Envelope]:
        """Up to `limit` events with positions after `after`, in order, hash-checked."""
        with self.view() as view:
            return view.read(after=after, limit=limit)

    def read_records(
        self, *, after: int = 0, limit: int = limits.read_page_events_default
    ) -> list[tuple[Envelope, bytes]]:
        """`read`, with each event's exact stored bytes beside it (for exports)."""
        with self.view() as view:
            return view.read_records(after=after, limit=limit)

    def read_stream(
        self, stream: str, *, after: int = 0, limit: int = limits.read_page_events_default
    ) -> list[Envelope]:
        """Up to `limit` events of `stream` with versions after `after`, in order."""
        with self.view() as view:
            return view.read_stream(stream, after=after, limit=limit)

    def iter_all(
        self, *, after: int = 0, page_events: int = limits.read_page_events_default
    ) -> Iterator[Envelope]:
        """Every event after `after`, one short read transaction per page."""
        while True:
            page = self.read(after=after, limit=page_events)
            if not page:
                return
            yield from page
            after = page[-1].position

    def tail(
        self,
        *,
        after: int = 0,
        stream: str | None = None,
        follow: bool = False,
        poll_interval_s: float = 0.05,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[Envelope]:
        """Events after `after` as they are committed, by this or any other process.

        With `follow`, waits for new events (polling every `poll_interval_s`) until `stop()` is true.
        """
        if stream is not None:
            check_stream(stream)
        yield from tail(
            self._read_committed,
            self._storage.wait_for_commit,
            after=after,
            stream=stream,
            follow=follow,
            poll_interval_s=poll_interval_s,
            stop=stop,
        )

    def _read_committed(self, after: int, limit: int) -> list[Envelope]:
        return self.read(after=after, limit=limit)

    def size_bytes(self) -> int:
        """Bytes the store occupies on disk (or in memory)."""
        self._check_usable()
        return self._storage.size_bytes()

    # Verification

    def verify(
        self,
        *,
        progress: Callable[[int, int], object] | None = None,
        isolated: bool | None = None,
    ) -> VerifyReport:
        """Walk the whole hash chain and the stream index; report the first problem found.

        Never raises for damage it finds: that is what the report is for. On LMDB the walk runs
        in a child process (`isolated`, the default there), because a damaged B-tree page makes
        LMDB abort the process that reads it; if the child dies, the report names the region it
        died in, and the other tables' pages are walked there too. `isolated=False` walks here.
        """
        self._check_usable()
        where = self.path
        if isolated is None:
            isolated = where is not None
        if isolated:
            if where is None:
                raise InvalidArgumentError(f"verify: the log {self.description} has no files")
            return _verify.walk_isolated("eventlog._walk", [str(where)], progress, self.description)
        return _verify.verify_here(self._storage, progress)

    walk_isolated = staticmethod(_verify.walk_isolated)

    @classmethod
    def verify_files(
        cls, path: str | os.PathLike[str], *, progress: Callable[[int, int], object] | None = None
    ) -> VerifyReport:
        """`verify` of the LMDB store in directory `path` without opening it in this process:
        a store so damaged that opening it aborts is reported, not fatal (for the CLI)."""
        if not os.path.isdir(path):
            raise InvalidArgumentError(f"verify: no store at `{path}`")
        where = os.path.abspath(path)
        return _verify.walk_isolated("eventlog._walk", [where], progress, f"lmdb:{path}")

    @staticmethod
    def compact_files(path: str | os.PathLike[str]) -> tuple[int, int]:
        """Replace the data file of the LMDB store in directory `path` with a compact copy (the
        pages freed by `truncate` and by rewrites are left out), atomically; returns its size in
        bytes before and after. Refused with `StoreBusyError` while any process, this one
        included, has the store open. On PostgreSQL the server's `VACUUM` (or `VACUUM FULL`)
        returns the space, and is the operator's to run. See `eventlog/_compaction.py`."""
        from eventlog._compaction import compact_files

        if open_on(path, forked=False) is not None:
            raise StoreBusyError(f"compact: this process has the store `{path}` open; close it")
        return compact_files(Path(path))

    @property
    def path(self) -> Path | None:
        """The directory of an LMDB log; None for the in-memory and server logs."""
        where = getattr(self._storage, "path", None)
        return where if isinstance(where, Path) else None

    def keyring_slots(self) -> Any:
        """The server-side keyring of a database store (see `eventlog/_pg_keyring.py`); None for
        a store with a directory (the engine keeps its keyring file there) or in memory."""
        make = getattr(self._storage, "keyring_slots", None)
        return None if make is None else make()

    def walk_other_tables(self) -> str | None:
        """Read every page of the tables `verify` does not walk (projection state, idempotency
        keys): the first problem found, or None. Run where an abort cannot hurt (see above)."""
        self._check_usable()
        walk = getattr(self._storage, "walk_other_tables", None)
        return None if walk is None else cast(Callable[[], "str | None"], walk)()

    # Subscriptions

    def subscribe(
        self,
        callback: Callable[[Envelope], object],
        *,
        after: int | None = None,
        stream: str | None = None,
        on_error: Callable[[BaseException, Envelope], object] | None = None,
        follow: bool = False,
        poll_interval_s: float = 0.05,
    ) -> Subscription:
        """Call `callback` with every committed event, in order, after its commit.

        With `after`, first catches up on the events after that position, then goes live with no
        gap and no repeat. A callback that raises is reported to `on_error` (or logged) and the
        log, and every other subscriber, carry on.

        By default the callback hears the commits of this process, right after each. With
        `follow=True` it hears every commit of every process and machine sharing the store: a
        thread of the subscription reads them by position (woken by the server's notification on
        PostgreSQL, else polling every `poll_interval_s`) and calls the callback from there.
        """
        self._check_usable()
        if stream is not None:
            check_stream(stream)
        if after is not None:
            check_page(after, 1, "subscribe")
        live = self._subscriptions.live
        check_at_most(len(live) + 1, limits.subscribers_max, "subscribers_max", "subscribers")
        subscription = Subscription(
            callback,
            stream,
            on_error,
            self._read_committed,
            self._storage.wait_for_commit,
            self._remove_subscriber,
        )
        if follow:
            if not poll_interval_s > 0:
                raise InvalidArgumentError(
                    f"subscribe: poll_interval_s must be > 0, got {poll_interval_s!r}"
                )
            current = self._current()
            pending = current.pending_count if current is not None else 0
            subscription.last_position = self.head - pending if after is None else after
            subscription._follow(poll_interval_s)
            with self._writer:
                self._subscriptions.followers.append(subscription)
            return subscription
        with self._writer:  # no in-process commit can slip between the catch-up and going live
            # Inside a transaction the view includes its pending events: those are delivered
            # after the commit (or never), so catch-up and going live start from committed state.
            current = self._current()
            committed = self.head - (current.pending_count if current is not None else 0)
            if after is None:
                subscription.last_position = committed
            else:
                subscription.last_position = after
                for envelope in self.iter_all(after=after):
                    if envelope.position > committed:
                        break
                    subscription._offer(envelope)
            live.append(subscription)
        return subscription

    def _remove_subscriber(self, subscription: Subscription) -> None:
        with self._writer:
            self._subscriptions.remove(subscription)

    def _deliver(self, tx: Transaction) -> None:
        for hook in tx._hooks:
            try:
                hook()
            except Exception:  # the commit is durable; a failing hook must not look like a failure
                logger.exception("on_commit hook %r failed", hook)
        self._subscriptions.deliver(tx.pending, tx.pending_count, tx._head)
