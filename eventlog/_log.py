"""The event log: validated, atomic appends with a hash chain, paged reads, verify, subscriptions.

Everything here is shared by every backend: the backend only stores bytes under keys. This module
decides positions and versions, enforces the limits, and delivers committed events to in-process
subscribers in commit order. It must never let a partially validated append reach storage, and never
hold a read transaction across calls.
"""

from __future__ import annotations

import enum
import logging
import os
import tempfile
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import msgspec

from eventlog import _chain, _codec, _walk, limits
from eventlog._chain import RecordChecker
from eventlog._codec import Envelope
from eventlog._lease import Lease
from eventlog._lease import check_name as check_lease_name
from eventlog._memory import MemoryStorage
from eventlog._scratch import ScratchTxn
from eventlog._storage import Storage, StorageTxn, stream_key
from eventlog.errors import (
    ConcurrencyError,
    ConfigurationError,
    CorruptStoreError,
    IntegrityError,
    InvalidArgumentError,
    LimitExceededError,
    LogClosedError,
    SessionLogError,
    StorageError,
    StoreFullError,
)
from eventlog.events import Event

logger = logging.getLogger("sessionlog.eventlog")


class ExpectedVersion(enum.Enum):
    NO_STREAM = "no_stream"
    ANY = "any"

    def __repr__(self) -> str:
        return self.name


NO_STREAM = ExpectedVersion.NO_STREAM
"""`expected_version` for an append that must create its stream."""
ANY = ExpectedVersion.ANY
"""`expected_version` for an append that does not care about the stream's version."""

_open_logs: weakref.WeakSet[EventLog] = weakref.WeakSet()


def _mark_forked() -> None:
    for log in list(_open_logs):
        log._forked = True


FORK_ADVICE = (
    "LMDB cannot use it, nor open the same store again, in a child made by fork(): open the "
    "store in the child only if the parent did not have it open when it forked (close it "
    "before starting the child), or start the child with multiprocessing's 'spawn' or "
    "'forkserver' start method"
)
"""What works after fork(). Dropping the inherited handle in the child is not offered: closing an
LMDB environment in a forked child frees the parent's reader slots in the shared lock file, so a
read the parent had in flight would lose its protection from the writer."""


def _inherited_from_parent(path: str | os.PathLike[str]) -> EventLog | None:
    """An open log of this process that fork() carried over from the parent, on `path`."""
    wanted = os.path.realpath(path)
    for log in list(_open_logs):
        where = getattr(log._storage, "path", None)
        if where is None or not log._forked or log._closed:
            continue
        if os.path.realpath(where) == wanted:
            return log
    return None


os.register_at_fork(after_in_child=_mark_forked)


def check_stream(stream: object) -> bytes:
    """Validate a stream name; returns its index prefix."""
    if not isinstance(stream, str):
        raise InvalidArgumentError(f"stream name must be a str, got {type(stream).__name__}")
    if not stream:
        raise InvalidArgumentError("stream name must not be empty")
    if "\x00" in stream:
        raise InvalidArgumentError(f"stream name {stream!r} contains a NUL character")
    try:
        key = stream_key(stream)
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"stream name {stream!r} is not valid UTF-8: {exc}") from exc
    if len(key) - 1 > limits.stream_name_bytes_max:
        raise LimitExceededError(
            "stream name", "stream_name_bytes_max", limits.stream_name_bytes_max, len(key) - 1
        )
    return key


def _check_expected(expected: object) -> None:
    if isinstance(expected, ExpectedVersion):
        return
    if isinstance(expected, bool) or not isinstance(expected, int):
        raise InvalidArgumentError(
            f"expected_version must be an int, NO_STREAM or ANY, got {type(expected).__name__}"
        )
    if expected < 0:
        raise InvalidArgumentError(f"expected_version must be >= 0, got {expected}")


def _check_page(after: object, limit: object, what: str) -> tuple[int, int]:
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise InvalidArgumentError(f"{what}: `after` must be an int >= 0, got {after!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgumentError(f"{what}: `limit` must be an int >= 1, got {limit!r}")
    if limit > limits.read_page_events_max:
        raise LimitExceededError(
            f"{what} page", "read_page_events_max", limits.read_page_events_max, limit
        )
    return after, limit


def _check_key(key: object) -> bytes:
    if not isinstance(key, bytes):
        raise InvalidArgumentError(f"projection key must be bytes, got {type(key).__name__}")
    if not key or len(key) > limits.kv_key_bytes_max:
        raise InvalidArgumentError(
            f"projection key must be 1 to {limits.kv_key_bytes_max} bytes, got {len(key)}"
        )
    return key


Projector = Callable[["Transaction", list[Envelope]], None]


class _EndedTxn:
    """Stands in for the storage transaction of a `Transaction` whose `with` block has ended."""

    def __getattr__(self, name: str) -> Any:
        raise InvalidArgumentError(
            "this transaction has ended; start another with `log.transaction()`"
        )


_ENDED = cast(StorageTxn, _EndedTxn())


class LogView:
    """A consistent read of the log and of projection state, inside one storage transaction."""

    def __init__(self, log: EventLog, txn: StorageTxn) -> None:
        self._log = log
        self._txn = txn

    @property
    def head(self) -> int:
        return self._txn.last_position()

    def stream_version(self, stream: str) -> int:
        return self._txn.stream_version(check_stream(stream))

    def read(
        self, *, after: int = 0, limit: int = limits.read_page_events_default
    ) -> list[Envelope]:
        after, limit = _check_page(after, limit, "read")
        prev = _chain.hash_at(self._txn, after)
        if prev is None:
            return []
        return _chain.check_run(prev, self._txn.values_after(after, limit), after + 1)

    def appended_with(self, idempotency_key: str) -> tuple[str, int, int] | None:
        """``(stream, first, last)`` positions of the append that carried `idempotency_key` in
        its meta, or None when none did: how a caller finds the answer to a retried request."""
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise InvalidArgumentError(
                f"appended_with: the key must be a non-empty str, got {idempotency_key!r}"
            )
        return self._txn.idempotent_positions(idempotency_key)

    def read_records(
        self, *, after: int = 0, limit: int = limits.read_page_events_default
    ) -> list[tuple[Envelope, bytes]]:
        """Like `read`, with each event's stored bytes beside it: what an export must carry to
        reproduce the hash chain elsewhere."""
        after, limit = _check_page(after, limit, "read_records")
        prev = _chain.hash_at(self._txn, after)
        if prev is None:
            return []
        raw = [bytes(value) for value in self._txn.values_after(after, limit)]
        return list(zip(_chain.check_run(prev, raw, after + 1), raw, strict=True))

    def events_at(self, positions: Iterable[int]) -> list[Envelope]:
        """The events at `positions`, each hash-checked against its predecessor; raises
        `IntegrityError` if one is missing. Cheapest when runs of positions are consecutive."""
        wanted = list(positions)
        return _chain.check_at(wanted, self._txn.records_around(wanted))

    def event_at(self, position: int) -> Envelope | None:
        """The event at `position`, hash-checked against its predecessor; None past the head."""
        record = self._txn.record(position) if position >= 1 else None
        if record is None:
            return None
        return _chain.check_one(self._hash_before(position), record, position)

    def _hash_before(self, position: int) -> bytes:
        """The hash the record at `position` must chain to; `IntegrityError` when the record
        before it is missing."""
        prev = _chain.hash_at(self._txn, position - 1)
        if prev is None:
            raise IntegrityError(f"position {position - 1} is missing from the log", position)
        return prev

    def read_stream(
        self, stream: str, *, after: int = 0, limit: int = limits.read_page_events_default
    ) -> list[Envelope]:
        key = check_stream(stream)
        after, limit = _check_page(after, limit, "read_stream")
        txn = self._txn
        out: list[Envelope] = []
        for version, position in enumerate(txn.stream_positions(key, after, limit), after + 1):
            record = txn.record(position)
            if record is None:
                raise IntegrityError(
                    f"stream `{stream}` version {version} points at missing position {position}",
                    position,
                )
            envelope = _chain.check_one(self._hash_before(position), record, position)
            if envelope.stream != stream or envelope.version != version:
                raise IntegrityError(
                    f"stream index says `{stream}` v{version} is at position {position}, which "
                    f"holds `{envelope.stream}` v{envelope.version}",
                    position,
                )
            out.append(envelope)
        return out

    def kv_get(self, key: bytes) -> bytes | None:
        return self._txn.kv_get(_check_key(key))

    def kv_scan(
        self,
        prefix: bytes = b"",
        *,
        start: bytes | None = None,
        stop: bytes | None = None,
        reverse: bool = False,
        limit: int | None = None,
    ) -> list[tuple[bytes, bytes]]:
        """Keys in ``[start, stop)`` within `prefix`, in key order (or reversed)."""
        for name, bound in (("prefix", prefix), ("start", start), ("stop", stop)):
            if not isinstance(bound, bytes) and (bound is not None or name == "prefix"):
                raise InvalidArgumentError(
                    f"kv_scan: `{name}` must be bytes, got {type(bound).__name__}"
                )
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 0
        ):
            raise InvalidArgumentError(
                f"kv_scan: `limit` must be an int >= 0 or None, got {limit!r}"
            )
        lo = prefix if start is None or start < prefix else start
        hi = _prefix_end(prefix) if prefix else None
        if stop is not None and (hi is None or stop < hi):
            hi = stop
        return self._txn.kv_scan(lo, hi, reverse, limit)


def _prefix_end(prefix: bytes) -> bytes | None:
    """The first key after every key that starts with `prefix`."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class Transaction(LogView):
    """One atomic, durable commit: appends to any streams, plus projection state.

    Obtained from `EventLog.transaction()`. Nothing is visible to other readers until the outermost
    transaction commits; an exception leaving the `with` block writes nothing.
    """

    def __init__(self, log: EventLog, txn: StorageTxn, parent: Transaction | None) -> None:
        super().__init__(log, txn)
        self._parent = parent
        self.pending: list[Envelope] = list(parent.pending) if parent else []
        """The events to deliver after the commit, while they are few (see `_keep_pending`)."""
        self.pending_count: int = parent.pending_count if parent else 0
        self._pending_bytes: int = parent._pending_bytes if parent else 0
        self._hooks: list[Callable[[], None]] = list(parent._hooks) if parent else []
        self._versions: dict[bytes, int] = dict(parent._versions) if parent else {}
        self.cache: dict[bytes, Any] = dict(parent.cache) if parent else {}
        self._deferred: dict[bytes, tuple[Any, Callable[[Any], bytes]]] = (
            dict(parent._deferred) if parent else {}
        )
        """Decoded values a projection keeps for the life of this transaction (see `kv_put`)."""
        self._bytes: int = parent._bytes if parent else 0
        self._head: int = parent._head if parent else -1
        self._head_hash: bytes = parent._head_hash if parent else b""
        self._broken = False
        self._stamp: dict[str, Any] | None = parent._stamp if parent else None

    def stamp_next_append(self, meta: dict[str, Any] | None) -> None:
        """Merge `meta` into the meta of the next append of this transaction, once: a layer above
        the commands (a service) marks a request's first event with its idempotency key without
        every command taking a `meta` argument. The next append spends it (one that carries its
        own idempotency key keeps that key); None clears it."""
        self._stamp = None if meta is None else dict(_check_meta(meta))

    def _load_head(self) -> None:
        txn = self._txn
        self._head = txn.last_position()
        self._head_hash = _chain.hash_at(txn, self._head) or _codec.GENESIS_HASH

    def _keep_pending(self, envelopes: list[Envelope], size: int) -> None:
        """Remember what to deliver after the commit: the envelopes themselves while their records
        total at most `pending_record_bytes_max`, and past that only their count (delivery then
        reads them back from the log), so a huge transaction never holds every decoded event."""
        self.pending_count += len(envelopes)
        self._pending_bytes += size
        if self._pending_bytes <= limits.pending_record_bytes_max:
            self.pending.extend(envelopes)
        else:
            self.pending.clear()

    def on_commit(self, hook: Callable[[], None]) -> None:
        """Run `hook` once the outermost transaction has committed durably (never on abort)."""
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
        _check_expected(expected_version)
        events = _check_events(events)
        stamp = self._stamp
        if stamp is not None and not (meta and "idempotency_key" in meta):
            meta = {**(meta or {}), **stamp}
        meta = _check_meta(meta)
        at = _check_time(recorded_at)
        idempotency_key = _check_idempotency_key(meta)
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
        size = sum(map(len, records))
        self._reserve(size)
        try:
            txn.put_records(self._head + 1, records, key, version + 1)
            if idempotency_key is not None:
                txn.remember_idempotency_key(
                    idempotency_key, stream, self._head + 1, self._head + len(records)
                )
        except BaseException:
            self._broken = True  # part of the call may be in the transaction: it must not commit
            raise
        first = self._head + 1
        self._head += len(records)
        self._head_hash = envelopes[-1].hash
        self._versions[key] = version + len(records)
        self._keep_pending(envelopes, size)
        self._stamp = None
        projector = self._log._projector
        if projector is not None:
            try:
                projector(self, envelopes)
            except BaseException:
                self._broken = True  # the events are in, their projection is not: never commit
                raise
        return list(range(first, self._head + 1))

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
                raise LimitExceededError(
                    what, "event_bytes_max", limits.event_bytes_max, failure.size
                ) from None
            raise InvalidArgumentError(f"{what} cannot be stored: {failure.cause}") from (
                failure.cause
            )

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
        self._head, self._head_hash = checker.head, checker.head_hash
        for stream, version in checker.versions.items():
            self._versions[stream_key(stream)] = version
        self._keep_pending(envelopes, size)
        projector = self._log._projector
        if projector is not None:
            try:
                projector(self, envelopes)
            except BaseException:
                self._broken = True  # the events are in, their projection is not: never commit
                raise
        return envelopes

    def _reserve(self, size: int) -> None:
        """Count `size` more bytes against `transaction_bytes_max`, or refuse them."""
        if self._bytes + size > limits.transaction_bytes_max:
            raise LimitExceededError(
                "transaction bytes",
                "transaction_bytes_max",
                limits.transaction_bytes_max,
                self._bytes + size,
            )
        self._bytes += size

    def kv_put(self, key: bytes, value: bytes | bytearray | memoryview) -> None:
        _check_key(key)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(
                f"projection value must be bytes, got {type(value).__name__}"
            )
        if len(value) > limits.kv_value_bytes_max:
            raise LimitExceededError(
                "projection value", "kv_value_bytes_max", limits.kv_value_bytes_max, len(value)
            )
        self._reserve(len(key) + len(value))
        self.cache.pop(key, None)
        self._deferred.pop(key, None)
        try:
            self._txn.kv_put(key, value)
        except BaseException:
            self._broken = True
            raise

    def kv_put_many(self, items: Sequence[tuple[bytes, bytes | bytearray | memoryview]]) -> None:
        """`kv_put` of each (key, value) pair, handed to storage in one call."""
        cache, deferred = self.cache, self._deferred
        key_max, value_max = limits.kv_key_bytes_max, limits.kv_value_bytes_max
        size = 0
        for key, value in items:
            if type(key) is not bytes or not 0 < len(key) <= key_max:
                _check_key(key)  # raises, naming what is wrong
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
        if cache or deferred:
            for key, _ in items:
                cache.pop(key, None)
                deferred.pop(key, None)
        try:
            self._txn.kv_put_many(items)
        except BaseException:
            self._broken = True
            raise

    def kv_delete(self, key: bytes) -> bool:
        self.cache.pop(key, None)
        deferred = self._deferred.pop(key, None) is not None
        return self._txn.kv_delete(_check_key(key)) or deferred

    def kv_clear(self) -> None:
        """Delete every projection key in one storage call (for `rebuild`)."""
        self.cache.clear()
        self._deferred.clear()
        try:
            self._txn.kv_clear()
        except BaseException:
            self._broken = True
            raise

    def kv_defer(self, key: bytes, value: Any, encode: Callable[[Any], bytes]) -> None:
        """Set `key` to `encode(value)`, written once when the transaction commits.

        For projection state rewritten by every event: `value` stays decoded in `cache`, reads of
        the key in this transaction see it, and a scan writes pending values before it runs.
        """
        if type(key) is not bytes or not 0 < len(key) <= limits.kv_key_bytes_max:
            _check_key(key)  # raises, naming what is wrong
        self.cache[key] = value
        self._deferred[key] = (value, encode)

    def kv_get(self, key: bytes) -> bytes | None:
        pending = self._deferred.get(key)
        if pending is not None:
            return pending[1](pending[0])
        return super().kv_get(key)

    def kv_scan(
        self,
        prefix: bytes = b"",
        *,
        start: bytes | None = None,
        stop: bytes | None = None,
        reverse: bool = False,
        limit: int | None = None,
    ) -> list[tuple[bytes, bytes]]:
        self._flush_deferred()
        return super().kv_scan(prefix, start=start, stop=stop, reverse=reverse, limit=limit)

    def _flush_deferred(self) -> None:
        pending, self._deferred = self._deferred, {}
        for key, (value, encode) in pending.items():
            cached = self.cache.get(key)
            self.kv_put(key, encode(value))
            if cached is not None:
                self.cache[key] = cached

    @property
    def head(self) -> int:
        if self._head < 0:
            self._load_head()
        return self._head

    def stream_version(self, stream: str) -> int:
        key = check_stream(stream)
        version = self._versions.get(key)
        return self._txn.stream_version(key) if version is None else version

    def _merge_into_parent(self) -> None:
        parent = self._parent
        if parent is None:
            raise AssertionError("only a nested transaction merges into a parent")
        parent.pending = self.pending
        parent.pending_count = self.pending_count
        parent._pending_bytes = self._pending_bytes
        parent._hooks = self._hooks
        parent._versions = self._versions
        parent.cache = self.cache
        parent._deferred = self._deferred
        parent._bytes = self._bytes
        parent._head = self._head
        parent._head_hash = self._head_hash
        parent._stamp = self._stamp


class _ScratchTransaction(Transaction):
    """A `Transaction` over a `ScratchTxn`: a rebuild writes far more than one commit may, and
    nothing it writes is ever committed, so the per-commit byte bound does not apply."""

    def _reserve(self, size: int) -> None:
        pass


def _check_events(events: object) -> Sequence[Event]:
    if not isinstance(events, (list, tuple)):
        raise InvalidArgumentError(
            f"events must be a list or tuple of events, got {type(events).__name__}"
        )
    if not events:
        raise InvalidArgumentError("append needs at least one event")
    if len(events) > limits.events_per_append_max:
        raise LimitExceededError(
            "events in one append",
            "events_per_append_max",
            limits.events_per_append_max,
            len(events),
        )
    for index, event in enumerate(events):
        if not isinstance(event, Event):
            raise InvalidArgumentError(
                f"event {index} must be an eventlog.events.Event, got {type(event).__name__}"
            )
    return events


def _check_meta(meta: object) -> dict[str, Any]:
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
        raise InvalidArgumentError("meta must be a dict with str keys")
    try:
        size = _codec.encode_meta(meta)
    except (msgspec.MsgspecError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgumentError(f"meta cannot be stored: {exc}") from exc
    if size > limits.meta_bytes_max:
        raise LimitExceededError("meta", "meta_bytes_max", limits.meta_bytes_max, size)
    return meta


def _check_idempotency_key(meta: dict[str, Any]) -> str | None:
    key = meta.get("idempotency_key")
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(
            f'meta["idempotency_key"] must be a non-empty str, got {type(key).__name__} {key!r}'
        )
    if len(key) > limits.idempotency_key_chars_max:
        raise LimitExceededError(
            'meta["idempotency_key"]',
            "idempotency_key_chars_max",
            limits.idempotency_key_chars_max,
            len(key),
        )
    return key


def _check_time(at: object) -> datetime:
    if at is None:
        return datetime.now(UTC)
    if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise InvalidArgumentError(f"recorded_at must be a timezone-aware datetime, got {at!r}")
    return at


@dataclass(frozen=True)
class VerifyReport:
    """What `EventLog.verify()` found. `ok` is False from the first problem on."""

    ok: bool
    events_checked: int
    streams_checked: int
    head_hash: bytes
    first_bad_position: int | None = None
    problem: str | None = None
    projection_keys_checked: int | None = None
    """Projection keys found equal to the log's rebuild (`SessionStore.verify(projections=True)`);
    None when the projections were not checked."""


class Subscription:
    """A live feed of committed events to one callback; `close()` (or `with`) unsubscribes."""

    def __init__(
        self,
        log: EventLog,
        callback: Callable[[Envelope], object],
        stream: str | None,
        on_error: Callable[[BaseException, Envelope], object] | None,
    ) -> None:
        self._log = log
        self._callback = callback
        self._stream = stream
        self._on_error = on_error
        self.last_position = 0
        self.errors = 0
        self.active = True
        self._thread: threading.Thread | None = None

    def _offer(self, envelope: Envelope) -> None:
        if not self.active or envelope.position <= self.last_position:
            return
        self.last_position = envelope.position
        if self._stream is not None and envelope.stream != self._stream:
            return
        try:
            self._callback(envelope)
        except Exception as exc:  # a subscriber's bug must not break the log or other subscribers
            self.errors += 1
            if self._on_error is not None:
                try:
                    self._on_error(exc, envelope)
                except Exception:  # the same: the commit is durable, the others must still hear
                    logger.exception(
                        "on_error of subscriber %r failed on event %d",
                        self._callback,
                        envelope.position,
                    )
            else:
                logger.exception(
                    "subscriber %r failed on event %d", self._callback, envelope.position
                )

    def _follow(self, poll_interval_s: float) -> None:
        """Start a thread that reads every commit, by any process or machine, in position order
        and hands each to the callback: the log is the source, a wake-up only shortens the wait."""

        def run() -> None:
            try:
                for envelope in self._log.tail(
                    after=self.last_position,
                    follow=True,
                    poll_interval_s=poll_interval_s,
                    stop=lambda: not self.active,
                ):
                    if not self.active:
                        return
                    self._offer(envelope)
            except LogClosedError:
                self.active = False  # the log was closed under the subscription: it ends
            except Exception:  # reported: a follower must not die silently
                self.active = False
                logger.exception("following subscription of %r stopped", self._callback)

        self._thread = threading.Thread(target=run, name="sessionlog-subscription", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self.active:
            self.active = False
            self._log._remove_subscriber(self)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
        self._subscribers: list[Subscription] = []
        self._followers: list[Subscription] = []  # subscriptions with a reading thread
        self._queue: deque[Envelope | range] = deque()
        self._delivering = False
        self._closed = False
        self._forked = False
        self._projector: Projector | None = None
        _open_logs.add(self)

    def set_projector(self, projector: Projector | None) -> None:
        """Run `projector(tx, envelopes)` inside the transaction of every append, right after the
        events are written, so projection state commits (or aborts) together with them."""
        with self._writer:
            self._projector = projector

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        map_size: int = 64 * 1024 * 1024,
        sync: bool = True,
        readonly: bool = False,
        headroom_bytes: int = 2 * limits.transaction_bytes_max,
    ) -> EventLog:
        """Open (creating if missing) the LMDB log in directory `path`.

        `sync=False` skips the fsync of each commit: much faster, and a power loss or kernel crash
        may then lose the most recent commits (never corrupt older ones). A process crash loses
        nothing either way.

        A `postgresql://` URL opens the PostgreSQL log instead (see `eventlog/_postgres.py`):
        `?schema=` picks the schema, `sync=False` commits without waiting for the server's flush.
        """
        if isinstance(path, str) and path.startswith(("postgresql://", "postgres://")):
            try:
                from eventlog._postgres import PostgresStorage  # only PostgreSQL needs psycopg
            except ModuleNotFoundError as exc:
                if exc.name is None or not exc.name.startswith("psycopg"):
                    raise
                raise ConfigurationError(
                    f"a postgresql:// store needs the PostgreSQL driver, which is not installed "
                    f"(no module `{exc.name}`): install the extra with "
                    f"pip install 'sessionlog-engine[postgres]'"
                ) from exc

            pg = PostgresStorage(path, sync=sync, readonly=readonly)
            log = cls(pg, f"postgresql:{pg.where}")
        else:
            from eventlog._lmdb import LmdbStorage  # imported here: the memory log needs no LMDB

            if _inherited_from_parent(path) is not None:
                raise StorageError(
                    f"the store `{path}` was open when this process forked: {FORK_ADVICE}"
                )

            storage = LmdbStorage(
                path, map_size=map_size, sync=sync, readonly=readonly, headroom_bytes=headroom_bytes
            )
            log = cls(storage, f"lmdb:{path}")
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
            if head:
                view = LogView(self, txn)
                view.read(after=head - 1, limit=1)

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            followers, self._followers = self._followers, []
            for subscription in followers:  # their threads read the store: stop them first
                subscription.close()
            self._closed = True
            self._subscribers.clear()
            self._storage.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_transaction(self) -> bool:
        """Whether the calling thread is inside `transaction()` on this log."""
        return self._current() is not None

    def _check_usable(self) -> None:
        if self._closed:
            raise LogClosedError(f"the log {self.description} is closed")
        if self._forked:
            raise StorageError(
                f"the log {self.description} was open when this process forked: {FORK_ADVICE}"
            )

    def _current(self) -> Transaction | None:
        stack: list[Transaction] | None = getattr(self._local, "stack", None)
        return stack[-1] if stack else None

    # Transactions

    @contextmanager
    def transaction(self, *, join: bool = False) -> Iterator[Transaction]:
        """Group appends and projection writes into one atomic, durable commit.

        Nested blocks are savepoints: an exception leaving an inner block undoes only that block.
        With `join=True` a nested block simply runs in the enclosing transaction (no savepoint):
        for callers, like the engine's commands, that raise before they write anything.
        """
        self._check_usable()
        current = self._current()
        if current is not None and join:
            yield current
            return
        if current is not None:
            child = Transaction(self, current._txn.child(), current)
            with self._pushed(child):
                try:
                    yield child
                except BaseException:
                    child._txn.abort()
                    raise
                if child._broken:
                    child._txn.abort()
                    raise StorageError("a write inside this transaction failed; nothing was kept")
                child._txn.commit()  # its deferred writes travel up to the parent
                child._merge_into_parent()
            return
        with self._writer:
            tx = Transaction(self, self._storage.begin_write(), None)
            with self._pushed(tx):
                try:
                    yield tx
                except BaseException:
                    tx._txn.abort()
                    raise
                try:
                    tx._flush_deferred()
                except BaseException:
                    tx._txn.abort()
                    raise
                if tx._broken:
                    tx._txn.abort()
                    raise StorageError("a write inside this transaction failed; nothing was kept")
                tx._txn.commit()
            self._deliver(tx, tx._hooks)

    @contextmanager
    def _pushed(self, tx: Transaction) -> Iterator[None]:
        stack: list[Transaction] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append(tx)
        try:
            yield
        finally:
            stack.pop()
            tx._txn = _ENDED  # the storage transaction is over; a kept handle must not reach it

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
        current = self._current()
        if current is not None:
            return current.append(
                stream,
                events,
                expected_version=expected_version,
                meta=meta,
                recorded_at=recorded_at,
            )
        for attempt in range(2):
            try:
                with self.transaction() as tx:
                    return tx.append(
                        stream,
                        events,
                        expected_version=expected_version,
                        meta=meta,
                        recorded_at=recorded_at,
                    )
            except StoreFullError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def import_records(self, records: Sequence[bytes]) -> list[Envelope]:
        """`Transaction.import_records` in its own durable commit (or the caller's transaction):
        the records, taken byte for byte from another log, follow the head or nothing is written."""
        current = self._current()
        if current is not None:
            return current.import_records(records)
        for attempt in range(2):
            try:
                with self.transaction() as tx:
                    return tx.import_records(records)
            except StoreFullError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

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
            yield LogView(self, txn)

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
                yield LogView(self, txn), _ScratchTransaction(self, ScratchTxn(txn, kv), None)
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
            page = view.read(after=head - 1, limit=1) if head else []
        return page[0].hash if page else _codec.GENESIS_HASH

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
        while True:
            page = self.read(after=after, limit=limits.read_page_events_default)
            for envelope in page:
                if stream is None or envelope.stream == stream:
                    yield envelope
            if page:
                after = page[-1].position
                continue
            if not follow or (stop is not None and stop()):
                return
            # A server backend wakes us when any machine commits; the interval stays the bound.
            self._storage.wait_for_commit(poll_interval_s)

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
            return self.walk_isolated("eventlog._walk", [str(where)], progress, self.description)
        return self._verify_here(progress)

    @classmethod
    def verify_files(
        cls, path: str | os.PathLike[str], *, progress: Callable[[int, int], object] | None = None
    ) -> VerifyReport:
        """`verify` of the LMDB store in directory `path` without opening it in this process:
        a store so damaged that opening it aborts is reported, not fatal (for the CLI)."""
        if not os.path.isdir(path):
            raise InvalidArgumentError(f"verify: no store at `{path}`")
        where = os.path.abspath(path)
        return cls.walk_isolated("eventlog._walk", [where], progress, f"lmdb:{path}")

    @staticmethod
    def walk_isolated(
        module: str,
        arguments: list[str],
        progress: Callable[[int, int], object] | None,
        description: str,
    ) -> VerifyReport:
        """Run a verify walk as `python -m module arguments` (see `eventlog/_walk.py`) and turn
        what it sent, or how it died, into a report."""
        fields, done, death = _walk.run_child(module, arguments, progress)
        if fields is not None:
            return VerifyReport(
                ok=fields["ok"],
                events_checked=fields["events_checked"],
                streams_checked=fields["streams_checked"],
                head_hash=bytes.fromhex(fields["head_hash"]),
                first_bad_position=fields["first_bad_position"],
                problem=fields["problem"],
                projection_keys_checked=fields.get("projection_keys_checked"),
            )
        if not death.startswith("killed"):
            raise StorageError(f"verify of {description}: the walk failed: {death}")
        page = limits.read_page_events_max
        return VerifyReport(
            ok=False,
            events_checked=done,
            streams_checked=0,
            head_hash=b"",
            first_bad_position=done + 1,
            problem=(
                f"the data file is damaged: LMDB stopped the walk ({death}) after position "
                f"{done}, reading positions {done + 1} to {done + page}, their stream index "
                f"entries, or (if every event was checked) the other tables' pages"
            ),
        )

    @property
    def path(self) -> Path | None:
        """The directory of an LMDB log; None for the in-memory and server logs."""
        where = getattr(self._storage, "path", None)
        return where if isinstance(where, Path) else None

    def walk_other_tables(self) -> str | None:
        """Read every page of the tables `verify` does not walk (projection state, idempotency
        keys): the first problem found, or None. Run where an abort cannot hurt (see above)."""
        self._check_usable()
        walk = getattr(self._storage, "walk_other_tables", None)
        return None if walk is None else cast(Callable[[], "str | None"], walk)()

    def _verify_here(self, progress: Callable[[int, int], object] | None) -> VerifyReport:
        versions: dict[str, int] = {}
        prev = _codec.GENESIS_HASH
        checked = 0
        page = limits.read_page_events_max

        def report(position: int | None, problem: str | None) -> VerifyReport:
            return VerifyReport(
                ok=problem is None,
                events_checked=checked,
                streams_checked=len(versions),
                head_hash=prev,
                first_bad_position=position,
                problem=problem,
            )

        keys: dict[str, bytes] = {}  # stream name -> index prefix, encoded once per stream
        try:
            while True:
                with self._storage.reader() as txn:
                    head = txn.last_position()
                    envelopes = self._verify_chain_fast(txn, prev, checked, page)
                    if envelopes is not None:
                        bad = self._verify_page_indexed(txn, envelopes, versions, keys)
                        for envelope in envelopes:
                            if bad is not None and envelope.position == bad[0]:
                                return report(envelope.position, bad[1])
                            prev = envelope.hash
                            checked = envelope.position
                        if envelopes:
                            if progress is not None:
                                progress(checked, head)
                            continue
                    # Empty, or something is wrong in this page: record by record names the problem.
                    count = 0
                    for position, record in txn.records_after(checked, page):
                        count += 1
                        problem = self._verify_one(
                            txn, position, checked + 1, prev, record, versions, keys
                        )
                        if problem is not None:
                            return report(checked + 1, problem)  # a gap is bad where it starts
                        prev = _codec.stored_hash(record)
                        checked = position
                    if count == 0:
                        if checked < head:
                            return report(checked + 1, f"position {checked + 1} is missing")
                        indexed = txn.index_size()
                        if head == checked and indexed != checked:
                            return report(
                                None,
                                f"the stream index holds {indexed} entries for {checked} events",
                            )
                        return report(None, None)
                if progress is not None:
                    progress(checked, head)
        except CorruptStoreError as exc:  # LMDB itself found a damaged page
            return report(checked + 1, f"reading positions after {checked}: {exc}")

    @staticmethod
    def _verify_chain_fast(
        txn: StorageTxn, prev: bytes, checked: int, page: int
    ) -> list[Envelope] | None:
        """The next page checked against the chain and decoded in one tight loop, or None when
        anything is off (the caller then walks the page record by record to name it).

        Every key is checked to be the next position: in a damaged B-tree a changed key need not
        break the order, and a record whose key is wrong cannot be found by the reads that look
        it up by position, however well it chains."""
        try:
            envelopes = _chain.check_run(prev, txn.values_after(checked, page), checked + 1)
        except CorruptStoreError:
            raise  # not a bad record but a bad page: the caller reports it as it is
        except IntegrityError:
            return None
        if not txn.keys_dense(checked, len(envelopes)):
            return None
        return envelopes

    @staticmethod
    def _verify_one(
        txn: StorageTxn,
        position: int,
        expected_position: int,
        prev: bytes,
        record: bytes | bytearray | memoryview,
        versions: dict[str, int],
        keys: dict[str, bytes],
    ) -> str | None:
        if position != expected_position:
            return f"position {expected_position} is missing"
        try:
            envelope = _chain.check_one(prev, record, position)
        except IntegrityError as exc:
            return str(exc)
        bad = EventLog._verify_page_indexed(txn, [envelope], versions, keys)
        return None if bad is None else bad[1]

    @staticmethod
    def _verify_page_indexed(
        txn: StorageTxn, envelopes: list[Envelope], versions: dict[str, int], keys: dict[str, bytes]
    ) -> tuple[int, str] | None:
        """`_verify_indexed` of a page of events with one index lookup for the page (one query on
        a server); the first problem with its position, or None."""
        entries: list[tuple[bytes, int]] = []
        for envelope in envelopes:
            stream = envelope.stream
            version = versions.get(stream, 0) + 1
            if envelope.version != version:
                return envelope.position, (
                    f"event at position {envelope.position} has version {envelope.version} of "
                    f"stream `{stream}`, expected {version}"
                )
            versions[stream] = version
            key = keys.get(stream)
            if key is None:
                key = keys[stream] = stream_key(stream)
            entries.append((key, version))
        for envelope, indexed in zip(envelopes, txn.stream_positions_of(entries), strict=True):
            if indexed != envelope.position:
                return envelope.position, (
                    f"the stream index maps `{envelope.stream}` v{envelope.version} to {indexed}, "
                    f"but the event is at position {envelope.position}"
                )
        return None

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
            _check_page(after, 1, "subscribe")
        if len(self._subscribers) >= limits.subscribers_max:
            raise LimitExceededError(
                "subscribers", "subscribers_max", limits.subscribers_max, len(self._subscribers) + 1
            )
        subscription = Subscription(self, callback, stream, on_error)
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
                self._followers.append(subscription)
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
            self._subscribers.append(subscription)
        return subscription

    def _remove_subscriber(self, subscription: Subscription) -> None:
        with self._writer:
            for kept in (self._subscribers, self._followers):
                if subscription in kept:
                    kept.remove(subscription)

    def _deliver(self, tx: Transaction, hooks: list[Callable[[], None]]) -> None:
        for hook in hooks:
            try:
                hook()
            except Exception:  # the commit is durable; a failing hook must not look like a failure
                logger.exception("on_commit hook %r failed", hook)
        if not self._subscribers or not tx.pending_count:
            return
        if len(tx.pending) == tx.pending_count:
            self._queue.extend(tx.pending)
        else:  # too many to have kept: read back from the log, a page at a time, when their turn comes
            self._queue.append(range(tx.head - tx.pending_count + 1, tx.head + 1))
        if self._delivering:  # a subscriber appended: the outer loop delivers in order
            return
        self._delivering = True
        try:
            while self._queue:
                item = self._queue.popleft()
                if isinstance(item, range):
                    try:
                        self._queue.extendleft(reversed(self._read_back(item)))
                    except SessionLogError:  # the commit is durable: report, never undo it
                        logger.exception("committed events %s could not be read back", item)
                    continue
                for subscription in list(self._subscribers):
                    subscription._offer(item)
        finally:
            self._delivering = False

    def _read_back(self, positions: range) -> list[Envelope | range]:
        """The first page of committed `positions`, then (for `_deliver`) the rest of them."""
        limit = min(len(positions), limits.read_page_events_default)
        page: list[Envelope | range] = list(self.read(after=positions.start - 1, limit=limit))
        if len(positions) > limit:
            page.append(positions[limit:])
        return page
