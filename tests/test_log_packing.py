"""Format 3 packs records where that pays (`eventlog/_packing.py`): what a reader gets, what the
chain covers and what an export carries are the records as they are; a packed record whose bytes
were changed is refused at its position like any damaged record; a format-2 store is never
given a packed record."""

from __future__ import annotations

import os
import random
import string
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import blake3
import msgspec
import pytest
import zstandard

from eventlog import ANY, Envelope, EventLog, IntegrityError, _chain, limits
from eventlog._codec import BODY_START, GENESIS_HASH, HASH_START, RECORD_PREFIX
from eventlog._lmdb import LmdbStorage
from eventlog._packing import PACK_MIN_BYTES, PACKED_PREFIX, pack, unpack, unpacker
from eventlog.events import Message, MessageInjected
from sessions import SessionStore
from tests._format_samples import T0
from tests._raw_lmdb import raw_log


def injected(content: str) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content=content))


def prose(seed: int, words: int) -> str:
    rng = random.Random(seed)
    vocabulary = ["the", "session", "tool", "call", "result", "model", "reply", "file", "line"]
    return " ".join(rng.choice(vocabulary) for _ in range(words))


def build(path: Path, format_version: int = 3) -> list[bytes]:
    """Three events: a short one, a long compressible one, a long one of random letters;
    returns their records as read back."""
    with EventLog.open(path, format_version=format_version) as log:
        log.append("s", [injected("hi")], expected_version=ANY)
        log.append("s", [injected(prose(1, 400))], expected_version=ANY)
        noise = "".join(random.Random(2).choices(string.printable, k=3000))
        log.append("s", [injected(noise)], expected_version=ANY)
        assert log.verify().ok
        return [raw for _, raw in log.read_records(limit=10)]


def test_a_long_record_is_stored_packed_and_read_back_as_it_is(tmp_path: Path) -> None:
    records = build(tmp_path / "log")
    with raw_log(tmp_path / "log") as raw:
        stored = [raw.stored(position) for position in (1, 2, 3)]
    assert all(record.startswith(RECORD_PREFIX) for record in records)
    short, long, _ = stored
    assert short is not None and long is not None
    assert short == records[0]  # under PACK_MIN_BYTES, or not worth it: as it is
    assert long.startswith(PACKED_PREFIX)
    assert len(long) < len(records[1]) // 2
    assert long[HASH_START:BODY_START] == records[1][HASH_START:BODY_START]  # hash in place
    assert unpack(long) == records[1]


def test_the_chain_and_the_records_are_those_of_format_2(tmp_path: Path) -> None:
    # Packing is a matter of pages: the same appends give the same records, hashes and head in
    # both formats (recorded_at pinned, so the bytes can be equal).
    heads = []
    for version in (2, 3):
        with EventLog.open(tmp_path / f"v{version}", format_version=version) as log:
            for k in range(5):
                event = injected(prose(k, 50 * k))
                log.append("s", [event], expected_version=ANY, recorded_at=T0)
            heads.append((log.head_hash, [raw for _, raw in log.read_records(limit=10)]))
    assert heads[0] == heads[1]


def test_a_format_2_store_is_never_given_a_packed_record(tmp_path: Path) -> None:
    build(tmp_path / "log", format_version=2)
    with EventLog.open(tmp_path / "log") as log:  # the default asks for 3: the store keeps 2
        log.append("s", [injected(prose(3, 500))], expected_version=ANY)
    with raw_log(tmp_path / "log") as raw:
        assert raw.format_version == 2
        for position in range(1, 5):
            stored = raw.stored(position)
            assert stored is not None and stored.startswith(RECORD_PREFIX)


def test_a_record_that_does_not_pack_well_is_stored_as_it_is() -> None:
    record = RECORD_PREFIX + bytes(32) + msgspec.msgpack.encode(os.urandom(500))
    assert len(record) >= PACK_MIN_BYTES
    assert pack(record) is record
    small = RECORD_PREFIX + bytes(32) + b"\xa1x" * 10
    assert pack(small) is small


def test_a_short_chat_message_is_stored_as_it_is_though_it_would_pack() -> None:
    # A paragraph of chat in its envelope (about 300 bytes) would pack by more than an eighth,
    # but saves too few bytes to be worth zstd's call on every append and cold read.
    record = RECORD_PREFIX + bytes(32) + msgspec.msgpack.encode(prose(6, 45))
    squeezed = zstandard.ZstdCompressor(level=-1).compress(record[BODY_START:])
    assert 250 < len(record) < PACK_MIN_BYTES
    assert BODY_START + len(squeezed) < len(record) - len(record) // 8
    assert pack(record) is record
    longer = RECORD_PREFIX + bytes(32) + msgspec.msgpack.encode(prose(6, 90))
    assert len(longer) >= PACK_MIN_BYTES and pack(longer).startswith(PACKED_PREFIX)


@pytest.mark.parametrize("where", ["frame header", "frame body", "frame end"])
def test_a_changed_byte_of_a_packed_record_is_refused_at_its_position(
    tmp_path: Path, where: str
) -> None:
    build(tmp_path / "log")
    with raw_log(tmp_path / "log") as raw:
        stored = bytearray(raw.stored(2) or b"")
        at = {"frame header": BODY_START + 5, "frame body": len(stored) // 2 + 20}.get(
            where, len(stored) - 1
        )
        stored[at] ^= 0x40
        raw.txn.put(raw.key(2), bytes(stored))
    with EventLog.open(tmp_path / "log") as log:
        with pytest.raises(IntegrityError) as raised:
            log.read(limit=10)
        assert raised.value.position == 2
        report = log.verify()
        assert not report.ok and report.first_bad_position == 2, report


def test_a_frame_declaring_more_than_a_record_can_hold_is_refused_unread(tmp_path: Path) -> None:
    # A bomb: a few bytes that would unpack to more than any record may be. Its declared size is
    # checked before anything is allocated.
    build(tmp_path / "log")
    bomb = zstandard.ZstdCompressor(write_content_size=True).compress(
        bytes(limits.event_bytes_max + 1)
    )
    assert len(bomb) < 1024
    with raw_log(tmp_path / "log") as raw:
        hash_ = (raw.stored(2) or b"")[HASH_START:BODY_START]
        raw.txn.put(raw.key(2), PACKED_PREFIX + hash_ + bomb)
    with EventLog.open(tmp_path / "log") as log:
        with pytest.raises(IntegrityError) as raised:
            log.read(limit=10)
        assert raised.value.position == 2


def test_the_reader_takes_a_record_stored_as_it_is_in_a_format_3_store(tmp_path: Path) -> None:
    records = build(tmp_path / "log")
    with raw_log(tmp_path / "log") as raw:
        raw.txn.put(raw.key(2), records[1])  # as format 2 would store it
    with EventLog.open(tmp_path / "log") as log:
        assert [raw for _, raw in log.read_records(limit=10)] == records
        assert log.verify().ok


def test_threads_unpack_side_by_side(tmp_path: Path) -> None:
    # zstd contexts are per thread: readers in parallel each get every message right.
    with SessionStore.open(tmp_path / "store") as store:
        sid = store.open_session()
        for k in range(60):
            store.inject(sid, {"role": "user", "content": prose(k, 120)})
    expected = [prose(k, 120) for k in range(60)]
    seen: list[bool] = []
    with SessionStore.open(tmp_path / "store", hot_sessions=0) as cold:

        def read() -> None:
            for _ in range(20):
                seen.append([m["content"] for m in cold.messages(sid)] == expected)

        threads = [threading.Thread(target=read) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert seen == [True] * 80


def test_damaged_values_that_unpack_to_megabytes_are_refused_one_at_a_time(
    tmp_path: Path,
) -> None:
    # A hundred-odd bytes may declare a frame of the most a record may be: a page of such values
    # is refused at its first, never unpacked whole (a small damaged store must not make a read
    # or an export hold gigabytes).
    with EventLog.open(tmp_path / "log") as log:
        for _ in range(9):
            log.append("s", [injected("hi")], expected_version=ANY)
    bomb = zstandard.ZstdCompressor(write_content_size=True).compress(
        bytes(limits.event_bytes_max - BODY_START)
    )
    with raw_log(tmp_path / "log") as raw:
        for position in range(1, 9):  # the last one stays whole: opening checks it
            hash_ = (raw.stored(position) or b"")[HASH_START:BODY_START]
            raw.txn.put(raw.key(position), PACKED_PREFIX + hash_ + bomb)
    with EventLog.open(tmp_path / "log") as log, log.view() as view:
        reads = {
            "read_records": lambda: log.read_records(limit=10),
            "events_at": lambda: view.events_at(range(1, 10)),
        }
        for name, read in reads.items():
            tracemalloc.start()
            try:
                with pytest.raises(IntegrityError) as raised:
                    read()
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert raised.value.position == 1, name
            assert peak < 3 * limits.event_bytes_max, (name, peak)


def _bin16_record() -> bytes:
    """A record that chains from the genesis hash and decodes, with its hash spelled as msgpack
    bin16 (one byte later than in every record a log writes): found by trying payloads until
    the hash's last byte is the byte the chain then covers first."""
    with EventLog.memory() as log:
        log.append("s", [injected(prose(4, 80))], expected_version=ANY, recorded_at=T0)
        canonical = log.read_records()[0][1]
    decoded = msgspec.msgpack.Decoder(Envelope).decode(canonical)
    encoder = msgspec.msgpack.Encoder(order="deterministic")
    for attempt in range(10_000):
        envelope = msgspec.structs.replace(decoded, meta={"attempt": attempt})
        rest = encoder.encode(envelope)[BODY_START:]
        for last in range(256):
            hash_ = blake3.blake3(GENESIS_HASH + bytes([last]) + rest).digest()
            if hash_[-1] == last:
                return b"\x97\xc5\x00\x20" + hash_ + rest
    raise AssertionError("no such record found")


@pytest.mark.parametrize("format_version", [2, 3])
def test_an_import_refuses_a_record_whose_hash_is_not_where_records_keep_it(
    tmp_path: Path, format_version: int
) -> None:
    # It decodes and chains, but readers take a hash at a fixed offset and format 3 packs around
    # it there: stored, it would read back as a different record (or break the next one's link).
    record = _bin16_record()
    assert record[HASH_START:BODY_START] != record[4:36]
    assert _chain.check_one(GENESIS_HASH, record, 1).position == 1
    with EventLog.open(tmp_path / "log", format_version=format_version) as log:
        with pytest.raises(IntegrityError) as raised:
            log.import_records([record])
        assert raised.value.position == 1
        assert log.head == 0 and log.verify().ok


@pytest.mark.parametrize(("mine", "theirs"), [(2, 3), (1, 3), (3, 1), (1, 4), (4, 3)])
def test_a_store_made_meanwhile_by_another_process_keeps_its_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mine: int, theirs: int
) -> None:
    # Two processes open the same new path: this one found it blank, and by the time it lays it
    # out the other has made a store of another format there and written a record into it. The
    # layout that stands is the first; the record stays readable. (Formats 1 and 3 differ in
    # layout, not only in marker: one file holding both would be neither.)
    path = tmp_path / "log"
    other = (
        "import sys\n"
        "from eventlog import ANY, EventLog\n"
        "from tests.test_log_packing import injected, prose\n"
        "with EventLog.open(sys.argv[1], format_version=int(sys.argv[2])) as log:\n"
        "    log.append('s', [injected(prose(5, 400))], expected_version=ANY)\n"
    )
    claim = LmdbStorage._claim

    def after_the_other(storage: LmdbStorage) -> bytes | None:
        subprocess.run(
            [sys.executable, "-c", other, str(path), str(theirs)],
            check=True,
            timeout=120,
            cwd=Path(__file__).resolve().parent.parent,
        )
        return claim(storage)

    monkeypatch.setattr(LmdbStorage, "_claim", after_the_other)
    with EventLog.open(path, format_version=mine) as log:
        assert [event.position for event in log.read()] == [1]
        log.append("s", [injected("mine")], expected_version=ANY)
    monkeypatch.undo()
    with EventLog.open(path) as log:
        assert log.verify().ok and log.head == 2
    with raw_log(path) as raw:
        assert raw.format_version == theirs
        if theirs >= 3:
            assert (raw.stored(1) or b"").startswith(PACKED_PREFIX)


def test_the_hash_a_read_starts_from_is_taken_without_unpacking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventlog import _lmdb_tree

    records = build(tmp_path / "log")
    unpacked: list[int] = []

    def counting(stored: bytes) -> object:
        unpacked.append(len(stored))
        return unpack(stored)

    monkeypatch.setattr(_lmdb_tree, "unpack", counting)
    monkeypatch.setattr(_lmdb_tree, "unpacker", lambda: counting)
    with EventLog.open(tmp_path / "log") as log:
        unpacked.clear()  # opening checks the newest record
        page = log.read(after=2, limit=1)  # chains to the hash of the packed record at 2
        assert [envelope.position for envelope in page] == [3]
        with log.view() as view:
            assert view._txn.record_hash(2) == records[1][HASH_START:BODY_START]  # type: ignore[attr-defined]
    assert len(unpacked) == 1  # the record read, not the one before it


def damaged_forms(stored: bytes) -> list[bytes]:
    """`stored` (a packed record) with bytes changed, cut short, or its frame replaced."""
    forms = [stored[:-1], stored[: BODY_START + 3], stored[:HASH_START], b""]
    for at in (0, 1, 2, HASH_START, BODY_START, BODY_START + 5, len(stored) // 2, len(stored) - 1):
        changed = bytearray(stored)
        changed[at] ^= 0x40
        forms.append(bytes(changed))
    unknown_size = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 300)
    forms.append(stored[:BODY_START] + unknown_size)
    return forms


def test_a_reader_s_unpacker_gives_what_unpack_gives_for_sound_and_damaged_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Readers of many records take this thread's unpacker once per read; it must hand on exactly
    # what `unpack` does, the damaged values as they are stored, and follow the limits in force.
    records = build(tmp_path / "log")
    packed = bytes(pack(records[1]))
    assert packed.startswith(PACKED_PREFIX)
    values = [records[0], packed, records[2], packed + b"after the frame", *damaged_forms(packed)]
    unpack_one = unpacker()
    assert unpacker() is unpack_one  # one per thread, made once
    for value in values:
        assert bytes(unpack_one(value)) == bytes(unpack(value)), value
        assert bytes(unpack_one(memoryview(value))) == bytes(unpack(value)), value
    assert unpack_one(packed) == records[1]
    damaged = damaged_forms(packed)
    for value in [*damaged[1:4], damaged[-1]]:  # no frame whole, or one of no declared size
        assert unpack_one(value) == value
    monkeypatch.setattr(limits, "event_bytes_max", len(records[1]) - BODY_START - 1)
    assert unpack_one(packed) == packed  # now declares more than a record may hold
    other: list[object] = []
    thread = threading.Thread(target=lambda: other.append(unpacker()))
    thread.start()
    thread.join()
    assert other and other[0] is not unpack_one


@pytest.mark.parametrize("damage", range(13))
def test_a_damaged_packed_record_among_many_is_refused_at_its_position_by_every_reader(
    tmp_path: Path, damage: int
) -> None:
    # Two streams interleaved, so a transcript read seeks to the record before each one; the
    # record at 12 is damaged one way or another: every reader that reaches it refuses it there
    # and hands out every record before it.
    with EventLog.open(tmp_path / "log") as log:
        for k in range(30):
            log.append(f"s{k % 2}", [injected(prose(k, 120))], expected_version=ANY)
    with raw_log(tmp_path / "log") as raw:
        stored = raw.stored(12) or b""
        assert stored.startswith(PACKED_PREFIX)
        raw.txn.put(raw.key(12), damaged_forms(bytes(stored))[damage])
    with EventLog.open(tmp_path / "log") as log, log.view() as view:
        even = list(range(2, 31, 2))
        assert [e.position for e in view.events_at(even[:5])] == even[:5]
        reads = {
            "read": lambda: log.read(limit=30),
            "read_records": lambda: log.read_records(limit=30),
            "events_at": lambda: view.events_at(even),
            "read_stream": lambda: view.read_stream("s1", limit=30),
        }
        for name, read in reads.items():
            with pytest.raises(IntegrityError) as raised:
                read()
            assert raised.value.position == 12, name
        assert [e.position for e in log.read(limit=11)] == list(range(1, 12))
        # (13 chains to the hash stored in 12, which some of these forms changed)
        assert [e.position for e in view.events_at(range(14, 31))] == list(range(14, 31))
        report = log.verify()
        assert not report.ok and report.first_bad_position == 12, report


def test_a_stream_read_with_records_unpacks_each_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What an archive of a session reads: each event of the stream and its stored bytes as they
    # are, from one read of each record (it read every record twice: checked, then again bare).
    from eventlog import _lmdb_tree

    with EventLog.open(tmp_path / "log") as log:
        for k in range(12):
            log.append(f"s{k % 2}", [injected(prose(k, 120))], expected_version=ANY)
        every = dict((envelope.position, raw) for envelope, raw in log.read_records(limit=20))
    unpacked: list[int] = []

    def counting(stored: bytes) -> object:
        unpacked.append(len(stored))
        return unpack(stored)

    monkeypatch.setattr(_lmdb_tree, "unpack", counting)
    with EventLog.open(tmp_path / "log") as log, log.view() as view:
        unpacked.clear()  # opening checks the newest record
        page = view.read_stream_records("s1", after=1, limit=4)
        assert len(unpacked) == 4
        assert [envelope.version for envelope, _ in page] == [2, 3, 4, 5]
        assert [raw for _, raw in page] == [every[envelope.position] for envelope, _ in page]
        assert all(type(raw) is bytes for _, raw in page)
        assert [envelope for envelope, _ in page] == view.read_stream("s1", after=1, limit=4)
    with raw_log(tmp_path / "log") as raw:
        stored = bytearray(raw.stored(6) or b"")
        stored[len(stored) // 2] ^= 0x40
        raw.txn.put(raw.key(6), bytes(stored))
    with EventLog.open(tmp_path / "log") as log, log.view() as view:
        with pytest.raises(IntegrityError) as raised:
            view.read_stream_records("s1", limit=10)
        assert raised.value.position == 6
