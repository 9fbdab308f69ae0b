"""The small storage interface every backend implements, inside one transaction.

Two parts: the log (records by dense position, and a per-stream index of versions) and an ordered
key-value space where projections keep their state. Everything above this file (hashing, versions,
limits, subscriptions, the engine) is shared by all backends. Backends translate their own errors
into `eventlog.errors` and never decide anything about events.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from eventlog._lease import Lease

Buffer = bytes | bytearray | memoryview


def position_key(position: int) -> bytes:
    return position.to_bytes(8, "big")


def stream_key(stream: str) -> bytes:
    """Index prefix of a stream; NUL is refused in stream names, so prefixes never overlap."""
    return stream.encode("utf-8") + b"\x00"


class StorageTxn(Protocol):
    """One backend transaction. Read-only ones refuse the write methods."""

    def last_position(self) -> int: ...

    def record(self, position: int) -> Buffer | None: ...

    def records_after(self, after: int, limit: int) -> Iterator[tuple[int, Buffer]]: ...

    def values_after(self, after: int, limit: int) -> Iterable[Buffer]:
        """Records after `after` without their keys: the read path checks positions itself."""
        ...

    def keys_dense(self, after: int, count: int) -> bool:
        """Whether the `count` records after `after` sit exactly at positions `after + 1` to
        `after + count`: a damaged key can keep the order and still hide a record from lookups."""
        ...

    def records_around(
        self, positions: Iterable[int]
    ) -> Iterator[tuple[Buffer | None, Buffer | None]]:
        """For each position: the record before it (None when it directly follows the previous
        position asked for, or is position 1) and the record itself (None when missing)."""
        ...

    def stream_version(self, key: bytes) -> int: ...

    def stream_positions(self, key: bytes, after_version: int, limit: int) -> list[int]: ...

    def stream_position(self, key: bytes, version: int) -> int | None: ...

    def stream_positions_of(self, entries: Sequence[tuple[bytes, int]]) -> list[int | None]:
        """`stream_position` of each (stream key, version), in one call where the backend can."""
        ...

    def index_size(self) -> int: ...

    def put_records(
        self, first_position: int, records: Sequence[Buffer], key: bytes, first_version: int
    ) -> None: ...

    def idempotent_positions(self, idempotency_key: str) -> tuple[str, int, int] | None:
        """The stream and first and last positions of the append that carried this key."""
        ...

    def remember_idempotency_key(
        self, idempotency_key: str, stream: str, first: int, last: int
    ) -> None: ...

    def kv_get(self, key: bytes) -> bytes | None: ...

    def kv_put(self, key: bytes, value: Buffer) -> None: ...

    def kv_put_many(self, items: Sequence[tuple[bytes, Buffer]]) -> None:
        """`kv_put` of each pair, in one storage call where the backend has one."""
        ...

    def kv_delete(self, key: bytes) -> bool: ...

    def kv_clear(self) -> None:
        """Delete every projection key (the log is untouched)."""
        ...

    def kv_scan(
        self, start: bytes, stop: bytes | None, reverse: bool, limit: int | None
    ) -> list[tuple[bytes, bytes]]: ...

    def child(self) -> StorageTxn: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...


class Storage(Protocol):
    """A backend: hands out short read transactions and one write transaction at a time."""

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
