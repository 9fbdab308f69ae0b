"""Truncating a prefix of the log: the anchor it keeps, reads of what is gone, verify from the anchor.

Runs on every backend (the `log` fixture). The tamper tests change bytes of an LMDB store directly
(with the log closed, one environment per path per process), after a truncation: verify must start
at the anchor and still name the first bad position after it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from eventlog import (
    ANY,
    NO_STREAM,
    ConcurrencyError,
    EventLog,
    IntegrityError,
    InvalidArgumentError,
    StoreBusyError,
)
from eventlog._codec import BODY_START, GENESIS_HASH
from eventlog.errors import TruncatedError
from eventlog.events import Message, MessageInjected
from tests import _pg
from tests._raw_lmdb import raw_log

STREAMS = 3


def message(text: str) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content=text))


def fill(log: EventLog, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        log.append(f"s-{i % STREAMS}", [message(f"m{i} " + "x" * 300)], expected_version=ANY)


def test_truncate_keeps_the_hash_at_the_cut_and_verifies_from_it(log: EventLog) -> None:
    fill(log, 30)
    before = log.read(after=0, limit=100)
    cut_hash = before[11].hash  # the event at position 12
    assert log.anchor == (0, GENESIS_HASH)

    assert log.truncate(before=13) == (12, cut_hash)

    assert log.anchor == (12, cut_hash)
    assert log.head == 30
    assert log.head_hash == before[-1].hash
    report = log.verify()
    assert report.ok, report.problem
    assert report.anchor_position == 12
    assert report.events_checked == 18
    assert report.head_hash == before[-1].hash
    assert log.read(after=12, limit=100) == before[12:]


def test_reads_of_a_truncated_position_raise_truncated_error(log: EventLog) -> None:
    fill(log, 12)
    log.truncate(before=7)
    with pytest.raises(TruncatedError) as raised:
        log.read(after=0)
    assert raised.value.position == 1 and raised.value.anchor == 6
    assert "truncated" in str(raised.value)
    with pytest.raises(TruncatedError):
        log.read(after=5, limit=1)
    with pytest.raises(TruncatedError):
        log.read_records(after=3)
    with log.view() as view:
        with pytest.raises(TruncatedError) as raised:
            view.event_at(4)
        assert raised.value.position == 4
        assert view.event_at(7) is not None and view.event_at(13) is None
        with pytest.raises(TruncatedError):
            view.events_at([2, 8])
        assert [e.position for e in view.events_at([7, 8, 11])] == [7, 8, 11]
    # s-0 holds positions 1, 4, 7, 10: versions 1 and 2 are gone, 3 and 4 remain.
    with pytest.raises(TruncatedError):
        log.read_stream("s-0")
    assert [e.version for e in log.read_stream("s-0", after=2)] == [3, 4]


def test_positions_and_versions_carry_on_after_a_truncation(log: EventLog) -> None:
    fill(log, 9)
    log.truncate(before=10)  # everything
    assert log.head == 9
    assert log.stream_version("s-1") == 3
    with pytest.raises(ConcurrencyError):
        log.append("s-1", [message("again")], expected_version=NO_STREAM)
    assert log.append("s-1", [message("next")], expected_version=3) == [10]
    report = log.verify()
    assert report.ok and report.anchor_position == 9 and report.events_checked == 1
    assert [e.version for e in log.read_stream("s-1", after=3)] == [4]


def test_truncate_twice_and_out_of_range(log: EventLog) -> None:
    fill(log, 10)
    first = log.truncate(before=4)
    assert log.truncate(before=2) == first  # at or before the anchor: nothing changes
    assert log.truncate(before=8)[0] == 7
    for bad in (0, 12, -1, True, "5"):
        with pytest.raises(InvalidArgumentError):
            log.truncate(before=bad)  # type: ignore[arg-type]
    assert log.verify().ok


def test_a_truncation_inside_an_aborted_transaction_keeps_everything(log: EventLog) -> None:
    fill(log, 10)
    with pytest.raises(RuntimeError), log.transaction() as tx:
        tx.truncate(6)
        raise RuntimeError("abort")
    assert log.anchor[0] == 0
    assert len(log.read(after=0, limit=100)) == 10
    assert log.verify().ok


# Tampering after a truncation (LMDB, bytes changed underneath the API).


def built(tmp_path: Path) -> Path:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        fill(log, 40)
        log.truncate(before=21)
    return path


def change(path: Path, table: bytes, key: bytes, how: Callable[[bytearray], None] | None) -> None:
    """Change the value under `key` in LMDB table `table` of the closed store (None deletes), as
    format 1 names them; `tests/_raw_lmdb.py` finds the entry in either format."""
    with raw_log(path) as store:
        db, where = store.locate(table, key)
        if how is None:
            assert store.txn.delete(where, db=db)
            return
        value = bytearray(store.txn.get(where, db=db))
        how(value)
        store.txn.put(where, bytes(value), db=db)


def flip_middle(record: bytearray) -> None:
    record[(BODY_START + len(record)) // 2] ^= 0x40


def test_truncation_refuses_a_prefix_that_does_not_chain(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        fill(log, 20)
    change(path, b"events", (5).to_bytes(8, "big"), flip_middle)
    with EventLog.open(path) as log:
        with pytest.raises(IntegrityError) as raised:
            log.truncate(before=11)
        assert raised.value.position == 5
        assert log.anchor[0] == 0  # nothing dropped


@pytest.mark.parametrize("position", [21, 22, 33, 39])
def test_a_flipped_byte_after_the_anchor_is_named(tmp_path: Path, position: int) -> None:
    path = built(tmp_path)
    change(path, b"events", position.to_bytes(8, "big"), flip_middle)
    report = EventLog.verify_files(path)
    assert not report.ok
    assert report.anchor_position == 20
    assert report.first_bad_position == position
    assert report.events_checked == position - 21


def test_a_changed_anchor_is_named_at_the_first_kept_position(tmp_path: Path) -> None:
    path = built(tmp_path)

    def flip_hash_byte(anchor: bytearray) -> None:
        anchor[20] ^= 0x01  # a byte of the stored hash (after the 8-byte position)

    change(path, b"meta", b"anchor", flip_hash_byte)
    report = EventLog.verify_files(path)
    assert not report.ok
    assert report.first_bad_position == 21


def test_a_deleted_kept_event_is_named(tmp_path: Path) -> None:
    path = built(tmp_path)
    change(path, b"events", (26).to_bytes(8, "big"), None)
    report = EventLog.verify_files(path)
    assert not report.ok
    assert report.first_bad_position == 26


def test_a_lowered_stream_floor_is_named(tmp_path: Path) -> None:
    path = built(tmp_path)

    def lower(floor: bytearray) -> None:
        # s-0 lost positions 1, 4, ..., 19: versions 1 to 7; claim only 6 were dropped.
        assert floor == (7).to_bytes(8, "big")
        floor[:] = (6).to_bytes(8, "big")

    change(path, b"floors", b"s-0\x00", lower)
    report = EventLog.verify_files(path)
    assert not report.ok
    assert report.first_bad_position == 22  # s-0's first kept event, version 8
    assert report.problem is not None and "expected 7" in report.problem


# Compacting the files after a truncation (LMDB).


def test_compact_files_shrinks_a_truncated_store_and_keeps_every_kept_event(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        fill(log, 600)
        log.truncate(before=571)
        kept = log.read_records(after=570, limit=100)
        anchor = log.anchor
    size, compacted = EventLog.compact_files(path)
    assert compacted * 4 < size, (size, compacted)
    assert (path / "data.mdb").stat().st_size == compacted
    assert not list(path.glob(".compact-*"))
    with EventLog.open(path) as log:
        assert log.anchor == anchor
        assert log.read_records(after=570, limit=100) == kept
        assert log.verify().ok
        fill(log, 5, start=600)
        assert log.head == 605
    with EventLog.open(path) as log:
        assert log.verify().ok and log.head == 605


def test_compact_files_refuses_a_store_open_in_this_or_another_process(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        fill(log, 10)
        with pytest.raises(StoreBusyError):
            EventLog.compact_files(path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from eventlog import EventLog; log = EventLog.open(sys.argv[1]);"
            " print('open', flush=True); time.sleep(60)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        before = (path / "data.mdb").read_bytes()
        with pytest.raises(StoreBusyError) as raised:
            EventLog.compact_files(path)
        assert "another process" in str(raised.value)
        assert (path / "data.mdb").read_bytes() == before
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert EventLog.compact_files(path)[1] > 0  # the holder is gone: allowed again


# PostgreSQL: the rows are deleted; VACUUM FULL, the operator's to run, returns the space.


@pytest.mark.needs("POSTGRES")
def test_postgres_truncation_deletes_rows_and_vacuum_full_returns_the_space() -> None:
    url = _pg.fresh_schema_url()
    schema = url.rsplit("schema=", 1)[1]
    with EventLog.open(url) as log:
        for start in range(0, 600, 100):
            with log.transaction() as tx:
                for i in range(start, start + 100):
                    tx.append(f"s-{i % STREAMS}", [message("y" * 2000)], expected_version=ANY)
        full = log.size_bytes()
        log.truncate(before=571)
        with _pg.connect(_pg.database_url(), autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"'.encode())
            rows = conn.execute("SELECT count(*), min(position) FROM events").fetchone()
            assert rows == (30, 571)
            floors = dict(conn.execute("SELECT stream, version FROM stream_floors").fetchall())
            assert floors == {"s-0": 190, "s-1": 190, "s-2": 190}
            conn.execute("VACUUM FULL events")
        assert log.size_bytes() * 3 < full, (full, log.size_bytes())
        assert log.verify().ok and log.read(after=570, limit=5)[0].position == 571


def test_an_idempotency_key_of_truncated_events_still_answers_their_positions(
    log: EventLog,
) -> None:
    keyed = {"idempotency_key": "req-1"}
    first = log.append("s-0", [message("once"), message("twice")], expected_version=0, meta=keyed)
    fill(log, 6)
    log.truncate(before=first[-1] + 3)
    with pytest.raises(TruncatedError):
        log.read(after=0, limit=1)
    again = log.append("s-0", [message("once"), message("twice")], expected_version=0, meta=keyed)
    assert again == first and log.head == 8  # the original answer, nothing written
    with log.view() as view:
        assert view.appended_with("req-1") == ("s-0", first[0], first[-1])
    with pytest.raises(InvalidArgumentError, match="req-1"):
        log.append("s-1", [message("elsewhere")], expected_version=ANY, meta=keyed)


def test_a_log_truncated_to_nothing_keeps_its_head_beside_long_idempotency_keys(
    log: EventLog,
) -> None:
    """With every event truncated away, the head is the anchor's, even where another table's
    keys (a long idempotency key sorts after them all) share the events' tree."""
    log.append("s-0", [message("once")], expected_version=0, meta={"idempotency_key": "q" * 200})
    fill(log, 2)
    log.truncate(before=4)
    assert log.head == 3 and log.anchor[0] == 3
    log.append("s-0", [message("after")], expected_version=ANY)
    assert log.head == 4 and log.verify().ok
