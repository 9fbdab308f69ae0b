"""The LMDB layout of formats 2, 3 and 4: the whole store in one B-tree, so a commit copies fewer
pages. Format 3 is format 2 with records packed (`eventlog/_packing.py`); its layout is the same.
Format 4 is format 3 with a stream's projection keys stored beside its index
(`eventlog/_lmdb_cluster.py`), which is why the index readers here skip keys whose chunk number
is `CLUSTER_CHUNK`.

Format 1 (`eventlog/_lmdb.py`) keeps events, the stream index, projection state, idempotency keys,
stream floors and the marker in named databases: a commit that appends one event and updates a projection
copies a leaf and the branch pages above it in three trees, plus the main database's page that
records their roots. Here every entry lives in LMDB's main database under a one-byte region
prefix, so the pages above the leaves are shared and there are no roots to record:

    b"f" + stream name + NUL                    -> the last version truncated away (8 bytes)
    b"i" + stream name + NUL + chunk (4 bytes)  -> up to `CHUNK_VERSIONS` positions, 6 bytes each
    b"i" + stream name + NUL + ff ff ff ff + s  -> format 4: the projection key `@` + name + NUL + s
    b"k" + key                                  -> projection state
    b"mformat", b"manchor"                      -> the format marker; a truncated log's anchor
    b"q" + idempotency key                      -> first, last position (8 bytes each) + stream
    b"\\xff" + position (7 bytes)                -> the event's record

Events sort last, so each is put with MDB_APPEND and their pages fill completely. The stream
index keeps the positions of versions `64 * chunk + 1` to `64 * chunk + 64` of a stream packed
in one value, so an event costs six bytes there instead of a key of its own (a version truncated
away leaves six zero bytes until its whole chunk is gone). This module owns the
key layout of format 2 and nothing else: the store's life is `LmdbStorage`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import lmdb

from eventlog._lmdb_base import ENTRY_OVERHEAD_BYTES, LmdbTxnBase
from eventlog._lmdb_errors import reads, translate
from eventlog._packing import PACK_MIN_BYTES, pack, unpack, unpacker
from eventlog._storage import Buffer, StorageTxn
from eventlog.errors import StorageError

FORMAT = b"sessionlog-log/2"
FORMAT_3 = b"sessionlog-log/3"
MARKER_KEY = b"mformat"
FLOORS = b"f"
INDEX = b"i"
KV = b"k"
IDEMPOTENCY = b"q"
_EVENT_BASE = 0xFF << 56
EVENTS_START = _EVENT_BASE.to_bytes(8, "big")
CHUNK_VERSIONS = 64
POSITION_BYTES = 6
_NONE = bytes(POSITION_BYTES)
TAILS_MAX = 1024
"""Streams whose last index chunk a transaction remembers before it starts over."""
POSITIONS_MAX = 2 ** (8 * POSITION_BYTES) - 1
"""The last position format 2 can index: far past any log (a million events a second for nine
years), and past it `put_records` refuses to write."""
CLUSTER_CHUNK = b"\xff" * 4
"""The chunk number no index chunk has: format 4 keeps a stream's projection keys after it."""
VERSIONS_MAX = int.from_bytes(CLUSTER_CHUNK, "big") * CHUNK_VERSIONS
"""The last stream version the index holds (the last of chunk 0xfffffffe): past it
`put_records` refuses to write, in every tree format, so no chunk is ever `CLUSTER_CHUNK`."""


def event_key(position: int) -> bytes:
    return (_EVENT_BASE | position).to_bytes(8, "big")


def chunk_key(key: bytes, version: int) -> bytes:
    """The index key holding `version` (from 1) of the stream whose index prefix is `key`."""
    return INDEX + key + ((version - 1) // CHUNK_VERSIONS).to_bytes(4, "big")


def slot(version: int) -> int:
    """Where `version`'s position starts in its chunk's value."""
    return (version - 1) % CHUNK_VERSIONS * POSITION_BYTES


def _position(key: Buffer) -> int:
    return int.from_bytes(key, "big") & ~_EVENT_BASE


class TreeTxn(LmdbTxnBase):
    """A transaction over a format-2 store: every key in the main database."""

    __slots__ = ("_dirty", "_failed", "_parent", "_tails")
    KEY_BASE = _EVENT_BASE
    KV_PREFIX = KV
    KV_END = bytes([KV[0] + 1])
    IDEMPOTENCY_PREFIX = IDEMPOTENCY
    ANCHOR_KEY = b"manchor"
    FLOOR_PREFIX = FLOORS

    _parent: TreeTxn | None
    _tails: dict[bytes, tuple[int, bytes, bytes]]
    """Stream key -> (chunk number, index key, value) of the last chunk this transaction wrote
    for the stream, so the next append to it need not read the chunk back. A nested
    transaction starts from its parent's and hands its own back when it commits; one that
    aborts leaves the parent's as they were, since the parent wrote nothing meanwhile."""
    _dirty: dict[bytes, bytes]
    """Index key -> value of the chunks appends changed and not yet put: a chunk is put once
    per transaction, not once per append. Anything that reads the index, a nested transaction
    and the commit put them first (`_flush`)."""
    _failed: bool
    """A put of those chunks failed: this transaction must not commit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # as `LmdbTxnBase`'s
        super().__init__(*args, **kwargs)
        self._parent = None
        self._tails = {}
        self._dirty = {}
        self._failed = False

    def _flush(self) -> None:
        """Put the index chunks appends left in `_dirty`."""
        dirty, put = self._dirty, self._txn.put
        self._dirty = {}
        try:
            for index_key, value in dirty.items():
                put(index_key, value)
        except lmdb.Error as exc:
            self._failed = True
            self._store.note_failure(exc)
            raise self._store.write_failure(exc, "writing the stream index") from exc

    def child(self) -> StorageTxn:
        if self._dirty:
            self._flush()
        child = cast(TreeTxn, super().child())
        child._parent = self
        child._tails = dict(self._tails)
        return child

    def commit(self) -> None:
        if self._done:
            return
        if self._dirty or self._failed:
            try:
                if self._failed:
                    raise StorageError("a write of the stream index failed; nothing was kept")
                self._flush()
            except BaseException:
                self.abort()
                raise
        super().commit()
        parent = self._parent
        if parent is not None:
            parent._tails = self._tails

    def abort(self) -> None:
        self._dirty = {}
        super().abort()

    # The stream index: chunks of packed positions.

    @reads
    def stream_version(self, key: bytes) -> int:
        if self._dirty:
            self._flush()
        prefix = INDEX + key
        cursor = self._txn.cursor()
        found = cursor.prev() if cursor.set_range(prefix + b"\xff" * 4) else cursor.last()
        last = cursor.key() if found else b""
        if len(last) != len(prefix) + 4 or last[: len(prefix)] != prefix:
            return self.stream_floor(key)  # every version truncated away, or none written
        chunk = int.from_bytes(last[len(prefix) :], "big")
        return chunk * CHUNK_VERSIONS + len(cursor.value()) // POSITION_BYTES

    @reads
    def stream_positions(self, key: bytes, after_version: int, limit: int) -> list[int]:
        if self._dirty:
            self._flush()
        prefix = INDEX + key
        cursor = self._txn.cursor()
        positions: list[int] = []
        if limit <= 0 or after_version >= VERSIONS_MAX:
            return positions
        if not cursor.set_key(chunk_key(key, after_version + 1)):
            return positions
        start = slot(after_version + 1)
        width, end = POSITION_BYTES, len(prefix) + 4
        for index_key, value in cursor.iternext():
            # A full chunk may be followed by the stream's first projection key (format 4).
            if len(index_key) != end or index_key[: len(prefix)] != prefix:
                break
            if index_key[-4:] == CLUSTER_CHUNK:
                break
            data = bytes(value)
            for offset in range(start, len(data), width):
                positions.append(int.from_bytes(data[offset : offset + width], "big"))
                if len(positions) >= limit:
                    return positions
            if len(data) < CHUNK_VERSIONS * width:
                break  # the stream's last chunk
            start = 0
        return positions

    @reads
    def stream_position(self, key: bytes, version: int) -> int | None:
        if self._dirty:
            self._flush()
        if version < 1 or version > VERSIONS_MAX:
            return None
        value = self._txn.get(chunk_key(key, version))
        at = slot(version)
        if value is None or len(value) < at + POSITION_BYTES:
            return None
        return int.from_bytes(value[at : at + POSITION_BYTES], "big") or None

    @reads
    def index_size(self) -> int:
        if self._dirty:
            self._flush()
        cursor = self._txn.cursor()
        count = 0
        found = cursor.set_range(INDEX)
        while found:
            index_key = bytes(cursor.key())
            if index_key[:1] != INDEX:
                break
            end = index_key.find(b"\x00", 1)
            if index_key[end + 1 : end + 5] == CLUSTER_CHUNK:  # format 4: projection keys follow
                found = cursor.set_range(index_key[:end] + b"\x01")  # the next stream's
                continue
            data = bytes(cursor.value())
            found = cursor.next()
            count += len(data) // POSITION_BYTES
            if _NONE in data:  # versions truncated away are zeroed slots
                count -= sum(
                    data[at : at + POSITION_BYTES] == _NONE
                    for at in range(0, len(data), POSITION_BYTES)
                )
        return count

    def put_records(
        self, first_position: int, records: Sequence[Buffer], key: bytes, first_version: int
    ) -> None:
        last_position = first_position + len(records) - 1
        if last_position > POSITIONS_MAX:
            raise StorageError(f"the log is full: format 2 indexes positions up to {POSITIONS_MAX}")
        if first_version + len(records) - 1 > VERSIONS_MAX:
            stream = bytes(key[:-1]).decode("utf-8", "replace")
            raise StorageError(
                f"stream `{stream}` is full: the stream index holds versions up to "
                f"{VERSIONS_MAX}, and this append would reach {first_version + len(records) - 1}"
            )
        # One entry per record, and one chunk per 64 versions rewritten with its new positions.
        self._store.write_bytes += sum(map(len, records)) + len(records) * (
            8 + POSITION_BYTES + ENTRY_OVERHEAD_BYTES
        )
        txn = self._txn
        try:
            if len(records) == 1:
                # put(key, value, dupdata, overwrite, append): positional, as py-lmdb parses
                # keywords at a cost that shows on the path of every append.
                added = txn.put(event_key(first_position), records[0], True, False, True)
                count = 1
            else:
                base = _EVENT_BASE  # `event_key` inlined: a call per record shows here
                items = [
                    ((base | position).to_bytes(8, "big"), record)
                    for position, record in enumerate(records, first_position)
                ]
                _, count = txn.cursor().putmulti(items, append=True, overwrite=False)
                added = count == len(records)
            indexed = self._index(key, first_version, first_position, len(records))
        except lmdb.Error as exc:
            self._store.note_failure(exc)
            raise self._store.write_failure(exc, "writing events") from exc
        if not (added and indexed):
            raise AssertionError("a position or stream version was already taken")

    def _index(self, key: bytes, first_version: int, first_position: int, count: int) -> bool:
        """Add versions `first_version`.. of a stream at consecutive positions; False when the
        index does not end right before `first_version`."""
        txn, width, tails, dirty = self._txn, POSITION_BYTES, self._tails, self._dirty
        if count == 1:  # the common append: one version onto the chunk this transaction holds
            tail = tails.get(key)
            if tail is not None and tail[0] == (first_version - 1) // CHUNK_VERSIONS:
                number, tail_key, before = tail
                if len(before) != slot(first_version):
                    return False
                after = before + first_position.to_bytes(width, "big")
                dirty[tail_key] = after
                tails[key] = (number, tail_key, after)
                return True
        version, position, left = first_version, first_position, count
        while left:
            at = slot(version)
            room = min(left, CHUNK_VERSIONS - at // width)
            chunk = (version - 1) // CHUNK_VERSIONS
            tail = tails.get(key)
            held: Buffer | None
            if tail is not None and tail[0] == chunk:
                index_key, held = tail[1], tail[2]
            else:
                index_key = chunk_key(key, version)
                held = (dirty.get(index_key) or txn.get(index_key)) if at else None
                if held is None and at and self.stream_floor(key) >= version - 1:
                    held = bytes(at)  # the chunk's earlier versions were all truncated away
            if len(held or b"") != at:
                return False
            if room == 1:  # the common append: one version, no generator to run
                added = position.to_bytes(width, "big")
            else:
                added = b"".join(p.to_bytes(width, "big") for p in range(position, position + room))
            value = b"".join((held, added)) if held is not None else added
            dirty[index_key] = value
            if len(tails) >= TAILS_MAX and key not in tails:
                tails.clear()
            tails[key] = (chunk, index_key, value)
            version += room
            position += room
            left -= room
        return True

    def truncate(
        self, before: int, anchor_hash: bytes, dropped: Sequence[tuple[bytes, int]]
    ) -> None:
        # A dropped version's slot is zeroed, so the versions after it keep their places; a
        # chunk left with no position at all is deleted.
        if self._dirty:
            self._flush()
        txn = self._txn
        self._tails.clear()  # the cut zeroes slots of chunks this transaction may remember
        floors: dict[bytes, int] = {}
        chunks: dict[bytes, bytearray] = {}
        try:
            for key, version in dropped:
                index_key = chunk_key(key, version)
                chunk = chunks.get(index_key)
                if chunk is None:
                    chunk = chunks[index_key] = bytearray(txn.get(index_key) or b"")
                at = slot(version)
                chunk[at : at + POSITION_BYTES] = _NONE
                floors[key] = version
            for index_key, chunk in chunks.items():
                if chunk.count(0) == len(chunk):
                    txn.delete(index_key)
                else:
                    txn.put(index_key, bytes(chunk))
            self._truncate_events(before, anchor_hash, floors)
        except lmdb.Error as exc:
            self._store.note_failure(exc)
            raise self._store.write_failure(exc, "truncating the log") from exc

    def kv_clear(self) -> None:
        try:
            cursor = self._txn.cursor()
            found = cursor.set_range(KV)
            while found and cursor.key()[:1] == KV:
                found = cursor.delete()
        except lmdb.Error as exc:
            raise translate(exc, "clearing projection state") from exc


class PackedTreeTxn(TreeTxn):
    """A transaction over a format-3 store: format 2's tree, records packed where that pays. The
    records it hands out are always as they are; `records_around` unpacks only the wanted ones,
    since of the record before each it needs the hash, which packing leaves in place, and each
    only when its reader reaches it (a damaged one may unpack to megabytes)."""

    __slots__ = ()

    @reads
    def record(self, position: int) -> Buffer | None:
        found = super().record(position)
        return None if found is None else unpack(found)

    def _records_after(self, after: int, limit: int) -> Iterator[tuple[int, Buffer]]:
        unpack_one = unpacker()
        for position, value in super()._records_after(after, limit):
            yield position, unpack_one(value)

    def values_after(self, after: int, limit: int) -> Iterable[Buffer]:
        return map(unpacker(), super().values_after(after, limit))

    def records_around(
        self, positions: Iterable[int]
    ) -> Iterator[tuple[Buffer | None, Buffer | None]]:
        return self._walk_around(positions, unpacker())

    def put_records(
        self, first_position: int, records: Sequence[Buffer], key: bytes, first_version: int
    ) -> None:
        # `pack` returns a short record as it is: asked here first, it costs no call.
        packed = [record if len(record) < PACK_MIN_BYTES else pack(record) for record in records]
        super().put_records(first_position, packed, key, first_version)


def walk_regions(txn: lmdb.Transaction[memoryview]) -> str | None:
    """Read every entry but the events (stream floors, the index, projection state, idempotency
    keys, the marker and anchor), so a damaged page there is met; the first problem, or None."""
    cursor = txn.cursor()
    try:
        if not cursor.first():
            return None
        for key, value in cursor.iternext():
            region = bytes(key[:1])
            if region == EVENTS_START[:1]:
                return None
            if region == IDEMPOTENCY and len(value) <= 16:
                return f"the idempotency keys table holds a damaged entry under {bytes(key)!r}"
    except lmdb.Error as exc:
        return f"the projection state, meta or idempotency region is damaged: {exc}"
    return None
