"""`bench/floors.py` times the work the log must do, so what it writes and checks must be exactly
what the log writes and checks: a cheaper imitation would understate the floor."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from bench.engine_bench import make_messages
from bench.floors import _plain, _record, measure
from eventlog import limits
from eventlog._codec import encode_records
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
