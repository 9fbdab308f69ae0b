"""Format 3 packs records where that pays (`eventlog/_packing.py`): what a reader gets, what the
chain covers and what an export carries are the records as they are; a packed record whose bytes
were changed is refused at its position like any damaged record; a format-2 store is never
given a packed record."""

from __future__ import annotations

import os
import random
import string
import threading
from pathlib import Path

import msgspec
import pytest
import zstandard

from eventlog import ANY, EventLog, IntegrityError, limits
from eventlog._codec import BODY_START, HASH_START
from eventlog._packing import PACK_MIN_BYTES, PACKED_PREFIX, RAW_PREFIX, pack, unpack
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
    assert all(record.startswith(RAW_PREFIX) for record in records)
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
            assert stored is not None and stored.startswith(RAW_PREFIX)


def test_a_record_that_does_not_pack_well_is_stored_as_it_is() -> None:
    record = RAW_PREFIX + bytes(32) + msgspec.msgpack.encode(os.urandom(500))
    assert len(record) >= PACK_MIN_BYTES
    assert pack(record) is record
    small = RAW_PREFIX + bytes(32) + b"\xa1x" * 10
    assert pack(small) is small


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
