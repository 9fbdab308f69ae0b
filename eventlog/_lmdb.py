"""The LMDB backend: one environment per store directory, durable commits, two layouts.

Format 4 (`sessionlog-log/4`, what a new store gets) keeps everything in one B-tree, whose keys
are `eventlog/_lmdb_tree.py`'s, packs records where that pays (`eventlog/_packing.py`), and
stores each stream's projection keys beside its index (`eventlog/_lmdb_cluster.py`); format 3
(`sessionlog-log/3`) is the same tree with every projection key under `k`, and format 2
(`sessionlog-log/2`) is format 3 with every record as it is. Format 1
(`sessionlog-log/1`, stores written before format 2) keeps five
named databases: `events` maps an 8-byte big-endian position to a record; `streams` maps a stream
prefix and an 8-byte version to a position; `kv` holds projection state; `idempotency` the keys of
appends; `meta` the format marker and the anchor of a truncated log; `floors` the last truncated
version of each stream. A store keeps the format it was created with. This module owns
every `lmdb` call of the store's life; it must never hold a read transaction longer than one call,
because long readers pin pages and make the file grow.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import lmdb

from eventlog import _lmdb_tree as tree
from eventlog._disk import NEW_STORE_BYTES_MIN, free_bytes, full, prepare_files
from eventlog._gate import Gate
from eventlog._lease import Lease, file_lease
from eventlog._lmdb_base import ENTRY_OVERHEAD_BYTES, LmdbTxnBase
from eventlog._lmdb_cluster import FORMAT_4, ClusteredTreeTxn
from eventlog._lmdb_errors import errno_of, open_failure, reads, translate, translate_read
from eventlog._storage import Buffer, StorageTxn
from eventlog.errors import (
    CorruptStoreError,
    InvalidArgumentError,
    LogClosedError,
    SessionLogError,
    StorageError,
    StoreFormatError,
)

FORMAT_1 = b"sessionlog-log/1"
FORMAT = FORMAT_4
"""The format a new store is created with."""
FORMATS = {1: FORMAT_1, 2: tree.FORMAT, 3: tree.FORMAT_3, 4: FORMAT_4}
_MARKER_STEM = b"sessionlog-log/"


def _newer(marker: bytes) -> bool:
    """Whether `marker` names a format of this store past every one this version reads."""
    number = marker.removeprefix(_MARKER_STEM)
    return (
        number != marker
        and number.isdigit()
        and number[:1] != b"0"
        and len(number) <= 9
        and int(number) > max(FORMATS)
    )


TREE_TXN_TYPES: dict[bytes, type[tree.TreeTxn]] = {
    tree.FORMAT: tree.TreeTxn,
    tree.FORMAT_3: tree.PackedTreeTxn,
    FORMAT_4: ClusteredTreeTxn,
}
"""The transaction type of each format laid out as one tree."""


class LmdbStorage:
    outcome_may_be_unknown = False  # a commit is on disk when it returns, or wrote nothing

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        map_size: int,
        sync: bool,
        readonly: bool,
        headroom_bytes: int,
        format_version: int = 4,
    ) -> None:
        if type(format_version) is not int or format_version not in FORMATS:
            raise InvalidArgumentError(
                f"format_version: expected one of {sorted(FORMATS)}, got {format_version!r}"
            )
        self.path = Path(path)
        self.format = FORMATS[format_version]
        self._txn_type: type[LmdbTxnBase] = _LmdbTxn
        self.headroom_bytes = headroom_bytes
        self.grow_before_next_write = False
        # Bytes put by the current write transaction, and by the last one that ran out of map, so
        # the growth after a MapFullError makes room for that transaction when it is retried.
        self.write_bytes = 0
        self.failed_write_bytes = 0
        self._gate = Gate()
        self._closed = False
        data_file = self.path / "data.mdb"
        if not readonly:
            prepare_files(self.path)
        try:
            self.env = lmdb.open(
                str(self.path),
                map_size=map_size,
                subdir=True,
                readonly=readonly,
                sync=sync,
                metasync=sync,
                writemap=False,
                max_dbs=8,
                create=not readonly,
            )
        except lmdb.Error as exc:
            raise open_failure(exc, self.path, readonly) from exc
        try:
            self.page_bytes: int = self.env.stat()["psize"]  # fixed when the file was made
            self._check_size(data_file)
            self.env.reader_check()
            self._open_dbs(readonly)
        except lmdb.Error as exc:
            self.env.close()
            raise translate(exc, f"opening `{self.path}`") from exc
        except BaseException:
            self.env.close()
            raise

    def _check_size(self, data_file: Path) -> None:
        # Mapping pages past the end of a truncated file would crash the process (SIGBUS) on the
        # first read; refuse such a file before anything touches those pages.
        info = self.env.info()
        needed = (info["last_pgno"] + 1) * self.page_bytes
        actual = data_file.stat().st_size
        if actual < needed:
            raise CorruptStoreError(
                f"`{data_file}` is truncated: {actual} bytes, but its pages need {needed}"
            )

    def _open_dbs(self, readonly: bool) -> None:
        try:
            with self.env.begin(write=False) as txn:
                # An environment holding nothing is a log that never held anything: its creator
                # was killed between LMDB creating the file and the write below, or is another
                # process opening the same new path right now. Anything else needs our marker.
                blank = not txn.cursor().first()
                marker = txn.get(tree.MARKER_KEY)
            if blank and not readonly:
                blank, marker = False, self._claim()
            if marker is not None:
                self._open_tree(bytes(marker))
            else:
                self._open_named(readonly, blank)
        except lmdb.Error as exc:  # reads of the main table: a damaged page here is damage
            raise translate_read(exc, f"opening `{self.path}`") from exc

    def _claim(self) -> bytes | None:
        """Lay out a store found blank, under LMDB's write lock: another process may be making
        it at this moment, in a format of its own, and whatever was written first stands (a
        format-1 store and a tree in one file would be neither). Returns its tree marker, if it
        is a tree."""
        with self.env.begin(write=True) as txn:
            if txn.cursor().first():  # made meanwhile
                found = txn.get(tree.MARKER_KEY)
                return None if found is None else bytes(found)
            if self.format in TREE_TXN_TYPES:
                txn.put(tree.MARKER_KEY, self.format)
                return self.format
            meta = self.env.open_db(b"meta", txn=txn)
            txn.put(b"format", FORMAT_1, db=meta)
        return None

    def _open_tree(self, marker: bytes) -> None:
        """Formats 2 to 4: every entry in the main database."""
        if marker not in TREE_TXN_TYPES:
            self._check_format(marker, tree.FORMAT)  # raises, naming the formats read here
        self.format = marker
        self._txn_type = TREE_TXN_TYPES[marker]
        # Every table is the main database: the one tree.
        self.events = self.kv = self.meta = self.env.open_db(None)
        self.floors: lmdb._Database | None = self.events
        self.idempotency: lmdb._Database | None = self.events

    def _open_named(self, readonly: bool, blank: bool) -> None:
        """Format 1: five named databases."""
        with self.env.begin(write=False) as txn:
            names = set(self.env.dbs(txn))
        if not blank and b"meta" not in names:
            raise CorruptStoreError(f"`{self.path}` is an LMDB store but not a sessionlog log")
        self.format = FORMAT_1
        if readonly:
            self.meta = self.env.open_db(b"meta", create=False)
            with self.env.begin(write=False) as txn:
                self._check_format(txn.get(b"format", db=self.meta), FORMAT_1)
            self.events = self.env.open_db(b"events", create=False)
            self.streams = self.env.open_db(b"streams", create=False)
            self.kv = self.env.open_db(b"kv", create=False)
            # Stores written before keys were kept have no such table: nothing was appended
            # with a key there, and a read-only store appends nothing.
            self.idempotency = (
                self.env.open_db(b"idempotency", create=False) if b"idempotency" in names else None
            )
            # Only a truncation creates it: a store never truncated has no floors.
            self.floors = self.env.open_db(b"floors", create=False) if b"floors" in names else None
            return
        with self.env.begin(write=True) as txn:
            self.events = self.env.open_db(b"events", txn=txn)
            self.streams = self.env.open_db(b"streams", txn=txn)
            self.kv = self.env.open_db(b"kv", txn=txn)
            self.idempotency = self.env.open_db(b"idempotency", txn=txn)
            self.meta = self.env.open_db(b"meta", txn=txn)
            self.floors = self.env.open_db(b"floors", txn=txn)
            # A new store got its marker when it was claimed (`_claim`). Raised before the
            # commit: a refused store is left exactly as it was.
            self._check_format(txn.get(b"format", db=self.meta), FORMAT_1)

    def _check_format(self, marker: bytes | memoryview | None, expected: bytes) -> None:
        found = None if marker is None else bytes(marker)
        if found is not None and _newer(found):
            raise StoreFormatError(
                f"`{self.path}` has format {found!r}, written by a newer version of sessionlog; "
                f"this version reads {b' and '.join(FORMATS.values())!r}",
                expected=list(FORMATS.values()),
                got=found,
            )
        if found != expected:
            raise CorruptStoreError(
                f"`{self.path}` has format {found!r}; this version reads "
                f"{b' and '.join(FORMATS.values())!r}"
            )

    @contextmanager
    def reader(self) -> Iterator[StorageTxn]:
        txn = self._begin(write=False)
        try:
            yield self._txn_type(self, txn, write=False, counted=False)
        except lmdb.Error as exc:  # a damaged page met by the caller's reads, in whatever call
            raise translate_read(exc, f"reading `{self.path}`") from exc
        finally:
            txn.abort()
            self._gate.leave()

    def begin_write(self) -> StorageTxn:
        self._ensure_room()
        self.write_bytes = 0
        return self._txn_type(self, self._begin(write=True), write=True, counted=True)

    def _begin(self, *, write: bool) -> lmdb.Transaction[memoryview]:
        self._check_open()
        for _attempt in range(3):
            self._gate.enter()
            try:
                return self.env.begin(write=write, buffers=True)
            except lmdb.MapResizedError:
                # Another process grew the map past ours: adopt its size and try again.
                self._gate.leave()
                self._gate.exclusive(lambda: self.env.set_mapsize(0))
            except lmdb.Error as exc:
                self._gate.leave()
                raise translate(exc, "beginning a transaction") from exc
        raise StorageError("beginning a transaction: the map kept being resized by other writers")

    def _ensure_room(self) -> None:
        """Grow the map before a write transaction so at least `headroom_bytes` are free."""
        info = self.env.info()
        used = (info["last_pgno"] + 1) * self.page_bytes
        free = info["map_size"] - used
        if free >= self.headroom_bytes and not self.grow_before_next_write:
            return
        room = self.headroom_bytes + self.failed_write_bytes
        target = max(info["map_size"] * 2, used + 2 * room)
        try:
            self._gate.exclusive(lambda: self.env.set_mapsize(target))
        except lmdb.Error as exc:
            raise translate(exc, f"growing the map of `{self.path}` to {target:,} bytes") from exc
        self.grow_before_next_write = False
        self.failed_write_bytes = 0

    def write_failure(self, exc: lmdb.Error, doing: str) -> SessionLogError:
        """`translate` for a failed write or commit, which may be the disk filling up: LMDB says
        ENOSPC, or EIO when a write came back short, as writes on a full disk do."""
        free = free_bytes(self.path)
        low = free < NEW_STORE_BYTES_MIN + 2 * self.write_bytes
        if isinstance(exc, lmdb.DiskError) or (errno_of(exc) == errno.EIO and low):
            return full(doing, self.path, free)
        return translate(exc, doing)

    def note_failure(self, exc: lmdb.Error) -> None:
        """After MapFullError, grow the map before the next write by enough for this one."""
        if isinstance(exc, lmdb.MapFullError):
            self.grow_before_next_write = True
            self.failed_write_bytes = max(self.failed_write_bytes, self.write_bytes)

    def walk_other_tables(self) -> str | None:
        """Read every entry of the projection, idempotency and meta tables, so a damaged page
        there is met by whoever runs this (a verify walk in a child process); the first problem,
        or None."""
        if issubclass(self._txn_type, tree.TreeTxn):
            with self.reader() as reader:
                return tree.walk_regions(cast(LmdbTxnBase, reader).raw)
        tables = [("projection state", self.kv), ("meta", self.meta)]
        if self.floors is not None:
            tables.append(("stream floors", self.floors))
        if self.idempotency is not None:
            tables.append(("idempotency keys", self.idempotency))
        with self.reader() as reader:
            txn = cast(_LmdbTxn, reader).raw
            for name, table in tables:
                try:
                    for key, value in txn.cursor(table):
                        if table is self.idempotency and len(value) <= 16:
                            return f"the {name} table holds a damaged entry under {bytes(key)!r}"
                except lmdb.Error as exc:
                    return f"the {name} table is damaged: {exc}"
        return None

    def map_size(self) -> int:
        return int(self.env.info()["map_size"])

    def size_bytes(self) -> int:
        return (self.path / "data.mdb").stat().st_size

    def wait_for_commit(self, timeout_s: float) -> None:
        time.sleep(timeout_s)  # no wake-up across processes here: followers poll

    def lease(self, name: str) -> Lease:
        self._check_open()
        return file_lease(self.path, name, f"lmdb:{self.path}")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.env.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"the log at `{self.path}` is closed")


class _LmdbTxn(LmdbTxnBase):
    """A transaction over a format-1 store: events, index, state and keys in their own tables."""

    __slots__ = ()

    def truncate(
        self, before: int, anchor_hash: bytes, dropped: Sequence[tuple[bytes, int]]
    ) -> None:
        store, txn = self._store, self._txn
        if store.floors is None:
            raise StorageError(f"`{store.path}` is open read-only")
        floors: dict[bytes, int] = {}
        try:
            for key, version in dropped:
                txn.delete(key + version.to_bytes(8, "big"), db=store.streams)
                floors[key] = version
            self._truncate_events(before, anchor_hash, floors)
        except lmdb.Error as exc:
            store.note_failure(exc)
            raise store.write_failure(exc, "truncating the log") from exc

    @reads
    def stream_version(self, key: bytes) -> int:
        cursor = self._txn.cursor(self._store.streams)
        found = cursor.prev() if cursor.set_range(key + b"\xff" * 8) else cursor.last()
        if not found:
            return self.stream_floor(key)
        last = cursor.key()
        if len(last) != len(key) + 8 or last[: len(key)] != key:
            return self.stream_floor(key)
        return int.from_bytes(last[len(key) :], "big")

    @reads
    def stream_positions(self, key: bytes, after_version: int, limit: int) -> list[int]:
        cursor = self._txn.cursor(self._store.streams)
        positions: list[int] = []
        if not cursor.set_range(key + (after_version + 1).to_bytes(8, "big")):
            return positions
        for index_key, value in cursor.iternext():
            if len(positions) >= limit or index_key[: len(key)] != key:
                break
            positions.append(int.from_bytes(value, "big"))
        return positions

    @reads
    def stream_position(self, key: bytes, version: int) -> int | None:
        value = self._txn.get(key + version.to_bytes(8, "big"), db=self._store.streams)
        return None if value is None else int.from_bytes(value, "big")

    @reads
    def index_size(self) -> int:
        return int(self._txn.stat(self._store.streams)["entries"])

    def put_records(
        self, first_position: int, records: Sequence[Buffer], key: bytes, first_version: int
    ) -> None:
        # Two entries per record: the event (8-byte key) and its index entry (stream key, 8+8).
        self._store.write_bytes += sum(map(len, records)) + len(records) * (
            len(key) + 24 + 2 * ENTRY_OVERHEAD_BYTES
        )
        if len(records) == 1:  # the common append: two puts, no cursors or lists to build
            self._put_one(first_position.to_bytes(8, "big"), records[0], key, first_version)
            return
        try:
            positions = [
                p.to_bytes(8, "big") for p in range(first_position, first_position + len(records))
            ]
            items = list(zip(positions, records, strict=True))
            events = self._txn.cursor(self._store.events)
            _, added = events.putmulti(items, append=True, overwrite=False)
            entries = [
                (key + version.to_bytes(8, "big"), position)
                for version, position in enumerate(positions, first_version)
            ]
            index = self._txn.cursor(self._store.streams)
            _, indexed = index.putmulti(entries, overwrite=False)
        except lmdb.Error as exc:
            self._store.note_failure(exc)
            raise self._store.write_failure(exc, "writing events") from exc
        if added != len(items) or indexed != len(entries):
            raise AssertionError("a position or stream version was already taken")

    def _put_one(self, position: bytes, record: Buffer, key: bytes, version: int) -> None:
        txn, store = self._txn, self._store
        try:
            # put(key, value, dupdata, overwrite, append, db): positional, as py-lmdb parses
            # keywords at a cost that shows on the path of every append.
            added = txn.put(position, record, True, False, True, store.events)
            entry = key + version.to_bytes(8, "big")
            indexed = txn.put(entry, position, True, False, False, store.streams)
        except lmdb.Error as exc:
            store.note_failure(exc)
            raise store.write_failure(exc, "writing events") from exc
        if not (added and indexed):
            raise AssertionError("a position or stream version was already taken")

    def kv_clear(self) -> None:
        # mdb_drop(del=0): frees the tree's pages without visiting each key.
        try:
            self._txn.drop(self._store.kv, delete=False)
        except lmdb.Error as exc:
            raise translate(exc, "clearing projection state") from exc
