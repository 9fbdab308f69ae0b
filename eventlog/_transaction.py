"""Transactions: validated, atomic appends with the hash chain, and projection state beside them.

A `Transaction` decides positions and versions, enforces the limits and runs the projector over
what it appended, inside one storage transaction; it never lets a partially validated append reach
storage, and a failed write marks it so it cannot commit. The log (`eventlog/_log.py`) begins,
commits and aborts it, and starts the next one from what a committed one knew (`resume`) when
the store says no other commit came between.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, cast

from eventlog import _chain, _codec, limits
from eventlog._chain import RecordChecker
from eventlog._checks import (
    ANY,
    NO_STREAM,
    ExpectedVersion,
    check_events,
    check_expected,
    check_idempotency_key,
    check_key,
    check_meta,
    check_stream,
    check_time,
)
from eventlog._codec import Envelope
from eventlog._storage import StorageTxn, stream_key
from eventlog._view import LogView, ProjectorState
from eventlog.errors import (
    ConcurrencyError,
    IntegrityError,
    InvalidArgumentError,
    LimitExceededError,
)
from eventlog.events import Event

Projector = Callable[["Transaction", list[Envelope]], None]
"""Called with the events of every append, in its transaction, right after they are written; and
with none at the start of an outermost write transaction that does not follow this process's own
last commit (`Transaction.resumed`), to fold what other writers committed meanwhile."""

CARRIED_STREAMS_MAX = 4096
"""Stream versions a commit hands to the next transaction at most (see `Transaction.resume`)."""


class Carried(NamedTuple):
    """What a committed transaction knew, for the next one of the same log (`resume`)."""

    sequence: int  # the commit's place in the store's sequence (`StorageTxn.commit_sequence`)
    versions: dict[bytes, int]
    head: int  # -1: not read
    hash: bytes
    projector_state: ProjectorState | None


class Stamp(NamedTuple):
    """What `Transaction.stamp_next_append` left for the next append."""

    meta: dict[str, Any]
    digests: tuple[str, ...] = ()
    """Names of `meta`'s values that are digests of what a caller sent, for a layer that keeps a
    stream's secrets under a key of its own to key before the append (the engine's sealer)."""
    stream: str | None = None
    """The only stream whose key may key them; None: the one the append goes to."""


class _EndedTxn:
    """Stands in for the storage transaction of a `Transaction` whose `with` block has ended."""

    def __getattr__(self, name: str) -> Any:
        raise InvalidArgumentError(
            "this transaction has ended; start another with `log.transaction()`"
        )


ENDED = cast(StorageTxn, _EndedTxn())


class Transaction(LogView):
    """One atomic, durable commit: appends to any streams, plus projection state.

    Obtained from `EventLog.transaction()`. Nothing is visible to other readers until the outermost
    transaction commits; an exception leaving the `with` block writes nothing.
    """

    writable = True

    def __init__(
        self, txn: StorageTxn, parent: Transaction | None, projector: Projector | None
    ) -> None:
        super().__init__(txn)
        self._parent = parent
        self._projector = projector
        self.pending: list[Envelope] = list(parent.pending) if parent else []
        """The events to deliver after the commit, while they are few (see `_appended`)."""
        self.pending_count: int = parent.pending_count if parent else 0
        self._pending_bytes: int = parent._pending_bytes if parent else 0
        self._hooks: list[Callable[[], None]] = list(parent._hooks) if parent else []
        self._versions: dict[bytes, int] = dict(parent._versions) if parent else {}
        state = parent.projector_state if parent else None
        self.projector_state = None if state is None else state.nested()
        self._bytes: int = parent._bytes if parent else 0
        self._head: int = parent._head if parent else -1
        self._head_hash: bytes = parent._head_hash if parent else b""
        self._broken = False
        self.resumed = False
        """Whether this outermost transaction started from this process's last commit, the
        store's last (`resume`): then no other writer has committed since."""
        self._stored: bool = parent._stored if parent else False
        """Whether a write that surely changes the store has been made (see `carried`)."""
        self._stamp: Stamp | None = parent._stamp if parent else None
        self.writes: int = parent.writes if parent else 0
        """Writes begun in this transaction so far (appends, projection writes, commit hooks):
        a caller that ran a block without a savepoint tells by it whether a block that raised
        left anything behind (see `sessions/_group.py`)."""

    def stamp_next_append(
        self,
        meta: dict[str, Any] | None,
        *,
        digests: Sequence[str] = (),
        stream: str | None = None,
    ) -> None:
        """Merge `meta` into the meta of the next append of this transaction, once: a layer above
        the commands (a service) marks a request's first event with its idempotency key without
        every command taking a `meta` argument. The next append spends it (one that carries its
        own idempotency key keeps that key); None clears it.

        `digests` names str values of `meta` that are digests of what a caller sent: a layer that
        keeps a stream's secrets under a key of its own rewrites them, keyed by it, before the
        append goes to that stream (the engine does for an encrypted session), and only when it is
        `stream`, if one is named. This log stores whatever the stamp holds then."""
        if meta is None:
            self._stamp = None
            return
        checked = dict(check_meta(meta))
        names = tuple(digests)
        wrong = [name for name in names if not isinstance(checked.get(name), str)]
        if wrong:
            raise InvalidArgumentError(
                f"stamp_next_append: digests must name str values of meta, got {wrong!r}"
            )
        if stream is not None:
            check_stream(stream)
        self._stamp = Stamp(checked, names, stream)

    @property
    def next_stamp(self) -> Stamp | None:
        """What `stamp_next_append` left for the next append; None when nothing is pending."""
        return self._stamp

    def _load_head(self) -> None:
        txn = self._txn
        self._head = txn.last_position()
        self._head_hash = _chain.hash_at(txn, self._head) or _codec.GENESIS_HASH

    def on_commit(self, hook: Callable[[], None]) -> None:
        """Run `hook` once the outermost transaction has committed durably (never on abort)."""
        self.writes += 1
        self._hooks.append(hook)

    def append(
        self,
        stream: str,
        events: Sequence[Event],
        *,
        expected_version: int | ExpectedVersion,
        meta: dict[str, Any] | None = None,
        recorded_at: datetime | None = None,
        checked: bool = False,
    ) -> list[int]:
        """Append `events` to `stream` atomically; returns their positions.

        `checked=True` is the caller's word that every field of every event already holds exactly
        its declared type and nothing mutable is shared with anyone: the check that each record
        decodes back is skipped (see `_codec.encode_records`). Leave it False for anything else.
        """
        key = check_stream(stream)
        if expected_version is not ANY:
            check_expected(expected_version)
        events = check_events(events)
        stamp = self._stamp
        if stamp is not None and not (meta and "idempotency_key" in meta):
            meta = {**(meta or {}), **stamp.meta}
        meta = check_meta(meta)
        at = check_time(recorded_at)
        idempotency_key = check_idempotency_key(meta) if meta else None
        if idempotency_key is not None:
            done = self._appended_before(stream, idempotency_key)
            if done is not None:
                return done
        txn = self._txn
        if self._head < 0:
            self._load_head()
        version = self._versions.get(key)
        if version is None:
            version = txn.stream_version(key)
        if expected_version is NO_STREAM and version != 0:
            raise ConcurrencyError(stream, expected_version, version)
        if isinstance(expected_version, int) and expected_version != version:
            raise ConcurrencyError(stream, expected_version, version)
        records, envelopes = self._encode(stream, events, version, meta, at, checked)
        count = len(records)
        size = len(records[0]) if count == 1 else sum(map(len, records))
        self._reserve(size)
        self.writes += 1
        first = self._head + 1
        try:
            txn.put_records(first, records, key, version + 1)
            if idempotency_key is not None:
                txn.remember_idempotency_key(idempotency_key, stream, first, first + count - 1)
        except BaseException:
            self._broken = True  # part of the call may be in the transaction: it must not commit
            raise
        self._stored = True
        self._head += count
        self._head_hash = envelopes[-1].hash
        self._versions[key] = version + count
        self._stamp = None
        self._appended(envelopes, size)
        return [first] if count == 1 else list(range(first, self._head + 1))

    def _appended_before(self, stream: str, idempotency_key: str) -> list[int] | None:
        """The positions of an earlier append that carried this key; None when there was none."""
        found = self._txn.idempotent_positions(idempotency_key)
        if found is None:
            return None
        earlier_stream, first, last = found
        if earlier_stream != stream:
            raise InvalidArgumentError(
                f"idempotency key {idempotency_key!r} was used for stream `{earlier_stream}`, "
                f"not `{stream}`"
            )
        return list(range(first, last + 1))

    def _encode(
        self,
        stream: str,
        events: Sequence[Event],
        version: int,
        meta: dict[str, Any],
        at: datetime,
        checked: bool,
    ) -> tuple[list[bytearray], list[Envelope]]:
        try:
            return _codec.encode_records(
                self._head_hash,
                self._head + 1,
                stream,
                version + 1,
                at,
                meta,
                events,
                limits.event_bytes_max,
                checked=checked,
            )
        except _codec.EncodeFailure as failure:
            event = events[failure.index]
            what = f"event {failure.index} ({type(event).__name__}) for stream `{stream}`"
            if failure.cause is None:
                too_big = LimitExceededError(
                    what, "event_bytes_max", limits.event_bytes_max, failure.size
                )
                too_big.index = failure.index
                raise too_big from None
            raise InvalidArgumentError(
                f"{what} cannot be stored: {failure.cause}", index=failure.index
            ) from failure.cause

    def import_records(self, records: Sequence[bytes]) -> list[Envelope]:
        """Append records taken byte for byte from another log (an export), after the head.

        Each must be the next record here: the next position, chained to the hash before it, the
        next version of its stream. All are checked before any is written; a bad one raises
        `IntegrityError` naming its position. The projector then folds them, as for `append`.
        """
        if not isinstance(records, (list, tuple)):
            raise InvalidArgumentError(
                f"records must be a list or tuple of bytes, got {type(records).__name__}"
            )
        if self._head < 0:
            self._load_head()
        txn = self._txn

        def version_of(stream: str) -> int:
            known = self._versions.get(stream_key(stream))
            return txn.stream_version(stream_key(stream)) if known is None else known

        checker = RecordChecker(self._head, self._head_hash, version_of)
        envelopes = [checker.check(record) for record in records]
        if not envelopes:
            return []
        size = sum(map(len, records))
        self._reserve(size)
        self.writes += 1
        try:
            start = 0
            for end in range(1, len(envelopes) + 1):  # one storage call per run of one stream
                if end == len(envelopes) or envelopes[end].stream != envelopes[start].stream:
                    first = envelopes[start]
                    key = stream_key(first.stream)
                    txn.put_records(first.position, records[start:end], key, first.version)
                    start = end
        except BaseException:
            self._broken = True  # part of the run may be in the transaction: it must not commit
            raise
        self._stored = True
        self._head, self._head_hash = checker.head, checker.head_hash
        for stream, version in checker.versions.items():
            self._versions[stream_key(stream)] = version
        self._appended(envelopes, size)
        return envelopes

    def truncate(self, before: int) -> tuple[int, bytes]:
        """Drop the events at positions below `before` and keep the chain hash at the cut as the
        log's anchor; returns the anchor (position, hash). The dropped events are checked against
        the chain first (`IntegrityError` naming the first bad one, and nothing is dropped): an
        anchor is only ever the hash of a chain that verified up to it. Cutting at or before the
        current anchor changes nothing."""
        head = self.head
        if isinstance(before, bool) or not isinstance(before, int) or not 1 <= before <= head + 1:
            raise InvalidArgumentError(
                f"truncate: `before` must be a position from 1 to {head + 1}, got {before!r}",
                expected=f"1 to {head + 1}",
                got=before,
            )
        txn = self._txn
        cut, prev = txn.anchor() or (0, _codec.GENESIS_HASH)
        if before - 1 <= cut:
            return cut, prev
        dropped: list[tuple[bytes, int]] = []
        keys: dict[str, bytes] = {}
        checked = cut
        while checked < before - 1:
            limit = min(limits.read_page_events_max, before - 1 - checked)
            page = _chain.check_run(prev, txn.values_after(checked, limit), checked + 1)
            if not page:
                raise IntegrityError(f"position {checked + 1} is missing from the log", checked + 1)
            for envelope in page:
                key = keys.get(envelope.stream) or keys.setdefault(
                    envelope.stream, stream_key(envelope.stream)
                )
                dropped.append((key, envelope.version))
            prev, checked = page[-1].hash, page[-1].position
        self.writes += 1
        try:
            txn.truncate(before, prev, dropped)
        except BaseException:
            self._broken = True  # part of the cut may be in the transaction: it must not commit
            raise
        self._stored = True
        return before - 1, prev

    def _appended(self, envelopes: list[Envelope], size: int) -> None:
        """Keep what was just written for delivery, and run the projector over it. Delivery
        gets the envelopes themselves while their records total at most
        `pending_record_bytes_max`, and past that only their count (it then reads them back from
        the log), so a huge transaction never holds every decoded event."""
        self.pending_count += len(envelopes)
        self._pending_bytes += size
        if self._pending_bytes <= limits.pending_record_bytes_max:
            self.pending.extend(envelopes)
        elif self.pending:
            self.pending.clear()
        projector = self._projector
        if projector is not None:
            try:
                projector(self, envelopes)
            except BaseException:
                self._broken = True  # the events are in, their projection is not: never commit
                raise

    def _reserve(self, size: int) -> None:
        """Count `size` more bytes against `transaction_bytes_max`, or refuse them."""
        if self._bytes + size > limits.transaction_bytes_max:  # inline: it runs on every write
            raise LimitExceededError(
                "transaction bytes",
                "transaction_bytes_max",
                limits.transaction_bytes_max,
                self._bytes + size,
            )
        self._bytes += size

    def kv_put(self, key: bytes, value: bytes | bytearray | memoryview) -> None:
        check_key(key)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(
                f"projection value must be bytes, got {type(value).__name__}"
            )
        if len(value) > limits.kv_value_bytes_max:  # inline, as in `_reserve`
            raise LimitExceededError(
                "projection value", "kv_value_bytes_max", limits.kv_value_bytes_max, len(value)
            )
        self._reserve(len(key) + len(value))
        self.writes += 1
        try:
            self._txn.kv_put(key, value)
        except BaseException:
            self._broken = True
            raise
        self._stored = True
        if self.projector_state is not None:
            self.projector_state.forget(key)

    def kv_put_many(self, items: Sequence[tuple[bytes, bytes | bytearray | memoryview]]) -> None:
        """`kv_put` of each (key, value) pair, handed to storage in one call."""
        key_max, value_max = limits.kv_key_bytes_max, limits.kv_value_bytes_max
        size = 0
        for key, value in items:
            if type(key) is not bytes or not 0 < len(key) <= key_max:
                check_key(key)  # raises, naming what is wrong
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise InvalidArgumentError(
                    f"projection value must be bytes, got {type(value).__name__}"
                )
            length = len(value)
            if length > value_max:
                raise LimitExceededError(
                    "projection value", "kv_value_bytes_max", value_max, length
                )
            size += len(key) + length
        self._reserve(size)
        self.writes += 1
        try:
            self._txn.kv_put_many(items)
        except BaseException:
            self._broken = True
            raise
        self._stored = self._stored or bool(items)
        if self.projector_state is not None:
            for key, _ in items:
                self.projector_state.forget(key)

    def kv_delete(self, key: bytes) -> bool:
        check_key(key)
        self.writes += 1
        if self.projector_state is not None:
            self.projector_state.forget(key)
        try:
            deleted = self._txn.kv_delete(key)
        except BaseException:
            self._broken = True  # as for a put: the store may hold part of it, never commit it
            raise
        self._stored = self._stored or deleted
        return deleted

    def kv_clear(self) -> None:
        """Delete every projection key in one storage call (for `rebuild`)."""
        self.writes += 1
        self.projector_state = None
        try:
            self._txn.kv_clear()
        except BaseException:
            self._broken = True
            raise

    @property
    def head(self) -> int:
        if self._head < 0:
            self._load_head()
        return self._head

    def stream_version(self, stream: str) -> int:
        key = check_stream(stream)
        version = self._versions.get(key)
        return self._txn.stream_version(key) if version is None else version

    def resume(self, carried: Carried | None) -> int | None:
        """Start this outermost transaction from what the last commit of this process knew
        (stream versions, the head and its hash, the projector's state) when that commit is the
        store's last: nobody else can have changed a byte since, so nothing need be read again.
        Otherwise start afresh. Returns this transaction's `StorageTxn.commit_sequence`."""
        sequence = self._txn.commit_sequence()
        if carried is not None and sequence is not None and sequence == carried.sequence + 1:
            self._versions, self._head, self._head_hash = carried[1:4]
            self.projector_state = carried.projector_state
            self.resumed = True
        return sequence

    def carried(self, sequence: int | None) -> Carried | None:
        """What the next transaction may `resume` from once this one, begun at `sequence`, has
        committed; None when the backend cannot tell or it is more than is worth keeping.
        A commit with nothing to write takes no place of its own in LMDB's sequence: unless this
        one surely wrote, what it knew is as of the commit before it (`sequence - 1`), so another
        process's commit in between is never mistaken for this one."""
        if sequence is None or len(self._versions) > CARRIED_STREAMS_MAX:
            return None
        state = self.projector_state
        return Carried(
            sequence if self._stored else sequence - 1,
            self._versions,
            self._head,
            self._head_hash,
            None if state is None else state.after_commit(),
        )

    def _merge_into_parent(self) -> None:
        parent = self._parent
        if parent is None:
            raise AssertionError("only a nested transaction merges into a parent")
        for name in _KEPT_BY_PARENT:
            setattr(parent, name, getattr(self, name))


_KEPT_BY_PARENT = (
    "pending",
    "pending_count",
    "_pending_bytes",
    "_hooks",
    "_versions",
    "projector_state",
    "_bytes",
    "_head",
    "_head_hash",
    "_stored",
    "_stamp",
    "writes",
)
"""What a nested transaction that committed hands its parent: everything it tracks of the
transaction so far (it began with copies of the parent's)."""


class ScratchTransaction(Transaction):
    """A `Transaction` over a `ScratchTxn`: a rebuild writes far more than one commit may, and
    nothing it writes is ever committed, so the per-commit byte bound does not apply."""

    def _reserve(self, size: int) -> None:
        pass
