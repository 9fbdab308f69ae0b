"""The stored format is frozen: records written by this version must decode, hash and re-encode
exactly as the bytes kept in `tests/fixtures/log-format-v1.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from eventlog import GENESIS_HASH, EventLog, events
from eventlog._codec import check_record, decode_record
from tests._format_samples import SAMPLES, T0, build_log_lines

FIXTURE = Path(__file__).parent / "fixtures" / "log-format-v1.jsonl"


def stored() -> list[bytes]:
    return [bytes.fromhex(json.loads(line)["hex"]) for line in FIXTURE.read_text().splitlines()]


def test_every_catalog_event_has_a_sample() -> None:
    sampled = {type(event) for _, event in SAMPLES}
    assert sampled == set(events.EVENT_TYPES)


def test_stored_bytes_decode_to_the_samples_and_chain() -> None:
    records = stored()
    assert len(records) == len(SAMPLES)
    prev = GENESIS_HASH
    versions: dict[str, int] = {}
    for position, (record, (stream, event)) in enumerate(zip(records, SAMPLES, strict=True), 1):
        prev = check_record(prev, record, position)
        envelope = decode_record(record, position)
        versions[stream] = versions.get(stream, 0) + 1
        assert envelope.data == event
        assert envelope.stream == stream
        assert envelope.version == versions[stream]
        assert envelope.recorded_at == T0
        assert envelope.meta == {"i": position - 1}
        assert envelope.type == event.__struct_config__.tag


def test_this_version_writes_the_same_bytes() -> None:
    assert build_log_lines() == FIXTURE.read_text().splitlines()


def test_tags_are_explicit_and_unique() -> None:
    tags = [cls.__struct_config__.tag for cls in events.EVENT_TYPES]
    assert len(tags) == len(set(tags))
    for cls, tag in zip(events.EVENT_TYPES, tags, strict=True):
        assert isinstance(tag, str) and tag != cls.__name__


def test_an_event_from_a_newer_writer_with_an_extra_field_still_decodes() -> None:
    # Schema evolution: a newer version may add fields with defaults; this version ignores them.
    newer = msgspec.msgpack.encode({"type": "session_reset", "reason": "x", "added_later": 1})
    decoded = msgspec.msgpack.decode(newer, type=events.AnyEvent)
    assert decoded == events.SessionReset(reason="x")


def test_an_older_record_without_optional_fields_decodes_with_defaults() -> None:
    older = msgspec.msgpack.encode({"type": "message_injected", "message": {"role": "user"}})
    decoded = msgspec.msgpack.decode(older, type=events.AnyEvent)
    assert decoded == events.MessageInjected(message=events.Message(role="user"))
    assert decoded.message.metadata == {}


@pytest.mark.parametrize("kind", ["memory", "lmdb", "lmdb-format-1"])
def test_both_logs_store_the_fixture_bytes(kind: str, tmp_path: Path) -> None:
    # The LMDB formats differ in layout only (`test_log_store_format.py`): the records are these.
    from eventlog import ANY

    if kind == "memory":
        log = EventLog.memory()
    else:
        log = EventLog.open(tmp_path / "log", format_version=1 if kind == "lmdb-format-1" else 2)
    with log:
        for index, (stream, event) in enumerate(SAMPLES):
            log.append(stream, [event], expected_version=ANY, meta={"i": index}, recorded_at=T0)
        assert log.head_hash == check_chain_head(stored())


def check_chain_head(records: list[bytes]) -> bytes:
    prev = GENESIS_HASH
    for position, record in enumerate(records, 1):
        prev = check_record(prev, record, position)
    return prev
