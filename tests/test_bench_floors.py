"""`bench/floors.py` times the work the log must do, so what it writes and checks must be exactly
what the log writes and checks: a cheaper imitation would understate the floor."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import lmdb

from bench.engine_bench import make_messages
from bench.floors import BATCH, SESSIONS, _append_rows, _plain, _record, measure
from eventlog import ANY, EventLog, limits
from eventlog._codec import encode_records
from eventlog._lmdb_tree import EVENTS_START, INDEX
from eventlog.events import MessageInjected


def test_a_floor_record_is_byte_for_byte_the_record_the_log_encodes() -> None:
    at = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)
    prev = bytes(range(32))
    for position, message in enumerate(make_messages(20, seed=5), start=7):
        event = MessageInjected(message=_plain(message))
        record, digest = _record(prev, position, "s3", position - 6, event, at)
        records, envelopes = encode_records(
            prev, position, "s3", position - 6, at, {}, [event], limits.event_bytes_max
        )
        assert bytes(record) == bytes(records[0])
        assert digest == envelopes[0].hash
        prev = digest


def test_every_row_measures_its_work_against_its_baseline(tmp_path: Path) -> None:
    results = measure(tmp_path, rounds=1)
    assert [r.name for r in results] == [
        "append_floor",
        "append_floor_unpacked",
        "read_floor",
        "thread_handoff",
    ]
    for result in results:
        assert result.ours > 0 and result.baseline > 0, result.name
        assert len(result.ours_rounds) == len(result.baseline_rounds) == 1


def test_the_append_floor_indexes_every_version_as_the_log_does(tmp_path: Path) -> None:
    # Each floor round appends to the streams `s0`..`s7` in turn; the log given the same appends
    # in transactions of the same size must hold the same stream index, chunk for chunk.
    _append_rows(tmp_path / "floors", rounds=1)

    def entries(path: Path) -> tuple[int, dict[bytes, bytes]]:
        env = lmdb.open(str(path), readonly=True, lock=False)
        try:
            with env.begin() as txn:
                items = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
        finally:
            env.close()
        events = sum(1 for k, _ in items if k[:1] == EVENTS_START[:1])
        return events, {k: v for k, v in items if k[:1] == INDEX}

    events, floor_index = entries(tmp_path / "floors" / "floor")
    assert events and events % BATCH == 0
    with EventLog.open(tmp_path / "log", sync=False) as log:
        event = MessageInjected(message=_plain(make_messages(1, seed=1)[0]))
        for _ in range(0, events, BATCH):
            with log.transaction() as tx:
                for index in range(BATCH):
                    tx.append(f"s{index % SESSIONS}", [event], expected_version=ANY)
    assert floor_index == entries(tmp_path / "log")[1]
