"""LMDB format 4 (`sessionlog-log/4`): each stream's cluster keys (`eventlog.cluster_key`) stored
beside its index chunks, every answer the same as format 3's and the in-memory log's.

A hypothesis state machine drives a format-4 store and the in-memory log with the same appends
(streams past one index chunk, names that are prefixes of each other) and projection writes
(cluster keys with empty, NUL- and 0xff-led suffixes; plain keys around `@`), then compares every
scan, read and index answer; the other tests pin the layout, truncation, the region walk,
`kv_clear`, the marker, the refusals and the reserved chunk number.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import lmdb
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from eventlog import (
    ANY,
    CLUSTER_PREFIX,
    CorruptStoreError,
    EventLog,
    InvalidArgumentError,
    StorageError,
    StoreFormatError,
    cluster_key,
)
from eventlog import _lmdb as lmdb_backend
from eventlog import _lmdb_tree as tree
from eventlog._lmdb_base import LmdbTxnBase
from eventlog._storage import Buffer, StorageTxn, stream_key
from eventlog.events import Message, MessageInjected
from tests._raw_lmdb import tree_store_marked

STREAMS = ("a", "ab", "b", "ü")
SUFFIXES = (b"", b"\x00", b"\x00\xff", b"\xff", b"\xff\xff\xff\xff", b"x", b"x/1")
PLAIN = (b"?", b"?z", b"#", b"A", b"Az", b"i", b"k", b"\xff")
CLUSTERED = tuple(cluster_key(s, x) for s in STREAMS for x in SUFFIXES)
KEYS = PLAIN + CLUSTERED
BAD = (b"@", b"@\x00", b"@\x00x", b"@a", b"@abc\xff")
BOUNDS = (b"", b"#", b"@", b"@\x00", b"@a", b"@a\x00", b"@a\x00x", b"@a\x01", b"@ab", b"@b\x00")
BOUNDS_PAST = (b"@\xc3", b"A", b"Az", b"\xff\xff")
"""Bounds for scans: in and around the cluster keys, and past them."""
NAME_PREFIXES = ("", "a", "ab", "b", "c", "ü", "a\x01")
"""Prefixes of stream names, for `kv_cluster_values`."""
PREFIXES = (b"", b"@", b"@a", b"@a\x00", b"@ab\x00", b"@a\x00\xff", b"?", b"A", b"@\xc3\xbc\x00")


def message(k: int) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content=f"m{k}"))


def storage_txn(log: EventLog) -> StorageTxn:
    """A write transaction of the log's storage, under the log's API."""
    return log._storage.begin_write()


def index_size(log: EventLog) -> int:
    with log._storage.reader() as txn:
        return txn.index_size()


def raw_entries(path: Path) -> dict[bytes, bytes]:
    """Every entry of the store's one tree, read without the log's code."""
    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def scans(view: Any, prefix: bytes, start: bytes | None, stop: bytes | None) -> list[Any]:
    """The scan of `prefix` from `start` to `stop` in each direction, with limits."""
    return [
        view.kv_scan(prefix, start=start, stop=stop, reverse=reverse, limit=limit)
        for reverse in (False, True)
        for limit in (None, 0, 1, 3)
    ]


class Format4AgainstMemory(RuleBasedStateMachine):
    """The format-4 store and the in-memory log, fed the same operations."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="sessionlog-format4-"))
        self.lmdb = EventLog.open(self.directory / "log", sync=False)
        self.memory = EventLog.memory()
        self.k = 0

    def teardown(self) -> None:
        self.lmdb.close()
        self.memory.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def both(self, ops: list[tuple[str, Any]]) -> None:
        """Run `ops` in one transaction on each log, comparing the scans within it too."""
        for log in (self.lmdb, self.memory):
            with log.transaction() as tx:
                for op, argument in ops:
                    if op == "append":
                        stream, count = argument
                        events = [message(self.k + j) for j in range(count)]
                        tx.append(stream, events, expected_version=ANY)
                    elif op == "put":
                        tx.kv_put(*argument)
                    elif op == "put_many":
                        tx.kv_put_many(argument)
                    elif op == "delete":
                        tx.kv_delete(argument)
                    else:
                        tx.kv_clear()
        with self.lmdb.transaction() as mine, self.memory.transaction() as theirs:
            assert mine.kv_scan() == theirs.kv_scan()  # inside a write transaction as well
        self.k += 1

    @rule(stream=st.sampled_from(STREAMS), count=st.sampled_from([1, 2, 63, 64, 65, 130]))
    def append(self, stream: str, count: int) -> None:
        self.both([("append", (stream, count))])

    @rule(key=st.sampled_from(KEYS), value=st.binary(max_size=6))
    def put(self, key: bytes, value: bytes) -> None:
        self.both([("put", (key, value))])

    @rule(items=st.lists(st.tuples(st.sampled_from(KEYS), st.binary(max_size=4)), max_size=6))
    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        self.both([("put_many", items)])

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key: bytes) -> None:
        self.both([("delete", key)])

    @rule(
        stream=st.sampled_from(STREAMS),
        suffix=st.sampled_from(SUFFIXES),
        count=st.sampled_from([1, 64]),
        value=st.binary(max_size=4),
    )
    def append_and_project(self, stream: str, suffix: bytes, count: int, value: bytes) -> None:
        # The case format 4 is for: one commit appends to a stream and updates its keys.
        key = cluster_key(stream, suffix)
        self.both([("append", (stream, count)), ("put", (key, value)), ("delete", PLAIN[0])])

    @rule()
    def clear(self) -> None:
        self.both([("clear", None)])

    @rule(key=st.sampled_from(BAD), many=st.booleans())
    def refuse(self, key: bytes, many: bool) -> None:
        before = self.lmdb.head
        refused = pytest.raises(InvalidArgumentError, match="projection key")
        with refused, self.lmdb.transaction() as tx:
            tx.append("a", [message(0)], expected_version=ANY)
            if many:
                tx.kv_put_many([(CLUSTERED[0], b"x"), (key, b"x")])
            else:
                tx.kv_put(key, b"x")
        assert self.lmdb.head == before  # nothing of the transaction was kept
        with self.lmdb.view() as view:
            assert view.kv_get(key) is None

    @precondition(lambda self: self.memory.head > 0)
    @rule(share=st.floats(0, 1))
    def truncate(self, share: float) -> None:
        before = 1 + int(share * self.memory.head)
        # The same position; the hash differs, as the two logs stamp their own times.
        assert self.lmdb.truncate(before)[0] == self.memory.truncate(before)[0]

    @rule()
    def reopen(self) -> None:
        self.lmdb.close()
        self.lmdb = EventLog.open(self.directory / "log", sync=False)

    @rule(
        prefix=st.sampled_from(PREFIXES),
        start=st.none() | st.sampled_from(BOUNDS + BOUNDS_PAST),
        stop=st.none() | st.sampled_from(BOUNDS + BOUNDS_PAST),
    )
    def scan(self, prefix: bytes, start: bytes | None, stop: bytes | None) -> None:
        with self.lmdb.view() as mine, self.memory.view() as theirs:
            assert scans(mine, prefix, start, stop) == scans(theirs, prefix, start, stop)

    @rule(prefix=st.sampled_from(NAME_PREFIXES), suffix=st.sampled_from(SUFFIXES))
    def cluster_values(self, prefix: str, suffix: bytes) -> None:
        with self.lmdb.view() as mine, self.memory.view() as theirs:
            expected = [
                (key[1:].split(b"\x00", 1)[0].decode(), value)
                for key, value in theirs.kv_scan(CLUSTER_PREFIX + prefix.encode())
                if key.split(b"\x00", 1)[1] == suffix
            ]
            assert theirs.kv_cluster_values(prefix, suffix) == expected
            assert mine.kv_cluster_values(prefix, suffix) == expected

    @invariant()
    def same_projection_state(self) -> None:
        with self.lmdb.view() as mine, self.memory.view() as theirs:
            for key in KEYS + BAD:
                assert mine.kv_get(key) == theirs.kv_get(key)
            for prefix in PREFIXES:
                assert mine.kv_scan(prefix) == theirs.kv_scan(prefix)
                assert mine.kv_scan(prefix, reverse=True) == theirs.kv_scan(prefix, reverse=True)

    @invariant()
    def same_index(self) -> None:
        assert index_size(self.lmdb) == index_size(self.memory)
        for stream in STREAMS:
            assert self.lmdb.stream_version(stream) == self.memory.stream_version(stream)
            with self.memory.view() as view:
                after = view.stream_floor(stream)
            for log_after in {after, after + 63, after + 64}:
                mine = self.lmdb.read_stream(stream, after=log_after, limit=1000)
                theirs = self.memory.read_stream(stream, after=log_after, limit=1000)
                assert [(e.version, e.position) for e in mine] == [
                    (e.version, e.position) for e in theirs
                ]


TestFormat4AgainstMemory = Format4AgainstMemory.TestCase


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    with EventLog.open(tmp_path / "log", sync=False) as opened:
        yield opened


def test_cluster_key_is_the_stream_key_after_the_prefix() -> None:
    assert CLUSTER_PREFIX == b"@"
    assert cluster_key("s-1", b"/x") == b"@" + stream_key("s-1") + b"/x" == b"@s-1\x00/x"
    assert cluster_key("ü", b"") == b"@\xc3\xbc\x00"
    for stream in ("", "a\x00b"):
        with pytest.raises(InvalidArgumentError, match="cluster_key: expected a non-empty"):
            cluster_key(stream, b"")
    with pytest.raises(InvalidArgumentError, match="`suffix` must be bytes"):
        cluster_key("s", "x")  # type: ignore[arg-type]


def test_a_cluster_key_is_stored_after_its_streams_index_chunks(
    log: EventLog, tmp_path: Path
) -> None:
    with log.transaction() as tx:
        tx.append("a", [message(k) for k in range(130)], expected_version=ANY)
        tx.append("ab", [message(0)], expected_version=ANY)
        tx.kv_put(cluster_key("a", b""), b"empty")
        tx.kv_put(cluster_key("a", b"\x00"), b"nul")
        tx.kv_put(cluster_key("ab", b"x"), b"x")
        tx.kv_put(b"?", b"plain")
    log.close()
    entries = raw_entries(tmp_path / "log")
    index = [key for key in entries if key[:1] == tree.INDEX]
    mark = tree.CLUSTER_CHUNK
    assert index == [
        tree.chunk_key(b"a\x00", 1),
        tree.chunk_key(b"a\x00", 65),
        tree.chunk_key(b"a\x00", 129),
        b"ia\x00" + mark,
        b"ia\x00" + mark + b"\x00",
        tree.chunk_key(b"ab\x00", 1),
        b"iab\x00" + mark + b"x",
    ]
    assert entries[b"ia\x00" + mark] == b"empty"
    assert entries[b"k?"] == b"plain"
    assert not any(key.startswith(b"k@") for key in entries)
    assert entries[tree.MARKER_KEY] == b"sessionlog-log/4"
    with EventLog.open(tmp_path / "log") as reopened:  # and it reads back so
        assert reopened.stream_version("a") == 130
        assert [e.version for e in reopened.read_stream("a", after=120, limit=100)] == list(
            range(121, 131)
        )
        with reopened.view() as view:
            assert view.kv_scan(b"@a\x00") == [(b"@a\x00", b"empty"), (b"@a\x00\x00", b"nul")]
        assert reopened.verify().ok


@pytest.mark.parametrize("versions", [64, 128])
def test_a_full_last_chunk_is_not_read_past_into_the_cluster_keys(
    log: EventLog, versions: int
) -> None:
    # After a full chunk, the next key is the stream's first cluster key: an empty suffix makes
    # it exactly as long as an index key, and its value a whole number of positions.
    with log.transaction() as tx:
        positions = tx.append("s", [message(k) for k in range(versions)], expected_version=ANY)
        tx.kv_put(cluster_key("s", b""), bytes(range(12)))
    assert log.stream_version("s") == versions
    assert [e.position for e in log.read_stream("s", limit=1000)] == positions
    assert log.read_stream("s", after=versions, limit=10) == []
    assert index_size(log) == versions
    assert log.verify().ok


CHUNK_BYTES_FULL = tree.CHUNK_VERSIONS * tree.POSITION_BYTES // 12
"""Copies of 12 bytes that make a value as long as a full index chunk."""


def test_the_reserved_chunk_number_is_never_read_nor_written(log: EventLog) -> None:
    key = stream_key("s")
    with log.transaction() as tx:
        tx.kv_put(cluster_key("s", b""), bytes(range(12)) * CHUNK_BYTES_FULL)
    txn = storage_txn(log)
    try:
        assert txn.stream_position(key, tree.VERSIONS_MAX + 1) is None
        assert txn.stream_positions(key, tree.VERSIONS_MAX, 10) == []
        assert txn.stream_positions(key, tree.VERSIONS_MAX + 64, 10) == []
        for first, count in ((tree.VERSIONS_MAX + 1, 1), (tree.VERSIONS_MAX, 2)):
            with pytest.raises(StorageError, match="stream `s` is full: the stream index holds"):
                txn.put_records(1, [b"x"] * count, key, first)
        assert txn.stream_version(key) == 0
    finally:
        txn.abort()
    assert log.head == 0 and index_size(log) == 0


def test_truncation_drops_index_chunks_and_keeps_cluster_keys(
    log: EventLog, tmp_path: Path
) -> None:
    with log.transaction() as tx:
        tx.append("a", [message(k) for k in range(150)], expected_version=ANY)
        tx.append("b", [message(k) for k in range(10)], expected_version=ANY)
        for stream in ("a", "b"):
            tx.kv_put(cluster_key(stream, b""), b"0")
            tx.kv_put(cluster_key(stream, b"\xff"), b"1")
    log.truncate(before=100)  # "a" loses its first chunk and part of its second
    with log.transaction() as tx:
        tx.append("a", [message(150)], expected_version=150)
        tx.kv_put(cluster_key("a", b"x"), b"2")
    assert [e.version for e in log.read_stream("a", after=99, limit=9)] == list(range(100, 109))
    assert log.stream_version("a") == 151 and log.stream_version("b") == 10
    assert index_size(log) == 52 + 10
    log.truncate(before=log.head + 1)  # every event
    assert index_size(log) == 0 and log.stream_version("a") == 151
    with log.view() as view:
        assert [k for k, _ in view.kv_scan(b"@")] == [
            b"@a\x00",
            b"@a\x00x",
            b"@a\x00\xff",
            b"@b\x00",
            b"@b\x00\xff",
        ]
    assert log.verify().ok
    log.close()
    index = [k for k in raw_entries(tmp_path / "log") if k[:1] == tree.INDEX]
    assert len(index) == 5  # the cluster keys, and no index chunk
    assert all(k[k.find(b"\x00") + 1 :][:4] == tree.CLUSTER_CHUNK for k in index)


def test_the_region_walk_and_verify_pass_over_cluster_keys(log: EventLog) -> None:
    with log.transaction() as tx:
        tx.append("a", [message(k) for k in range(70)], expected_version=ANY)
        tx.kv_put_many([(cluster_key("a", bytes([k])), b"v" * 40) for k in range(200)])
        tx.kv_put(b"q", b"plain")
    assert log.walk_other_tables() is None
    with log._storage.reader() as txn:
        assert tree.walk_regions(cast(LmdbTxnBase, txn).raw) is None
    assert log.verify().ok
    assert log.verify(isolated=True).ok  # the child process's walk too


def test_kv_clear_deletes_cluster_keys_and_keeps_the_index(log: EventLog, tmp_path: Path) -> None:
    with log.transaction() as tx:
        for stream in ("a", "ab", "b"):
            tx.append(stream, [message(k) for k in range(65)], expected_version=ANY)
            tx.kv_put(cluster_key(stream, b""), b"x")
            tx.kv_put(cluster_key(stream, b"y"), b"y")
        tx.kv_put(b"?", b"1")
        tx.kv_put(b"B", b"2")
    with log.transaction() as tx:
        tx.kv_clear()
        assert tx.kv_scan() == []
        tx.kv_put(cluster_key("ab", b"after"), b"z")
    with log.view() as view:
        assert view.kv_scan() == [(b"@ab\x00after", b"z")]
    assert [log.stream_version(s) for s in ("a", "ab", "b")] == [65, 65, 65]
    assert index_size(log) == 3 * 65
    assert log.verify().ok
    log.close()
    entries = raw_entries(tmp_path / "log")
    assert sum(k[:1] == tree.INDEX for k in entries) == 3 * 2 + 1


@pytest.mark.parametrize("key", BAD)
def test_a_key_starting_with_at_that_is_not_a_cluster_key_is_refused(
    log: EventLog, key: bytes
) -> None:
    txn = storage_txn(log)
    try:
        batch: list[tuple[bytes, Buffer]] = [(b"plain", b"1"), (cluster_key("s", b""), b"2")]
        for write in ("put", "put_many", "delete"):
            with pytest.raises(InvalidArgumentError, match=re.escape(f"key {key!r}")) as caught:
                if write == "put":
                    txn.kv_put(key, b"x")
                elif write == "put_many":
                    txn.kv_put_many([*batch, (key, b"")])
                else:
                    txn.kv_delete(key)
            assert caught.value.got == key
        # Refused before any put: the good keys of the batch were not written either.
        assert txn.kv_get(b"plain") is None and txn.kv_get(cluster_key("s", b"")) is None
        assert txn.kv_get(key) is None
        assert txn.kv_scan(b"", None, False, None) == []
    finally:
        txn.abort()


def test_an_older_format_keeps_its_layout_and_takes_at_keys_as_they_are(tmp_path: Path) -> None:
    path = tmp_path / "log"
    EventLog.open(path, format_version=3).close()
    with EventLog.open(path) as log:  # asks for the default, 4: the store keeps 3
        with log.transaction() as tx:
            tx.append("a", [message(0)], expected_version=ANY)
            tx.kv_put(cluster_key("a", b"x"), b"1")
            tx.kv_put(b"@", b"2")  # an ordinary key there
        with log.view() as view:
            assert view.kv_scan() == [(b"@", b"2"), (b"@a\x00x", b"1")]
    entries = raw_entries(path)
    assert entries[tree.MARKER_KEY] == b"sessionlog-log/3"
    assert entries[b"k@a\x00x"] == b"1" and entries[b"k@"] == b"2"
    assert [k for k in entries if k[:1] == tree.INDEX] == [tree.chunk_key(b"a\x00", 1)]


def test_a_new_store_is_format_4(tmp_path: Path) -> None:
    EventLog.open(tmp_path / "log").close()
    assert raw_entries(tmp_path / "log")[tree.MARKER_KEY] == b"sessionlog-log/4"


@pytest.mark.parametrize("readonly", [False, True])
def test_an_unknown_marker_is_refused_and_nothing_is_written(
    tmp_path: Path, readonly: bool
) -> None:
    path = tmp_path / "log"
    before = tree_store_marked(path, b"sessionlog-log/9")
    with pytest.raises(StoreFormatError, match=r"has format b'sessionlog-log/9', written by a "):
        EventLog.open(path, readonly=readonly)
    assert (path / "data.mdb").read_bytes() == before
    other = tmp_path / "other"
    before = tree_store_marked(other, b"sessionlog-log/09")  # not a format number we write
    with pytest.raises(CorruptStoreError, match=r"has format b'sessionlog-log/09'; this version "):
        EventLog.open(other, readonly=readonly)
    assert (other / "data.mdb").read_bytes() == before


def test_code_that_reads_no_format_4_refuses_a_format_4_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The code before format 4 knew formats 1 to 3 only, in these two tables.
    path = tmp_path / "log"
    EventLog.open(path).close()
    before = (path / "data.mdb").read_bytes()
    older = {k: v for k, v in lmdb_backend.TREE_TXN_TYPES.items() if k != b"sessionlog-log/4"}
    monkeypatch.setattr(lmdb_backend, "TREE_TXN_TYPES", older)
    monkeypatch.setattr(lmdb_backend, "FORMATS", {k: lmdb_backend.FORMATS[k] for k in (1, 2, 3)})
    monkeypatch.setattr(lmdb_backend, "FORMAT", b"sessionlog-log/3")
    with pytest.raises(
        StoreFormatError, match="has format b'sessionlog-log/4', written by a newer"
    ):
        EventLog.open(path, format_version=3)
    assert (path / "data.mdb").read_bytes() == before
