"""The small storage interface every backend implements, inside one transaction.

Two parts: the log (records by dense position, and a per-stream index of versions) and an ordered
key-value space where projections keep their state. Everything above this file (hashing, versions,
limits, subscriptions, the engine) is shared by all backends. Backends translate their own errors
into `eventlog.errors` and never decide anything about events.

A projection key `CLUSTER_PREFIX` + stream name + NUL + suffix (`cluster_key`) is the state of
that one stream. Every backend treats it as an ordinary key, in logical key order; only LMDB
format 4 places it physically beside the stream's index (`eventlog/_lmdb_cluster.py`), and
refuses any other key that starts with `CLUSTER_PREFIX`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from eventlog._codec import stored_hash
from eventlog._lease import Lease
from eventlog.errors import InvalidArgumentError

Buffer = bytes | bytearray | memoryview

CLUSTER_PREFIX = b"@"
"""The first byte of every projection key kept with its stream (`cluster_key`)."""


def position_key(position: int) -> bytes:
    return position.to_bytes(8, "big")


def stream_key(stream: str) -> bytes:
    """Index prefix of a stream; NUL is refused in stream names, so prefixes never overlap."""
    return stream.encode("utf-8") + b"\x00"


def cluster_key(stream: str, suffix: bytes) -> bytes:
    """The projection key `suffix` of stream `stream`: `CLUSTER_PREFIX` + `stream_key(stream)` +
    `suffix`. Keys of one stream sort together, by suffix, and LMDB format 4 stores them next to
    the stream's index, so an append and its projection update touch one page."""
    if not isinstance(stream, str) or not stream or "\x00" in stream:
        raise InvalidArgumentError(
            f"cluster_key: expected a non-empty stream name without NUL, got {stream!r}"
        )
    if not isinstance(suffix, bytes):
        raise InvalidArgumentError(
            f"cluster_key: `suffix` must be bytes, got {type(suffix).__name__}"
        )
    return CLUSTER_PREFIX + stream.encode("utf-8") + b"\x00" + suffix


def prefix_end(prefix: bytes) -> bytes | None:
    """The first key after every key that starts with `prefix` (None: no key is after them)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class StorageTxn(ABC):
    """One backend transaction. Read-only ones refuse the write methods.

    A backend implements the abstract methods: the log's records by dense position and its
    stream index, the ordered key-value space, and nesting. The others are accelerations with
    defaults built on those; a backend overrides one only where it can do the same in fewer
    storage calls (a cursor walk, one query)."""

    __slots__ = ("_done",)
    _done: bool
    """Set by the first commit or abort, in a backend that ends a transaction once."""

    def _already_ended(self) -> bool:
        """Whether a commit or abort already ended this transaction (a second one does nothing);
        marks it ended either way."""
        ended, self._done = self._done, True
        return ended

    # The log: records by position, and the stream index (stream key + version -> position).

    @abstractmethod
    def last_position(self) -> int:
        """The last position written: the anchor's when every record was truncated away."""

    @abstractmethod
    def record(self, position: int) -> Buffer | None: ...

    @abstractmethod
    def records_after(self, after: int, limit: int) -> Iterator[tuple[int, Buffer]]:
        """Up to `limit` (position, record) pairs after `after`, in position order."""

    @abstractmethod
    def stream_version(self, key: bytes) -> int:
        """The stream's last version, counting versions truncated away (`stream_floor`)."""

    @abstractmethod
    def stream_positions(self, key: bytes, after_version: int, limit: int) -> list[int]: ...

    @abstractmethod
    def stream_position(self, key: bytes, version: int) -> int | None: ...

    @abstractmethod
    def index_size(self) -> int: ...

    @abstractmethod
    def put_records(
        self, first_position: int, records: Sequence[Buffer], key: bytes, first_version: int
    ) -> None: ...

    # Truncation: a prefix of the log dropped, and the hash at the cut kept as the anchor.

    @abstractmethod
    def anchor(self) -> tuple[int, bytes] | None:
        """The last position truncated away and the chain hash stored there; None when the log
        was never truncated."""

    @abstractmethod
    def stream_floor(self, key: bytes) -> int:
        """The last version of the stream truncated away (0 when none was)."""

    @abstractmethod
    def truncate(
        self, before: int, anchor_hash: bytes, dropped: Sequence[tuple[bytes, int]]
    ) -> None:
        """Delete the records at positions below `before` (the stream index entries of those
        not already gone are `dropped`, as (stream key, version) in position order), raise each
        stream's floor to its last dropped version, and store the anchor (`before - 1`,
        `anchor_hash`). The caller has checked the dropped records against the chain."""

    @abstractmethod
    def idempotent_positions(self, idempotency_key: str) -> tuple[str, int, int] | None:
        """The stream and first and last positions of the append that carried this key."""

    @abstractmethod
    def remember_idempotency_key(
        self, idempotency_key: str, stream: str, first: int, last: int
    ) -> None: ...

    # The ordered key-value space of the projections.

    @abstractmethod
    def kv_get(self, key: bytes) -> bytes | None: ...

    @abstractmethod
    def kv_put(self, key: bytes, value: Buffer) -> None: ...

    @abstractmethod
    def kv_delete(self, key: bytes) -> bool: ...

    @abstractmethod
    def kv_scan(
        self, start: bytes, stop: bytes | None, reverse: bool, limit: int | None
    ) -> list[tuple[bytes, bytes]]: ...

    # Transactions.

    @abstractmethod
    def child(self) -> StorageTxn: ...

    @abstractmethod
    def commit(self) -> None: ...

    @abstractmethod
    def abort(self) -> None: ...

    # Accelerations, with their defaults.

    def commit_sequence(self) -> int | None:
        """Where this write transaction's commit falls in the store's sequence of commits: the
        next write transaction's is exactly one more when no other commit (from any process)
        came between them. None where a backend cannot tell; the log then starts every
        transaction afresh (see `Transaction.resume`)."""
        return None

    def values_after(self, after: int, limit: int) -> Iterable[Buffer]:
        """Records after `after` without their keys: the read path checks positions itself."""
        return [record for _, record in self.records_after(after, limit)]

    def keys_dense(self, after: int, count: int) -> bool:
        """Whether the `count` records after `after` sit exactly at positions `after + 1` to
        `after + count`: a damaged key can keep the order and still hide a record from lookups."""
        found = [position for position, _ in self.records_after(after, count)]
        return found == list(range(after + 1, after + count + 1))

    def record_hash(self, position: int) -> bytes | None:
        """The hash the record at `position` carries, as stored (None when there is none): all
        that the record before a read is needed for. A store that keeps records packed reads it
        without unpacking."""
        record = self.record(position)
        return None if record is None else stored_hash(record)

    def records_around(
        self, positions: Iterable[int]
    ) -> Iterator[tuple[Buffer | None, Buffer | None]]:
        """For each position: the record before it (None when it directly follows the previous
        position asked for, or is position 1) and the record itself (None when missing). Each
        pair is read when the caller takes it where the store can (here, and in LMDB), so a
        caller that drops each record once checked never holds a whole transcript's buffers."""
        last = -2
        for position in positions:
            follows = position == last + 1 or position == 1
            yield None if follows else self.record(position - 1), self.record(position)
            last = position

    def stream_positions_of(self, entries: Sequence[tuple[bytes, int]]) -> list[int | None]:
        """`stream_position` of each (stream key, version)."""
        return [self.stream_position(key, version) for key, version in entries]

    def kv_put_many(self, items: Sequence[tuple[bytes, Buffer]]) -> None:
        """`kv_put` of each pair."""
        for key, value in items:
            self.kv_put(key, value)

    def kv_cluster_values(self, prefix: bytes, suffix: bytes) -> list[tuple[bytes, bytes]]:
        """For each stream whose name (UTF-8) starts with `prefix` and has a projection key
        `cluster_key(name, suffix)`, in name order: the name and that key's value. What a listing
        of many sessions reads, one key each, without the other keys of their clusters."""
        start = CLUSTER_PREFIX + prefix
        stop = prefix_end(start)
        tail = b"\x00" + suffix
        cut = len(tail)
        return [
            (key[1:-cut], value)
            for key, value in self.kv_scan(start, stop, False, None)
            if key.endswith(tail) and key.index(b"\x00") == len(key) - cut
        ]

    def kv_clear(self) -> None:
        """Delete every projection key (the log is untouched)."""
        while page := self.kv_scan(b"", None, False, 1024):
            for key, _ in page:
                self.kv_delete(key)


class Storage(Protocol):
    """A backend: hands out short read transactions and one write transaction at a time."""

    outcome_may_be_unknown: bool
    """Whether a commit can fail without knowing if it happened (`OutcomeUnknownError`)."""

    def reader(self) -> AbstractContextManager[StorageTxn]: ...

    def begin_write(self) -> StorageTxn: ...

    def size_bytes(self) -> int: ...

    def lease(self, name: str) -> Lease:
        """Hold the lease `name` until released or until this process ends (`eventlog._lease`);
        `LeaseHeldError` when a live holder has it."""
        ...

    def wait_for_commit(self, timeout_s: float) -> None:
        """Return when another writer may have committed, at the latest after `timeout_s`: a
        wake-up only, readers then read by position (a local store just sleeps)."""
        ...

    def close(self) -> None: ...
