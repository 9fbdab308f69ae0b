"""A scratch transaction: the committed log as it is, beside a projection space of its own.

Checking the projections against the log means rebuilding them from the log somewhere else and
comparing. `ScratchTxn` reads the log through one read transaction of the real store and keeps
the projection state it is given in a throwaway LMDB environment (a B-tree, so scans stay ordered
and memory stays bounded however large the state is). It can never append, and nothing it writes
reaches the real store.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from eventlog._storage import Buffer, StorageTxn
from eventlog.errors import InvalidArgumentError


class ScratchTxn(StorageTxn):
    """`StorageTxn` whose log is `log_txn` (read-only) and whose projection space is `kv_txn`."""

    def __init__(self, log_txn: StorageTxn, kv_txn: StorageTxn) -> None:
        self._log = log_txn
        self._kv = kv_txn

    def last_position(self) -> int:
        return self._log.last_position()

    def record(self, position: int) -> Buffer | None:
        return self._log.record(position)

    def records_after(self, after: int, limit: int) -> Iterator[tuple[int, Buffer]]:
        return self._log.records_after(after, limit)

    def values_after(self, after: int, limit: int) -> Iterable[Buffer]:
        return self._log.values_after(after, limit)

    def records_around(
        self, positions: Iterable[int]
    ) -> Iterator[tuple[Buffer | None, Buffer | None]]:
        return self._log.records_around(positions)

    def stream_version(self, key: bytes) -> int:
        return self._log.stream_version(key)

    def stream_positions(self, key: bytes, after_version: int, limit: int) -> list[int]:
        return self._log.stream_positions(key, after_version, limit)

    def stream_position(self, key: bytes, version: int) -> int | None:
        return self._log.stream_position(key, version)

    def index_size(self) -> int:
        return self._log.index_size()

    def anchor(self) -> tuple[int, bytes] | None:
        return self._log.anchor()

    def stream_floor(self, key: bytes) -> int:
        return self._log.stream_floor(key)

    def truncate(
        self, before: int, anchor_hash: bytes, dropped: Sequence[tuple[bytes, int]]
    ) -> None:
        raise InvalidArgumentError("a scratch transaction rebuilds projections; it cannot truncate")

    def put_records(
        self, first_position: int, records: Sequence[Buffer], key: bytes, first_version: int
    ) -> None:
        raise InvalidArgumentError("a scratch transaction rebuilds projections; it cannot append")

    def idempotent_positions(self, idempotency_key: str) -> tuple[str, int, int] | None:
        return self._log.idempotent_positions(idempotency_key)

    def remember_idempotency_key(
        self, idempotency_key: str, stream: str, first: int, last: int
    ) -> None:
        raise InvalidArgumentError("a scratch transaction rebuilds projections; it cannot append")

    def kv_get(self, key: bytes) -> bytes | None:
        return self._kv.kv_get(key)

    def kv_put(self, key: bytes, value: Buffer) -> None:
        self._kv.kv_put(key, value)

    def kv_put_many(self, items: Sequence[tuple[bytes, Buffer]]) -> None:
        self._kv.kv_put_many(items)

    def kv_delete(self, key: bytes) -> bool:
        return self._kv.kv_delete(key)

    def kv_clear(self) -> None:
        self._kv.kv_clear()

    def kv_scan(
        self, start: bytes, stop: bytes | None, reverse: bool, limit: int | None
    ) -> list[tuple[bytes, bytes]]:
        return self._kv.kv_scan(start, stop, reverse, limit)

    def child(self) -> StorageTxn:
        return ScratchTxn(self._log, self._kv.child())

    def commit(self) -> None:
        self._kv.commit()

    def abort(self) -> None:
        self._kv.abort()
