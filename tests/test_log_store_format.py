"""The LMDB layouts are frozen: a store laid out as `tests/fixtures/log-store-v1.jsonl` (format 1,
five named databases), `log-store-v2.jsonl` (format 2, one tree) or the v3 and v4 fixtures (records
packed; format 4 with a cluster key beside its stream's index) opens, reads, verifies and keeps
appending in its own format; a new store is laid out exactly as the fixture of its format; and
`export_log` + `import_log` move a log between the formats with the same records and chain."""

from __future__ import annotations

import json
from pathlib import Path

import lmdb
import pytest

from eventlog import ANY, EventLog, InvalidArgumentError, Transaction
from eventlog import _lmdb_tree as tree
from eventlog._packing import PACKED_PREFIX, pack, unpack
from eventlog.events import Message, MessageInjected
from replay import export_log, import_log
from sessions import SessionStore
from tests._format_samples import SAMPLES, STORE_CLUSTER_KV, STORE_KV, T0, build_store_lines

FIXTURES = Path(__file__).parent / "fixtures"
MARKERS = {
    1: b"sessionlog-log/1",
    2: b"sessionlog-log/2",
    3: b"sessionlog-log/3",
    4: b"sessionlog-log/4",
}


def fixture_lines(format_version: int) -> list[str]:
    return (FIXTURES / f"log-store-v{format_version}.jsonl").read_text().splitlines()


def marker_of(path: Path) -> bytes | None:
    """The format marker as stored, read without the log's code."""
    env = lmdb.open(str(path), readonly=True, max_dbs=8, lock=False)
    try:
        with env.begin() as txn:
            found = txn.get(tree.MARKER_KEY)
            if found is None:
                found = txn.get(b"format", db=env.open_db(b"meta", txn=txn, create=False))
            return found
    finally:
        env.close()


def restore(path: Path, format_version: int) -> None:
    """A store whose LMDB entries are exactly the fixture's, written with plain `lmdb` puts."""
    path.mkdir()
    env = lmdb.open(str(path), max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            for line in fixture_lines(format_version):
                entry = json.loads(line)
                db = env.open_db(entry["db"].encode(), txn=txn) if entry["db"] else None
                txn.put(bytes.fromhex(entry["key"]), bytes.fromhex(entry["value"]), db=db)
    finally:
        env.close()


@pytest.mark.parametrize("format_version", [1, 2])
def test_a_new_store_is_laid_out_as_its_fixture(format_version: int) -> None:
    assert build_store_lines(format_version) == fixture_lines(format_version)


def test_format_3_is_format_2_with_records_packed() -> None:
    # Packed bytes depend on the zstd library's version, so format 3 is held to format 2's
    # fixture entry by entry, each record unpacked, rather than to bytes of its own.
    v2 = [json.loads(line) for line in fixture_lines(2)]
    v3 = [json.loads(line) for line in build_store_lines(3)]
    assert [entry["key"] for entry in v3] == [entry["key"] for entry in v2]
    for old, new in zip(v2, v3, strict=True):
        value = bytes.fromhex(new["value"])
        if old["key"] == tree.MARKER_KEY.hex():
            assert value == MARKERS[3]
            continue
        assert bytes(unpack(value)).hex() == old["value"]
        # Every record is packed exactly when packing pays (the fixture's are all short).
        record = bytes.fromhex(old["value"])
        assert value.startswith(PACKED_PREFIX) == (pack(record) is not record)


def test_format_4_is_format_3_with_the_cluster_key_beside_its_stream() -> None:
    # Built in one process (one zstd), format 4's entries are format 3's, but for the marker and
    # the cluster key, stored after stream `s-1`'s index chunk; its fixture keeps those keys.
    v3 = [json.loads(line) for line in build_store_lines(3)]
    v4 = [json.loads(line) for line in build_store_lines(4)]
    cluster = (tree.INDEX + b"s-1\x00" + tree.CLUSTER_CHUNK + b"/state").hex()
    assert cluster == (tree.chunk_key(b"s-1\x00", 1)[:-4] + b"\xff" * 4 + b"/state").hex()
    assert [entry["key"] for entry in v4] == [entry["key"] for entry in fixture_lines_json(4)]
    at = [entry["key"] for entry in v4].index(cluster)
    assert v4[at - 1]["key"] == tree.chunk_key(b"s-1\x00", 1).hex()  # right after its index
    assert v4[at]["value"] == STORE_CLUSTER_KV[1].hex()
    del v4[at]
    assert [entry["key"] for entry in v4] == [entry["key"] for entry in v3]
    for old, new in zip(v3, v4, strict=True):
        if old["key"] == tree.MARKER_KEY.hex():
            assert bytes.fromhex(new["value"]) == MARKERS[4]
        else:
            assert new == old


def fixture_lines_json(format_version: int) -> list[dict[str, str]]:
    return [json.loads(line) for line in fixture_lines(format_version)]


@pytest.mark.parametrize("format_version", [1, 2, 3, 4])
def test_a_store_of_either_format_reads_verifies_and_keeps_its_format(
    format_version: int, tmp_path: Path
) -> None:
    path = tmp_path / "store"
    restore(path, format_version)
    with EventLog.open(path) as log:  # asks nothing: the store says which format it is
        assert log.verify().ok
        assert log.head == len(SAMPLES)
        events = log.read(limit=len(SAMPLES))
        assert [(e.stream, e.data) for e in events] == SAMPLES
        assert all(e.recorded_at == T0 for e in events)
        for stream in {stream for stream, _ in SAMPLES}:
            mine = [event for name, event in SAMPLES if name == stream]
            assert [e.data for e in log.read_stream(stream, limit=100)] == mine
        with log.view() as view:
            assert view.kv_get(STORE_KV[0]) == STORE_KV[1]
            if format_version >= 4:
                assert view.kv_get(STORE_CLUSTER_KV[0]) == STORE_CLUSTER_KV[1]
                assert view.kv_scan() == sorted([STORE_KV, STORE_CLUSTER_KV])
        later = MessageInjected(message=Message(role="user", content="later"))
        log.append("s-1", [later], expected_version=ANY)
    other = 2 if format_version == 1 else 1
    with EventLog.open(path, format_version=other) as log:  # an existing store keeps its own
        assert log.verify().ok
        assert log.read_stream("s-1", after=0, limit=100)[-1].data == later
    assert marker_of(path) == MARKERS[format_version]


@pytest.mark.parametrize(
    ("source", "target"), [(1, 2), (2, 1), (2, 3), (3, 1), (3, 2), (3, 4), (4, 3), (4, 1), (1, 4)]
)
def test_import_log_moves_a_log_between_formats(source: int, target: int, tmp_path: Path) -> None:
    from_path, to_path, export = tmp_path / "from", tmp_path / "to", tmp_path / "log.jsonl"
    EventLog.open(from_path, format_version=source).close()
    EventLog.open(to_path, format_version=target).close()
    with SessionStore.open(from_path) as store:
        sid = store.open_session("s")
        store.inject_many(sid, [{"role": "user", "content": f"m{k}"} for k in range(150)])
        store.fork_at(sid, keep_first=70, destination_id="child")
        export_log(store, export)
        records = [raw for _, raw in store.log.read_records(limit=1000)]
        expected = store.snapshot("child")
        stream = store.log.read_stream(sid, limit=1000)
    with SessionStore.open(to_path) as store:
        import_log(store, export)
        assert [raw for _, raw in store.log.read_records(limit=1000)] == records
        assert store.snapshot("child") == expected
        assert store.log.verify().ok
        assert store.log.read_stream(sid, limit=1000) == stream
    assert marker_of(from_path) == MARKERS[source]
    assert marker_of(to_path) == MARKERS[target]


@pytest.mark.parametrize("asked", [5, 0, True, 4.0, "4"])
def test_an_unknown_format_version_is_refused_before_anything_is_created(
    tmp_path: Path, asked: object
) -> None:
    # True and 4.0 hash like 1 and 4: only an int names a format (True once made a format-1 store).
    with pytest.raises(InvalidArgumentError, match="format_version: expected one of"):
        EventLog.open(tmp_path / "store", format_version=asked)  # type: ignore[arg-type]
    assert not (tmp_path / "store" / "data.mdb").exists()


def test_a_stream_longer_than_one_index_chunk_reads_by_version(tmp_path: Path) -> None:
    # Format 2 keeps 64 versions of a stream per index entry: reads and appends must cross the
    # boundaries wherever they fall, in single appends and in runs spanning several chunks.
    messages = [MessageInjected(message=Message(role="user", content=f"m{k}")) for k in range(300)]
    with EventLog.open(tmp_path / "store") as log:
        log.append("a", messages[:63], expected_version=ANY)
        for message in messages[63:66]:
            log.append("a", [message], expected_version=ANY)
            log.append("b", [message], expected_version=ANY)
        log.append("a", messages[66:], expected_version=ANY)
        assert log.stream_version("a") == 300
        assert log.stream_version("b") == 3
        assert [e.data for e in log.read_stream("a", limit=1000)] == messages
        for after in (0, 62, 63, 64, 127, 128, 200, 299, 300):
            page = log.read_stream("a", after=after, limit=70)
            assert [e.version for e in page] == list(range(after + 1, min(after + 70, 300) + 1))
        assert log.verify().ok


@pytest.mark.parametrize("format_version", [1, 2, 3, 4])
def test_appends_after_a_truncation_continue_each_stream(
    format_version: int, tmp_path: Path
) -> None:
    # Stream `a` loses versions 1 to 70 (format 2: its first index chunk goes, the second keeps
    # zeroed slots); stream `b` loses all 10 of its versions, half a chunk.
    def message(k: int) -> MessageInjected:
        return MessageInjected(message=Message(role="user", content=f"m{k}"))

    with EventLog.open(tmp_path / "store", format_version=format_version) as log:
        log.append("b", [message(k) for k in range(10)], expected_version=ANY)
        log.append("a", [message(k) for k in range(100)], expected_version=ANY)
        log.truncate(before=10 + 70 + 1)
        log.append("b", [message(10)], expected_version=10)
        log.append("a", [message(100)], expected_version=100)
        assert [e.version for e in log.read_stream("b", after=10)] == [11]
        assert [e.version for e in log.read_stream("a", after=70, limit=100)] == list(
            range(71, 102)
        )
        assert log.verify().ok
    with EventLog.open(tmp_path / "store") as log:
        assert (log.stream_version("a"), log.stream_version("b")) == (101, 11)
        assert log.verify().ok


def index_chunks(path: Path) -> dict[bytes, bytes]:
    """Every format-2 stream index entry, read without the log's code."""
    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            cursor = txn.cursor()
            cursor.set_range(tree.INDEX)
            return {bytes(k): bytes(v) for k, v in cursor.iternext() if bytes(k[:1]) == tree.INDEX}
    finally:
        env.close()


def test_one_transaction_with_savepoints_indexes_each_stream_as_separate_commits(
    tmp_path: Path,
) -> None:
    # Within a transaction format 2 remembers each stream's last index chunk instead of reading
    # it back, and puts it once, before anything reads the index: a savepoint that commits hands
    # its chunks to the enclosing block, one that rolls back leaves the enclosing block's as they
    # were, and a truncation forgets them.
    def message(k: int) -> MessageInjected:
        return MessageInjected(message=Message(role="user", content=f"m{k}"))

    def append(tx: Transaction, stream: str, count: int = 1) -> list[int]:
        return tx.append(stream, [message(k) for k in range(count)], expected_version=ANY)

    a: list[int] = []  # positions of stream "a" by version, and of "b" and "c"
    b: list[int] = []
    c: list[int] = []
    with EventLog.open(tmp_path / "store") as log, log.transaction() as tx:
        a += append(tx, "a", 60)
        with log.transaction() as inner:  # commits
            a += append(inner, "a", 2)
            b += append(inner, "b")
        with pytest.raises(RuntimeError), log.transaction() as inner:  # rolls back
            append(inner, "a")
            append(inner, "b")
            raise RuntimeError("undo this block")
        for _ in range(3):  # "a" crosses into its second chunk
            a += append(tx, "a")
            b += append(tx, "b")
        assert (tx.stream_version("a"), tx.stream_version("b")) == (65, 4)
        tx.truncate(before=a[64])  # "a" keeps its versions from 65, "b" from 4
        c += append(tx, "c", 2)
        with log.transaction() as inner:  # commits
            c += append(inner, "c")
        a += append(tx, "a")
        b += append(tx, "b")
        assert [e.position for e in tx.read_stream("a", after=64)] == a[64:]
        assert [e.position for e in tx.read_stream("b", after=3)] == b[3:]
    six = tree.POSITION_BYTES
    chunks = index_chunks(tmp_path / "store")
    assert chunks == {
        tree.chunk_key(b"a\x00", 65): b"".join(p.to_bytes(six, "big") for p in a[64:]),
        tree.chunk_key(b"b\x00", 1): bytes(3 * six)
        + b"".join(p.to_bytes(six, "big") for p in b[3:]),
        tree.chunk_key(b"c\x00", 1): b"".join(p.to_bytes(six, "big") for p in c),
    }
    with EventLog.open(tmp_path / "store") as log:
        assert (log.stream_version("a"), log.stream_version("b")) == (66, 5)
        assert [(e.version, e.position) for e in log.read_stream("a", after=64)] == [
            (65, a[64]),
            (66, a[65]),
        ]
        assert [e.position for e in log.read_stream("b", after=3)] == b[3:]
        assert log.verify().ok
