"""What both LMDB layouts share: a transaction's events, projection state, idempotency keys, anchor
and stream floors, whose keys differ between the formats only by a base or a prefix, and its life
(nesting, commit, abort).

`eventlog/_lmdb.py` (the store, and format 1's named databases), `eventlog/_lmdb_tree.py`
(the one tree of formats 2 to 4) and `eventlog/_lmdb_cluster.py` (format 4's projection keys)
build on it.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import lmdb

from eventlog._codec import stored_hash
from eventlog._lmdb_errors import reads, translate, translate_read, translated
from eventlog._storage import Buffer, StorageTxn
from eventlog.errors import CorruptStoreError

if TYPE_CHECKING:
    from eventlog._lmdb import LmdbStorage

# What one entry costs LMDB beyond its key and value, generously: node header, page pointer, and
# the slack of half-full pages after splits and of a big value's last overflow page. Doubled
# with the bytes themselves, it sizes the map growth after a write ran out of room.
ENTRY_OVERHEAD_BYTES = 64


def idempotency_value(stream: str, first: int, last: int) -> bytes:
    """What both formats store for an idempotency key: first and last position, then the stream."""
    return first.to_bytes(8, "big") + last.to_bytes(8, "big") + stream.encode()


def idempotency_entry(idempotency_key: str, value: Buffer) -> tuple[str, int, int]:
    """`idempotency_value` read back; `CorruptStoreError` when the stream name is damaged."""
    try:
        stream = bytes(value[16:]).decode()
    except UnicodeDecodeError as exc:
        raise CorruptStoreError(
            f"idempotency key {idempotency_key!r}: its stored stream name is damaged", None
        ) from exc
    return stream, int.from_bytes(value[:8], "big"), int.from_bytes(value[8:16], "big")


def _as_stored(value: Buffer) -> Buffer:
    """A record as it is stored (formats 1 and 2 store records as they are)."""
    return value


class LmdbTxnBase(StorageTxn):
    """A transaction of either layout: the events, whose keys are `KEY_BASE | position` as 8
    big-endian bytes in the store's `events` table (its own in format 1, the one tree in format
    2); subclasses say where everything else lives."""

    KEY_BASE = 0
    KV_PREFIX = b""  # projection keys, and the first key after them (None: the table's end)
    KV_END: bytes | None = None
    IDEMPOTENCY_PREFIX = b""
    ANCHOR_KEY = b"anchor"  # in `meta`: the last truncated position (8 bytes), its hash (32)
    FLOOR_PREFIX = b""  # in `floors`: stream key -> the last version truncated away

    __slots__ = ("_counted", "_store", "_txn", "_write")

    def __init__(
        self,
        store: LmdbStorage,
        txn: lmdb.Transaction[memoryview],
        *,
        write: bool,
        counted: bool,
    ) -> None:
        self._store = store
        self._txn = txn
        self._write = write
        self._counted = counted
        self._done = False

    @property
    def raw(self) -> lmdb.Transaction[memoryview]:
        return self._txn

    @reads
    def last_position(self) -> int:
        cursor = self._txn.cursor(self._store.events)
        if cursor.last():
            key = cursor.key()  # in format 2, the last key of the tree: another table's key
            found = int.from_bytes(key, "big")  # (a long one) when no event is left
            if len(key) == 8 and found >= self.KEY_BASE:
                return found ^ self.KEY_BASE
        anchor = self.anchor()
        return 0 if anchor is None else anchor[0]

    @reads
    def anchor(self) -> tuple[int, bytes] | None:
        value = self._txn.get(self.ANCHOR_KEY, db=self._store.meta)
        if value is None:
            return None
        if len(value) != 8 + 32:
            raise CorruptStoreError(f"the log's anchor is damaged ({len(value)} bytes, not 40)")
        return int.from_bytes(value[:8], "big"), bytes(value[8:])

    @reads
    def stream_floor(self, key: bytes) -> int:
        table = self._store.floors
        value = None if table is None else self._txn.get(self.FLOOR_PREFIX + key, db=table)
        return 0 if value is None else int.from_bytes(value, "big")

    def _truncate_events(self, before: int, anchor_hash: bytes, floors: dict[bytes, int]) -> None:
        """What a truncation does beside the index: raise the floors, delete the records below
        `before`, store the anchor. Raises `lmdb.Error` for the caller to translate."""
        txn, store, base = self._txn, self._store, self.KEY_BASE
        for key, version in floors.items():
            txn.put(self.FLOOR_PREFIX + key, version.to_bytes(8, "big"), db=store.floors)
        cursor = txn.cursor(store.events)
        first = base.to_bytes(8, "big")
        # Deleting at the cursor moves it to the next entry: walk the prefix from its start.
        while cursor.set_range(first) and int.from_bytes(cursor.key(), "big") < base | before:
            cursor.delete()
        anchor = (before - 1).to_bytes(8, "big") + anchor_hash
        txn.put(self.ANCHOR_KEY, anchor, db=store.meta)

    @reads
    def record(self, position: int) -> Buffer | None:
        return self._txn.get((self.KEY_BASE | position).to_bytes(8, "big"), db=self._store.events)

    @reads
    def record_hash(self, position: int) -> bytes | None:
        # Read as stored: format 3's packing leaves the hash where every record keeps it.
        found = LmdbTxnBase.record(self, position)
        return None if found is None else stored_hash(found)

    def records_after(self, after: int, limit: int) -> Iterator[tuple[int, Buffer]]:
        return translated(self._records_after(after, limit), "reading events")

    def _records_after(self, after: int, limit: int) -> Iterator[tuple[int, Buffer]]:
        cursor = self._txn.cursor(self._store.events)
        base = self.KEY_BASE
        if not cursor.set_range((base | after + 1).to_bytes(8, "big")):
            return
        for count, (key, value) in enumerate(cursor.iternext()):
            if count >= limit:
                return
            yield int.from_bytes(key, "big") ^ base, value

    @reads
    def values_after(self, after: int, limit: int) -> Iterable[Buffer]:
        cursor = self._txn.cursor(self._store.events)
        if not cursor.set_range((self.KEY_BASE | after + 1).to_bytes(8, "big")):
            return ()
        values = cursor.iternext(keys=False, values=True)
        return translated(itertools.islice(values, limit), "reading events")

    @reads
    def keys_dense(self, after: int, count: int) -> bool:
        cursor = self._txn.cursor(self._store.events)
        base = self.KEY_BASE
        if not cursor.set_range((base | after + 1).to_bytes(8, "big")):
            return count == 0
        keys = list(itertools.islice(cursor.iternext(keys=True, values=False), count))
        wanted = range(after + 1, after + count + 1)
        expected = ((base | position).to_bytes(8, "big") for position in wanted)
        return len(keys) == count and all(map(operator.eq, keys, expected))

    def records_around(
        self, positions: Iterable[int]
    ) -> Iterator[tuple[Buffer | None, Buffer | None]]:
        return self._walk_around(positions, _as_stored)

    def _walk_around(
        self, positions: Iterable[int], record_of: Callable[[Buffer], Buffer]
    ) -> Iterator[tuple[Buffer | None, Buffer | None]]:
        # One cursor: a run of consecutive positions costs one `next` each, a jump one seek.
        # Events are the last keys of their tree: the step after the newest finds nothing, and
        # a record found past a hole is caught by `check_at`, from the position it carries.
        # Each pair is read as the caller takes it: a reader that checks and drops each record
        # as it goes holds none of them (nor their buffers) past its turn, so a long
        # transcript's read leaves nothing for the garbage collector to scan. Each wanted record
        # goes through `record_of` (format 3 unpacks it there); of the record before it the
        # reader takes only the hash, which is where it is in either form.
        cursor = self._txn.cursor(self._store.events)
        base = self.KEY_BASE
        set_key, step, value = cursor.set_key, cursor.next, cursor.value
        last = -2
        try:
            for position in positions:
                if position == last + 1 and last > 0:
                    yield None, record_of(value()) if step() else None
                elif position == 1:
                    found = set_key((base | 1).to_bytes(8, "big"))
                    yield None, record_of(value()) if found else None
                elif set_key((base | position - 1).to_bytes(8, "big")):
                    yield value(), record_of(value()) if step() else None
                else:  # no record before (truncated away, or missing): the record alone
                    found = set_key((base | position).to_bytes(8, "big"))
                    yield None, record_of(value()) if found else None
                last = position
        except lmdb.Error as exc:
            raise translate_read(exc, "reading events") from exc

    def idempotent_positions(self, idempotency_key: str) -> tuple[str, int, int] | None:
        table = self._store.idempotency
        if table is None:
            return None
        try:
            value = self._txn.get(self.IDEMPOTENCY_PREFIX + idempotency_key.encode(), db=table)
        except lmdb.Error as exc:
            raise translate(exc, "reading idempotency keys") from exc
        return None if value is None else idempotency_entry(idempotency_key, value)

    def remember_idempotency_key(
        self, idempotency_key: str, stream: str, first: int, last: int
    ) -> None:
        value = idempotency_value(stream, first, last)
        key = self.IDEMPOTENCY_PREFIX + idempotency_key.encode()
        self._store.write_bytes += len(key) + len(value) + ENTRY_OVERHEAD_BYTES
        try:
            self._txn.put(key, value, db=self._store.idempotency)
        except lmdb.Error as exc:
            self._store.note_failure(exc)
            raise self._store.write_failure(exc, "writing an idempotency key") from exc

    @reads
    def kv_get(self, key: bytes) -> bytes | None:
        value = self._txn.get(self.KV_PREFIX + key, db=self._store.kv)
        return None if value is None else bytes(value)

    def kv_put(self, key: bytes, value: Buffer) -> None:
        self.kv_put_many(((key, value),))

    def kv_put_many(self, items: Sequence[tuple[bytes, Buffer]]) -> None:
        prefix = self.KV_PREFIX
        self._put_stored([(prefix + k, v) for k, v in items])

    def _put_stored(self, stored: Sequence[tuple[bytes, Buffer]]) -> None:
        """Put projection entries whose keys are already the stored ones."""
        self._store.write_bytes += sum(len(k) + len(v) for k, v in stored) + len(stored) * (
            ENTRY_OVERHEAD_BYTES
        )
        try:
            if len(stored) == 1:
                # Straight in: a cursor opened for one key costs 7,000 instructions.
                self._txn.put(*stored[0], db=self._store.kv)
            else:
                self._txn.cursor(self._store.kv).putmulti(stored)
        except lmdb.Error as exc:
            self._store.note_failure(exc)
            raise self._store.write_failure(exc, "writing projection state") from exc

    @reads
    def kv_delete(self, key: bytes) -> bool:
        return bool(self._txn.delete(self.KV_PREFIX + key, db=self._store.kv))

    @reads
    def kv_scan(
        self, start: bytes, stop: bytes | None, reverse: bool, limit: int | None
    ) -> list[tuple[bytes, bytes]]:
        prefix = self.KV_PREFIX
        high = prefix + stop if stop is not None else self.KV_END
        return self._scan_stored(prefix + start, high, reverse, limit, b"", len(prefix))

    def _scan_stored(
        self,
        low: bytes,
        high: bytes | None,
        reverse: bool,
        limit: int | None,
        head: bytes,
        cut: int,
    ) -> list[tuple[bytes, bytes]]:
        """The projection entries stored from `low` up to `high` (None: the table's end), each
        key given back as `head` + the stored key from byte `cut` on."""
        cursor = self._txn.cursor(self._store.kv)
        out: list[tuple[bytes, bytes]] = []
        if reverse:
            found = cursor.prev() if high is not None and cursor.set_range(high) else cursor.last()
            items = cursor.iterprev() if found else iter(())
        else:
            items = cursor.iternext() if cursor.set_range(low) else iter(())
        for key, value in items:
            if limit is not None and len(out) >= limit:
                break
            key_bytes = bytes(key)
            if key_bytes < low or (high is not None and key_bytes >= high):
                break
            out.append((head + key_bytes[cut:], bytes(value)))
        return out

    def commit_sequence(self) -> int | None:
        return int(self._txn.id())  # a write transaction's id is the last committed one's + 1

    def child(self) -> StorageTxn:
        try:
            txn = self._store.env.begin(write=True, parent=self._txn, buffers=True)
        except lmdb.Error as exc:
            raise translate(exc, "beginning a nested transaction") from exc
        return type(self)(self._store, txn, write=True, counted=False)

    def commit(self) -> None:
        if self._already_ended():
            return
        try:
            self._txn.commit()
        except lmdb.Error as exc:
            raise self._store.write_failure(exc, "committing") from exc
        finally:
            if self._counted:
                self._store._gate.leave()

    def abort(self) -> None:
        if self._already_ended():
            return
        try:
            self._txn.abort()
        finally:
            if self._counted:
                self._store._gate.leave()
