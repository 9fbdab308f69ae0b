"""The in-memory reference backend: the simplest storage that honours the same contract as LMDB.

A write transaction holds the backend's lock from begin to commit or abort and keeps an undo list,
so readers in other threads never see uncommitted writes and a nested transaction is a savepoint
in that list. Nothing survives the process; this backend exists to check the others against.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from eventlog._lease import Lease, memory_lease
from eventlog._storage import Buffer, StorageTxn
from eventlog.errors import LogClosedError


class MemoryStorage:
    outcome_may_be_unknown = False

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.records: list[bytes] = []
        """The records from position `base + 1` on: the first `base` were truncated away."""
        self.base = 0
        self.anchor: tuple[int, bytes] | None = None
        self.index: dict[bytes, list[int]] = {}
        """Per stream, the positions of its versions from `floors[key] + 1` on."""
        self.floors: dict[bytes, int] = {}
        self.kv: dict[bytes, bytes] = {}
        self.kv_keys: list[bytes] = []
        self.idempotency: dict[str, tuple[str, int, int]] = {}
        self.closed = False
        self.leases: set[str] = set()

    @contextmanager
    def reader(self) -> Iterator[StorageTxn]:
        self._check_open()
        with self.lock:
            yield _MemoryTxn(self, write=False)

    def begin_write(self) -> StorageTxn:
        self._check_open()
        self.lock.acquire()
        return _MemoryTxn(self, write=True)

    def size_bytes(self) -> int:
        with self.lock:
            return sum(map(len, self.records)) + sum(len(k) + len(v) for k, v in self.kv.items())

    def wait_for_commit(self, timeout_s: float) -> None:
        time.sleep(timeout_s)

    def lease(self, name: str) -> Lease:
        self._check_open()
        return memory_lease(self.leases, self.lock, name, "memory")

    def close(self) -> None:
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise LogClosedError("the in-memory log is closed")


class _MemoryTxn(StorageTxn):
    def __init__(
        self, store: MemoryStorage, *, write: bool, parent: _MemoryTxn | None = None
    ) -> None:
        self.store = store
        self.write = write
        self.parent = parent
        self.undo: list[tuple[Any, ...]] = parent.undo if parent else []
        self.savepoint = len(self.undo)
        self.done = False

    def last_position(self) -> int:
        return self.store.base + len(self.store.records)

    def record(self, position: int) -> Buffer | None:
        store = self.store
        if store.base < position <= store.base + len(store.records):
            return store.records[position - store.base - 1]
        return None

    def records_after(self, after: int, limit: int) -> Iterator[tuple[int, Buffer]]:
        store = self.store
        records, base = store.records, store.base
        after = max(after, base)
        stop = min(base + len(records), after + limit)
        for position in range(after + 1, stop + 1):
            yield position, records[position - base - 1]

    def stream_version(self, key: bytes) -> int:
        return self.stream_floor(key) + len(self.store.index.get(key, ()))

    def stream_positions(self, key: bytes, after_version: int, limit: int) -> list[int]:
        start = max(after_version - self.stream_floor(key), 0)
        return self.store.index.get(key, [])[start : start + limit]

    def stream_position(self, key: bytes, version: int) -> int | None:
        positions = self.store.index.get(key, [])
        offset = version - self.stream_floor(key)
        return positions[offset - 1] if 1 <= offset <= len(positions) else None

    def anchor(self) -> tuple[int, bytes] | None:
        return self.store.anchor

    def stream_floor(self, key: bytes) -> int:
        return self.store.floors.get(key, 0)

    def truncate(
        self, before: int, anchor_hash: bytes, dropped: Sequence[tuple[bytes, int]]
    ) -> None:
        store = self.store
        self.undo.append(
            (
                "truncate",
                store.base,
                list(store.records),
                dict(store.index),
                dict(store.floors),
                store.anchor,
            )
        )
        count = before - 1 - store.base
        del store.records[:count]
        store.base = before - 1
        gone: dict[bytes, int] = {}
        for key, version in dropped:
            gone[key] = max(gone.get(key, 0), version)
        for key, version in gone.items():
            kept = store.index.get(key, [])[version - self.stream_floor(key) :]
            if kept:
                store.index[key] = kept
            else:
                store.index.pop(key, None)
            store.floors[key] = version
        store.anchor = (before - 1, anchor_hash)

    def index_size(self) -> int:
        return sum(map(len, self.store.index.values()))

    def put_records(
        self, first_position: int, records: Sequence[Buffer], key: bytes, first_version: int
    ) -> None:
        store = self.store
        if first_position != store.base + len(store.records) + 1:
            raise AssertionError("positions must be dense")
        positions = store.index.setdefault(key, [])
        if first_version != store.floors.get(key, 0) + len(positions) + 1:
            raise AssertionError("versions must be dense")
        for offset, record in enumerate(records):
            store.records.append(bytes(record))
            positions.append(first_position + offset)
        self.undo.append(("records", key, len(records)))

    def idempotent_positions(self, idempotency_key: str) -> tuple[str, int, int] | None:
        return self.store.idempotency.get(idempotency_key)

    def remember_idempotency_key(
        self, idempotency_key: str, stream: str, first: int, last: int
    ) -> None:
        self.store.idempotency[idempotency_key] = (stream, first, last)
        self.undo.append(("idempotency", idempotency_key))

    def kv_get(self, key: bytes) -> bytes | None:
        return self.store.kv.get(key)

    def kv_put(self, key: bytes, value: Buffer) -> None:
        store = self.store
        old = store.kv.get(key)
        if old is None:
            bisect.insort(store.kv_keys, key)
        store.kv[key] = bytes(value)
        self.undo.append(("kv", key, old))

    def kv_delete(self, key: bytes) -> bool:
        store = self.store
        old = store.kv.pop(key, None)
        if old is None:
            return False
        del store.kv_keys[bisect.bisect_left(store.kv_keys, key)]
        self.undo.append(("kv", key, old))
        return True

    def kv_scan(
        self, start: bytes, stop: bytes | None, reverse: bool, limit: int | None
    ) -> list[tuple[bytes, bytes]]:
        keys = self.store.kv_keys
        lo = bisect.bisect_left(keys, start)
        hi = len(keys) if stop is None else bisect.bisect_left(keys, stop)
        chosen = keys[lo:hi]
        if reverse:
            chosen.reverse()
        if limit is not None:
            chosen = chosen[:limit]
        return [(key, self.store.kv[key]) for key in chosen]

    def child(self) -> StorageTxn:
        return _MemoryTxn(self.store, write=True, parent=self)

    def commit(self) -> None:
        self._finish()

    def abort(self) -> None:
        store = self.store
        while len(self.undo) > self.savepoint:
            entry = self.undo.pop()
            if entry[0] == "records":
                _, key, count = entry
                del store.records[-count:]
                positions = store.index[key]
                del positions[-count:]
                if not positions:
                    del store.index[key]
            elif entry[0] == "truncate":
                _, store.base, store.records, store.index, store.floors, store.anchor = entry
            elif entry[0] == "idempotency":
                del store.idempotency[entry[1]]
            else:
                _, key, old = entry
                if old is None:
                    store.kv.pop(key, None)
                    del store.kv_keys[bisect.bisect_left(store.kv_keys, key)]
                else:
                    if key not in store.kv:
                        bisect.insort(store.kv_keys, key)
                    store.kv[key] = old
        self._finish()

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        if self.parent is None and self.write:
            self.undo.clear()
            self.store.lock.release()
