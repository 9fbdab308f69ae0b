"""Under the log's API: the entries of a closed LMDB store, in any on-disk format, for the tests
that damage a store on purpose. The store's own `EventLog` must be closed first (one environment
per path per process). Formats 2 to 4 keep everything in LMDB's main database
(`eventlog/_lmdb_tree.py`); format 1 in five named databases. Records are read as they are, packed
ones unpacked (format 3), and put back as given: a format-3 store reads a record stored as it is,
so a test changes the bytes of the record itself, not of its compressed form."""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb

from eventlog import _lmdb_tree as tree
from eventlog._lmdb_cluster import FORMAT_4, logical_key, stored_key
from eventlog._packing import unpack
from eventlog._storage import stream_key


def event_key(position: int, format_version: int = 2) -> bytes:
    """The LMDB key of the event at `position`."""
    return tree.event_key(position) if format_version >= 2 else position.to_bytes(8, "big")


class RawLog:
    """One write transaction over the store, committed when the `with` block of `raw_log` ends."""

    def __init__(self, env: lmdb.Environment, txn: lmdb.Transaction[bytes]) -> None:
        self.env = env
        self.txn = txn
        marker = txn.get(tree.MARKER_KEY)
        markers = {tree.FORMAT_3: 3, FORMAT_4: 4}
        self.format_version = 1 if marker is None else markers.get(bytes(marker), 2)
        if self.format_version >= 2:
            self.events = self._kv_db = self.index = env.open_db(None, txn=txn)
        else:
            self.events = env.open_db(b"events", txn=txn)
            self._kv_db = env.open_db(b"kv", txn=txn)
            self.index = env.open_db(b"streams", txn=txn)

    def locate(self, table: bytes, key: bytes) -> tuple[lmdb._Database, bytes]:
        """Where format 1's entry `key` of table `table` (`events`, `meta`, `floors`, ...) lives
        in this store: its database and its key."""
        db = self.env.open_db(table if self.format_version == 1 else None, txn=self.txn)
        if self.format_version == 1:
            return db, key
        if table == b"events":
            return db, tree.event_key(int.from_bytes(key, "big"))
        prefixes = {b"meta": b"m", b"floors": tree.FLOORS, b"kv": tree.KV}
        return db, prefixes[table] + key

    def key(self, position: int) -> bytes:
        return event_key(position, self.format_version)

    def record(self, position: int) -> bytes | None:
        found = self.txn.get(self.key(position), db=self.events)
        return None if found is None else bytes(unpack(found))

    def stored(self, position: int) -> bytes | None:
        """The record at `position` as stored (packed, in format 3, where that paid)."""
        return self.txn.get(self.key(position), db=self.events)

    def put_record(self, position: int, record: bytes) -> bool:
        return self.txn.put(self.key(position), record, db=self.events)

    def delete_record(self, position: int) -> bool:
        return self.txn.delete(self.key(position), db=self.events)

    def _kv_key(self, key: bytes) -> bytes:
        if self.format_version == 4:
            return stored_key(key)
        return tree.KV + key if self.format_version >= 2 else key

    def kv(self) -> dict[bytes, bytes]:
        """Every projection entry (in format 4, cluster keys too, under their projection keys)."""
        if self.format_version == 1:
            return {bytes(k): bytes(v) for k, v in self.txn.cursor(db=self._kv_db)}
        out: dict[bytes, bytes] = {}
        for found, value in self.txn.cursor():
            key = bytes(found)
            if key[:1] == tree.KV:
                out[key[1:]] = bytes(value)
            elif key[:1] == tree.INDEX and self.format_version == 4:
                logical = logical_key(key)
                if logical is not None:
                    out[logical] = bytes(value)
        return out

    def kv_put(self, key: bytes, value: bytes) -> None:
        self.txn.put(self._kv_key(key), value, db=self._kv_db)

    def kv_delete(self, key: bytes) -> None:
        self.txn.delete(self._kv_key(key), db=self._kv_db)

    def set_index(self, stream: str, version: int, position: int) -> None:
        """Make the stream index map `stream` v`version` to `position` (adding the entry if the
        stream has no such version; format 2 then needs it to be the stream's next)."""
        if self.format_version == 1:
            key = stream_key(stream) + version.to_bytes(8, "big")
            self.txn.put(key, position.to_bytes(8, "big"), db=self.index)
            return
        key = tree.chunk_key(stream_key(stream), version)
        value = bytearray(self.txn.get(key) or b"")
        at = tree.slot(version)
        value[at : at + tree.POSITION_BYTES] = position.to_bytes(tree.POSITION_BYTES, "big")
        self.txn.put(key, bytes(value))

    def drop_index(self, stream: str, version: int) -> None:
        """Remove the index entry of `stream` v`version` (in format 2, later versions of its
        chunk move down one place, as if that entry had never been written)."""
        if self.format_version == 1:
            key = stream_key(stream) + version.to_bytes(8, "big")
            assert self.txn.delete(key, db=self.index)
            return
        key = tree.chunk_key(stream_key(stream), version)
        value = bytearray(self.txn.get(key) or b"")
        at = tree.slot(version)
        assert len(value) > at
        del value[at : at + tree.POSITION_BYTES]
        self.txn.put(key, bytes(value))


def noise(rng: random.Random, size: int) -> str:
    """`size` letters and digits drawn by `rng`: text that packs poorly (format 3 packs records),
    so a store built of it spans many pages."""
    return "".join(rng.choices(string.ascii_letters + string.digits, k=size))


@contextmanager
def raw_log(path: Path) -> Iterator[RawLog]:
    env = lmdb.open(str(path), subdir=True, max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            yield RawLog(env, txn)
    finally:
        env.close()


def tree_store_marked(path: Path, marker: bytes) -> bytes:
    """A one-tree store whose marker is `marker`, holding one projection entry besides; its data
    file's bytes (to check that opening it writes nothing)."""
    env = lmdb.open(str(path), subdir=True)
    try:
        with env.begin(write=True) as txn:
            txn.put(tree.MARKER_KEY, marker)
            txn.put(b"k?", b"state")
    finally:
        env.close()
    return (path / "data.mdb").read_bytes()
