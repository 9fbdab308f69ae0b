"""Whole-log export and import: round trips, every refusal, idempotence, streaming, and the
storage-level `import_records` that writes exported records byte for byte on both backends."""

from __future__ import annotations

import base64
import io
import json
import tracemalloc
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import projections as pj
import sessions.testing
from eventlog import EventLog, IntegrityError, InvalidArgumentError, RecordChecker, limits
from eventlog import events as ev
from eventlog._codec import GENESIS_HASH, encode_records
from replay import LogExportResult, LogImportResult, export_log, import_log
from sessions import SessionStore
from sessions.testing import SESSION_ID_POOL, count_tokens, histories, run_history

# Helpers


def summarize(messages: list[dict[str, Any]]) -> str:
    return f"{len(messages)} messages summarized"


def populate(store: SessionStore) -> list[str]:
    """Every kind of event the engine writes: sessions, forks, compaction, live clients,
    scratchpads, workspace, renames, closes and a delete. Returns the session ids."""
    ids = []
    for index in range(6):
        sid = store.open_session(
            f"s{index}",
            title=f"session {index}",
            system_prompt="be brief",
            metadata={"provider": "p", "n": index},
        )
        ids.append(sid)
        for turn in range(15):
            store.inject(sid, {"role": "user", "content": f"q{turn} é\x01"})
            store.inject(sid, {"role": "assistant", "content": f"a{turn}", "usage": {"x": 1.5}})
    ids.append(store.fork_at("s0", keep_first=4, destination_id="child"))
    ids.append(store.fork("child", "grandchild"))
    store.inject("child", {"role": "user", "content": "after the fork"})
    store.compact("s1", keep_last=3)
    store.compact("s2", compact_strategy="llm", keep_last=2)
    store.trim("s3", keep_last=5)
    store.reset("s4")
    store.set_scratchpad("s0", {"plan": [1, 2, 3], "note": "x"})
    store.set_scratchpad("s1", {"a": 1})
    store.clear_scratchpad("s1")
    store.attach("s0", "tui", {"mode": "controller"})
    store.attach("s0", "portal")
    store.heartbeat("s0", "portal")
    store.client_inject_prompt("s0", "tui", "from the tui")
    store.route_permission("s0", "tui", {"tool": "shell", "args": {"cmd": "ls"}})
    store.takeover("s0", "portal")
    store.detach("s0", "tui")
    store.add_root("s5", "/repo")
    store.set_workspace_policy("s5", {"default_mount_mode": "read_only"})
    store.rename("s5", "renamed")
    store.close_session("s3", "completed")
    store.delete("s4")
    with store.transaction():
        store.open_session("batched")
        store.inject("batched", {"role": "user", "content": "one commit"})
    ids.append("batched")
    return ids


def state_of(store: SessionStore, ids: list[str]) -> dict[str, Any]:
    """Everything a reader can see, for comparing two stores."""
    with store.log.view() as view:
        dump = pj.dump(view)
    report = store.log.verify()
    return {
        "head": store.log.head,
        "head_hash": store.log.head_hash,
        "verify": (report.ok, report.events_checked, report.streams_checked, report.head_hash),
        "dump": dump,
        "events": list(store.log.iter_all()),
        "snapshots": {sid: store.snapshot(sid) for sid in ids},
        "ancestry": {sid: store.ancestry(sid) for sid in ids},
        "lists": [
            store.list_sessions(status=status, limit=200)
            for status in (None, "active", "closed", "deleted")
        ],
    }


def lines_of(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def empty_state(store: SessionStore) -> tuple[int, list[tuple[bytes, bytes]]]:
    with store.log.view() as view:
        return store.log.head, pj.dump(view)


@pytest.fixture(scope="module")
def source_export(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """One populated LMDB store, exported once: the bytes and the state they must reproduce."""
    path = tmp_path_factory.mktemp("source")
    with SessionStore.open(path / "s", summarizer=summarize) as store:
        ids = populate(store)
        out = io.BytesIO()
        result = export_log(store, out)
        assert result.events == store.log.head
        yield out.getvalue(), state_of(store, ids) | {"ids": ids}


@pytest.fixture(params=["memory", "lmdb", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """The stores an export is imported into (PostgreSQL: moving a deployment off LMDB)."""
    return str(request.param)


@pytest.fixture
def target(store: SessionStore) -> SessionStore:
    """The shared `store` fixture, as the store an export is imported into."""
    return store


# Round trips


def test_round_trip_reproduces_the_log_and_every_projection(
    source_export: tuple[bytes, dict[str, Any]], target: SessionStore
) -> None:
    data, expected = source_export
    result = import_log(target, io.BytesIO(data))
    assert result == LogImportResult(
        source_events=expected["head"],
        already_present=0,
        written=expected["head"],
        head=expected["head"],
        head_hash=expected["head_hash"].hex(),
    )
    assert not result.unchanged
    got = state_of(target, expected["ids"])
    for key in ("head", "head_hash", "verify", "dump", "events", "snapshots", "ancestry", "lists"):
        assert got[key] == expected[key], key
    assert got["snapshots"]["s0"]["live_controller_id"] == "portal"
    assert got["lists"][3]["sessions"][0]["session_id"] == "s4"


def test_imported_store_reopens_without_replaying_and_rebuilds_to_the_same_state(
    source_export: tuple[bytes, dict[str, Any]], tmp_path: Path
) -> None:
    data, expected = source_export
    (tmp_path / "export.jsonl").write_bytes(data)
    with SessionStore.open(tmp_path / "t") as store:
        import_log(store, tmp_path / "export.jsonl")
    log = EventLog.open(tmp_path / "t")
    with log, log.view() as view:  # no projector, no catch-up: what was committed
        assert pj.projected_position(view) == expected["head"]
        assert pj.dump(view) == expected["dump"]
    with SessionStore.open(tmp_path / "t") as store:
        assert state_of(store, expected["ids"])["snapshots"] == expected["snapshots"]
        store.rebuild()
        assert state_of(store, expected["ids"])["dump"] == expected["dump"]


def test_export_is_deterministic_and_readable(
    source_export: tuple[bytes, dict[str, Any]], tmp_path: Path
) -> None:
    data, expected = source_export
    lines = lines_of(data)
    header = json.loads(lines[0])
    assert header == {
        "_type": "sessionlog_log_export",
        "format_version": 1,
        "events": expected["head"],
        "head_hash": expected["head_hash"].hex(),
    }
    assert len(lines) == expected["head"] + 1
    first = json.loads(lines[1])
    assert list(first) == [
        "position",
        "stream",
        "version",
        "type",
        "recorded_at",
        "meta",
        "data",
        "hash",
        "record",
    ]
    assert (first["position"], first["stream"], first["version"]) == (1, "s0", 1)
    assert first["type"] == first["data"]["type"] == "session_opened"
    assert first["data"]["metadata"] == {"provider": "p", "n": 0}
    envelope = expected["events"][0]
    assert first["hash"] == envelope.hash.hex()
    assert base64.b64decode(first["record"])[3:35] == envelope.hash
    with SessionStore.memory() as copy:
        import_log(copy, io.BytesIO(data))
        again = io.BytesIO()
        assert export_log(copy, again).bytes_written == len(data)
        assert again.getvalue() == data


def test_paths_text_files_and_unseekable_sources(
    source_export: tuple[bytes, dict[str, Any]], tmp_path: Path
) -> None:
    data, expected = source_export
    with SessionStore.memory() as source:
        import_log(source, io.BytesIO(data))
        result = export_log(source, tmp_path / "out.jsonl")
        assert result == LogExportResult(expected["head"], expected["head_hash"].hex(), len(data))
        assert (tmp_path / "out.jsonl").read_bytes() == data
        text = io.StringIO()
        export_log(source, text)
        assert text.getvalue().encode() == data

    class Pipe(io.RawIOBase):
        """A readable stream that cannot seek, like a pipe."""

        def __init__(self, payload: bytes) -> None:
            self._inner = io.BytesIO(payload)

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            chunk = self._inner.read(len(buffer))
            buffer[: len(chunk)] = chunk
            return len(chunk)

    for src in (
        tmp_path / "out.jsonl",
        str(tmp_path / "out.jsonl"),
        io.StringIO(data.decode()),
        io.BufferedReader(Pipe(data)),
    ):
        with SessionStore.memory() as store:
            assert import_log(store, src).written == expected["head"]
            assert store.log.head_hash == expected["head_hash"]


def test_small_batches_give_the_same_store(source_export: tuple[bytes, dict[str, Any]]) -> None:
    data, expected = source_export
    with SessionStore.memory() as store:
        import_log(store, io.BytesIO(data), batch_events=7)
        assert state_of(store, expected["ids"])["dump"] == expected["dump"]
    with SessionStore.memory() as store:
        import_log(store, io.BytesIO(data), batch_record_bytes=1)
        assert store.log.head_hash == expected["head_hash"]


def test_an_empty_log_round_trips() -> None:
    with SessionStore.memory() as source, SessionStore.memory() as target:
        out = io.BytesIO()
        assert export_log(source, out) == LogExportResult(
            0, (b"\0" * 32).hex(), len(out.getvalue())
        )
        result = import_log(target, io.BytesIO(out.getvalue()))
        assert (result.written, result.head, result.unchanged) == (0, 0, True)


# Idempotence, prefixes, other logs


def test_importing_twice_writes_nothing_the_second_time(
    source_export: tuple[bytes, dict[str, Any]], target: SessionStore
) -> None:
    data, expected = source_export
    import_log(target, io.BytesIO(data))
    seen: list[int] = []
    with target.log.subscribe(lambda envelope: seen.append(envelope.position)):
        again = import_log(target, io.BytesIO(data))
    assert again.unchanged
    assert (again.already_present, again.written, again.head) == (
        expected["head"],
        0,
        expected["head"],
    )
    assert seen == []
    assert target.log.head_hash == expected["head_hash"]


def prefix_export(data: bytes, events: int) -> bytes:
    lines = lines_of(data)
    last = json.loads(lines[events])
    header = {
        "_type": "sessionlog_log_export",
        "format_version": 1,
        "events": events,
        "head_hash": last["hash"],
    }
    return json.dumps(header).encode() + b"\n" + b"".join(lines[1 : events + 1])


def test_a_target_holding_a_prefix_takes_the_rest(
    source_export: tuple[bytes, dict[str, Any]], target: SessionStore
) -> None:
    data, expected = source_export
    assert import_log(target, io.BytesIO(prefix_export(data, 40))).head == 40
    result = import_log(target, io.BytesIO(data), batch_events=50)
    assert (result.already_present, result.written) == (40, expected["head"] - 40)
    got = state_of(target, expected["ids"])
    assert (got["head_hash"], got["dump"]) == (expected["head_hash"], expected["dump"])


def test_a_target_holding_more_than_the_source_is_refused(
    source_export: tuple[bytes, dict[str, Any]], target: SessionStore
) -> None:
    data, expected = source_export
    import_log(target, io.BytesIO(data))
    with pytest.raises(InvalidArgumentError, match=r"holds \d+ events, more than the source's 40"):
        import_log(target, io.BytesIO(prefix_export(data, 40)))
    assert target.log.head == expected["head"]


def test_a_target_with_another_log_is_refused_and_left_alone(
    source_export: tuple[bytes, dict[str, Any]], target: SessionStore
) -> None:
    data, _ = source_export
    target.open_session("mine")
    target.inject("mine", {"role": "user", "content": "hello"})
    with target.log.view() as view:
        before = (target.log.head, target.log.head_hash, pj.dump(view))
    with pytest.raises(InvalidArgumentError, match=r":3: the target holds a different log"):
        import_log(target, io.BytesIO(data))
    with target.log.view() as view:
        assert (target.log.head, target.log.head_hash, pj.dump(view)) == before


# Refusals: every kind of damage, each named by its line, each leaving the target empty


def edit_line(data: bytes, lineno: int, change: Callable[[dict[str, Any]], None]) -> bytes:
    lines = lines_of(data)
    value = json.loads(lines[lineno - 1])
    change(value)
    lines[lineno - 1] = json.dumps(value).encode() + b"\n"
    return b"".join(lines)


def flip_record_byte(value: dict[str, Any]) -> None:
    record = bytearray(base64.b64decode(value["record"]))
    record[-1] ^= 0x01
    value["record"] = base64.b64encode(bytes(record)).decode()


def set_field(name: str, new: Any) -> Callable[[dict[str, Any]], None]:
    def change(value: dict[str, Any]) -> None:
        value[name] = new

    return change


def swap(data: bytes, a: int, b: int) -> bytes:
    lines = lines_of(data)
    lines[a - 1], lines[b - 1] = lines[b - 1], lines[a - 1]
    return b"".join(lines)


def drop(data: bytes, lineno: int) -> bytes:
    lines = lines_of(data)
    del lines[lineno - 1]
    return b"".join(lines)


def repeat(data: bytes, lineno: int) -> bytes:
    lines = lines_of(data)
    lines.insert(lineno, lines[lineno - 1])
    return b"".join(lines)


def replace_line(data: bytes, lineno: int, new: bytes) -> bytes:
    lines = lines_of(data)
    lines[lineno - 1] = new
    return b"".join(lines)


DAMAGE: dict[str, tuple[Callable[[bytes], bytes], type[Exception], str]] = {
    "changed record byte": (
        lambda d: edit_line(d, 5, flip_record_byte),
        IntegrityError,
        r":5: event at position 4: hash chain broken",
    ),
    "changed stream field": (
        lambda d: edit_line(d, 5, set_field("stream", "other")),
        IntegrityError,
        r":5: `stream` is \"other\", but the stored bytes say \"s0\"",
    ),
    "changed data field": (
        lambda d: edit_line(d, 5, lambda v: v["data"]["message"].update(content="forged")),
        IntegrityError,
        r":5: `data` is .*forged.*, but the stored bytes say",
    ),
    "bad hash field": (
        lambda d: edit_line(d, 5, set_field("hash", "00" * 32)),
        IntegrityError,
        r":5: `hash` is \"0000",
    ),
    "wrong position field": (
        lambda d: edit_line(d, 5, set_field("position", 9)),
        IntegrityError,
        r":5: expected the event at position 4, got position 9",
    ),
    "position as a bool": (
        lambda d: edit_line(d, 2, set_field("position", True)),
        IntegrityError,
        r":2: expected the event at position 1, got position True",
    ),
    "reordered lines": (
        lambda d: swap(d, 4, 6),
        IntegrityError,
        r":4: expected the event at position 3, got position 5",
    ),
    "missing line": (
        lambda d: drop(d, 7),
        IntegrityError,
        r":7: expected the event at position 6, got position 7",
    ),
    "duplicated line": (
        lambda d: repeat(d, 7),
        IntegrityError,
        r":8: expected the event at position 7, got position 6",
    ),
    "unknown field": (
        lambda d: edit_line(d, 3, set_field("extra", 1)),
        InvalidArgumentError,
        r":3: unknown fields \['extra'\]",
    ),
    "missing field": (
        lambda d: edit_line(d, 3, lambda v: v.pop("meta")),
        InvalidArgumentError,
        r":3: the field `meta` is missing",
    ),
    "malformed JSON": (
        lambda d: replace_line(d, 6, b'{"position": 5,\n'),
        InvalidArgumentError,
        r":6: malformed JSON",
    ),
    "not an object": (
        lambda d: replace_line(d, 6, b"[1, 2]\n"),
        InvalidArgumentError,
        r":6: expected a JSON object, got list",
    ),
    "blank line": (
        lambda d: replace_line(d, 6, b"\n"),
        InvalidArgumentError,
        r":6: blank line",
    ),
    "invalid UTF-8": (
        lambda d: replace_line(d, 6, b'{"position": "\xff"}\n'),
        InvalidArgumentError,
        r":6: malformed JSON",
    ),
    "record not base64": (
        lambda d: edit_line(d, 6, set_field("record", "not base64!")),
        InvalidArgumentError,
        r":6: `record` is not valid base64",
    ),
    "record missing": (
        lambda d: edit_line(d, 6, lambda v: v.pop("record")),
        InvalidArgumentError,
        r":6: `record` must be the base64 of the stored bytes, got NoneType",
    ),
    "record of another log": (
        lambda d: edit_line(
            d, 2, set_field("record", base64.b64encode(b"\x97\xc4\x20" + bytes(40)).decode())
        ),
        IntegrityError,
        r":2: event at position 1: hash chain broken",
    ),
    "truncated mid-line": (
        lambda d: d[: len(d) - 40],
        InvalidArgumentError,
        r":\d+: malformed JSON",
    ),
    "truncated at a line end": (
        lambda d: b"".join(lines_of(d)[:-3]),
        IntegrityError,
        r":\d+: the file ends after \d+ events, but the header promises \d+: it was cut short",
    ),
    "one line too many": (
        lambda d: d + lines_of(d)[-1],
        IntegrityError,
        r":\d+: the header promises \d+ events; this line is one more",
    ),
    "empty file": (lambda d: b"", InvalidArgumentError, r":1: the file is empty"),
    "header of another format": (
        lambda d: edit_line(d, 1, set_field("_type", "harn_session_bundle")),
        InvalidArgumentError,
        r":1: expected `_type` 'sessionlog_log_export', got 'harn_session_bundle'",
    ),
    "header of a newer version": (
        lambda d: edit_line(d, 1, set_field("format_version", 2)),
        InvalidArgumentError,
        r":1: expected `format_version` 1, got 2",
    ),
    "header without a count": (
        lambda d: edit_line(d, 1, lambda v: v.pop("events")),
        InvalidArgumentError,
        r":1: `events` must be an int >= 0, got None",
    ),
    "header with a bad hash": (
        lambda d: edit_line(d, 1, set_field("head_hash", "xyz")),
        InvalidArgumentError,
        r":1: `head_hash` must be 64 hex digits, got 'xyz'",
    ),
    "header with another head hash": (
        lambda d: edit_line(d, 1, set_field("head_hash", "ab" * 32)),
        IntegrityError,
        r":1: the header says the log ends at hash abab",
    ),
    "header with an unknown field": (
        lambda d: edit_line(d, 1, set_field("compressed", True)),
        InvalidArgumentError,
        r":1: unknown header fields \['compressed'\]",
    ),
    "header that is not JSON": (
        lambda d: replace_line(d, 1, b"sessionlog export\n"),
        InvalidArgumentError,
        r":1: malformed JSON",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_sources_are_refused_before_anything_is_written(
    damage: str, source_export: tuple[bytes, dict[str, Any]], target: SessionStore, tmp_path: Path
) -> None:
    data, _ = source_export
    change, error, message = DAMAGE[damage]
    path = tmp_path / "damaged.jsonl"
    path.write_bytes(change(data))
    before = empty_state(target)
    with pytest.raises(error, match=message) as caught:
        import_log(target, path)
    assert str(caught.value).startswith(f"{path}:")
    assert empty_state(target) == before
    assert before[0] == 0
    assert target.log.verify().ok


def test_a_reformatted_but_equal_line_is_accepted(
    source_export: tuple[bytes, dict[str, Any]],
) -> None:
    data, expected = source_export
    lines = lines_of(data)
    value = json.loads(lines[5])
    lines[5] = (
        json.dumps(value, indent=None, sort_keys=True, separators=(", ", ": ")).encode() + b"\r\n"
    )
    with SessionStore.memory() as store:
        assert import_log(store, io.BytesIO(b"".join(lines))).written == expected["head"]
        assert store.log.head_hash == expected["head_hash"]


def test_a_source_that_changes_between_the_check_and_the_write_is_caught(
    source_export: tuple[bytes, dict[str, Any]],
) -> None:
    data, _ = source_export
    with SessionStore.memory() as other:
        other.open_session("s0")
        for turn in range(80):
            other.inject("s0", {"role": "user", "content": f"other {turn}"})
        swapped = io.BytesIO()
        export_log(other, swapped)

    class Changing(io.BytesIO):
        """Reads as one export for the check, as another one afterwards."""

        def seek(self, offset: int, whence: int = 0) -> int:
            if self.tell() > 0:
                self.__init__(swapped.getvalue())  # type: ignore[misc]
            return super().seek(offset, whence)

    with SessionStore.memory() as store:
        before = empty_state(store)
        with pytest.raises(IntegrityError, match="changed while it was imported"):
            import_log(store, Changing(data), batch_events=10)
        assert empty_state(store) == before
        assert before[0] == 0


def test_bad_arguments_are_refused(source_export: tuple[bytes, dict[str, Any]]) -> None:
    data, _ = source_export
    with SessionStore.memory() as store:
        with pytest.raises(InvalidArgumentError, match="`batch_events` must be an int >= 1"):
            import_log(store, io.BytesIO(data), batch_events=0)
        with pytest.raises(InvalidArgumentError, match="`src` must be a path or a readable file"):
            import_log(store, 42)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="`out` must be a path or a writable file"):
            export_log(store, 42)  # type: ignore[arg-type]
        store.open_session("a")
        past = store.as_of(0)
        with pytest.raises(InvalidArgumentError, match="read-only view"):
            import_log(past, io.BytesIO(data))


def test_an_overlong_line_is_refused_without_reading_it_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "export_line_bytes_max", 64)
    with (
        SessionStore.memory() as store,
        pytest.raises(InvalidArgumentError, match=r":1: line longer than export_line_bytes_max"),
    ):
        import_log(store, io.BytesIO(b'{"_type": "' + b"x" * 200 + b'"}\n'))


# Streaming


def test_export_holds_one_page_in_memory_not_the_log(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "big", sync=False) as store:
        filler = "x" * 2_000
        for index in range(4):
            store.open_session(f"s{index}")
            with store.transaction():  # one event a message: pages of many small events
                for turn in range(2_500):
                    store.inject(f"s{index}", {"role": "user", "content": f"{turn} {filler}"})
        tracemalloc.start()
        try:
            export_log(store, tmp_path / "big.jsonl")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        size = (tmp_path / "big.jsonl").stat().st_size
        assert size > 40_000_000
        assert peak < size / 8, (peak, size)
        with SessionStore.open(tmp_path / "copy", sync=False) as copy:
            tracemalloc.start()
            try:
                import_log(copy, tmp_path / "big.jsonl", batch_events=1_000)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < size / 4, (peak, size)
            assert copy.log.head_hash == store.log.head_hash


# Property: any history of engine commands survives export then import


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(history=histories())
def test_any_history_round_trips(history: list[sessions.testing.VerbCall]) -> None:
    with (
        SessionStore.memory(token_counter=count_tokens) as source,
        SessionStore.memory(token_counter=count_tokens) as target,
    ):
        run_history(source, history)
        out = io.BytesIO()
        export_log(source, out)
        result = import_log(target, io.BytesIO(out.getvalue()))
        assert result.head == source.log.head
        assert target.log.head_hash == source.log.head_hash
        assert state_of(target, list(SESSION_ID_POOL)) == state_of(source, list(SESSION_ID_POOL))
        assert import_log(target, io.BytesIO(out.getvalue())).unchanged


# The storage level: `import_records` and `RecordChecker`, on both backends


def build_source(log: EventLog) -> list[tuple[Any, bytes]]:
    at = datetime(2025, 1, 2, tzinfo=UTC)
    with log.transaction():
        log.append("a", [ev.SessionReset(), ev.SessionReset()], expected_version=0, recorded_at=at)
        log.append("b", [ev.SessionReset()], expected_version=0, meta={"client_id": "c"})
    log.append("a", [ev.SessionReset()], expected_version=2)
    return log.read_records()


def test_read_records_gives_the_stored_bytes(log: EventLog) -> None:
    records = build_source(log)
    assert [env.position for env, _ in records] == [1, 2, 3, 4]
    assert [rec[3:35] for _, rec in records] == [env.hash for env, _ in records]
    assert log.read_records(after=2, limit=1) == records[2:3]
    assert log.read_records(after=4) == []


def test_import_records_copies_a_log_byte_for_byte(log: EventLog, log_factory: Any) -> None:
    source = log_factory("memory")
    records = build_source(source)
    imported = log.import_records([rec for _, rec in records[:3]])
    assert [env.position for env in imported] == [1, 2, 3]
    log.import_records([records[3][1]])
    assert log.read_records() == records
    assert log.head_hash == source.head_hash
    assert (log.stream_version("a"), log.stream_version("b")) == (3, 1)
    report = log.verify()
    assert (report.ok, report.events_checked, report.streams_checked) == (True, 4, 2)
    assert log.append("a", [ev.SessionReset()], expected_version=3) == [5]


def test_import_records_refuses_records_that_do_not_follow_the_head(
    log: EventLog, log_factory: Any
) -> None:
    records = [rec for _, rec in build_source(log_factory("memory"))]
    damaged = bytearray(records[1])
    damaged[-1] ^= 1
    cases: list[tuple[list[Any], type[Exception], str]] = [
        ([records[1]], IntegrityError, "position 1: hash chain broken"),
        ([records[0], bytes(damaged)], IntegrityError, "position 2: hash chain broken"),
        ([records[0], records[0]], IntegrityError, "position 2: hash chain broken"),
        ([records[0], "text"], IntegrityError, "position 2: expected the stored bytes of a record"),
        ([b"\x00" * 50], IntegrityError, "position 1: not a sessionlog record"),
    ]
    for batch, error, message in cases:
        with pytest.raises(error, match=message):
            log.import_records(batch)
        assert log.head == 0
    with pytest.raises(InvalidArgumentError, match="records must be a list or tuple"):
        log.import_records(iter(records))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="stop"), log.transaction() as tx:
        tx.import_records(records)
        raise RuntimeError("stop")
    assert log.head == 0
    assert log.import_records([]) == []


def forged(stream: str, version: int, position: int = 1) -> bytes:
    """A record with a valid hash chain but content no log would write."""
    records, _ = encode_records(
        GENESIS_HASH,
        position,
        stream,
        version,
        datetime(2025, 1, 1, tzinfo=UTC),
        {},
        [ev.SessionReset()],
        limits.event_bytes_max,
    )
    return bytes(records[0])


def test_record_checker_refuses_versions_and_streams_a_log_never_writes() -> None:
    with pytest.raises(IntegrityError, match="version 2 of stream `a`, expected version 1"):
        RecordChecker().check(forged("a", 2))
    with pytest.raises(IntegrityError, match="stream name 'a\\\\x00b'"):
        RecordChecker().check(forged("a\x00b", 1))
    with pytest.raises(IntegrityError, match="over stream_name_bytes_max"):
        RecordChecker().check(forged("s" * 300, 1))
    checker = RecordChecker(stream_version=lambda stream: 1)
    assert checker.check(forged("a", 2)).version == 2
    assert (checker.head, checker.versions) == (1, {"a": 2})


def test_import_records_runs_the_projector(tmp_path: Path) -> None:
    with SessionStore.memory() as source, SessionStore.open(tmp_path / "t") as target:
        source.open_session("a")
        source.inject("a", {"role": "user", "content": "hi"})
        source.fork("a", "b")
        records = [rec for _, rec in source.log.read_records()]
        target.log.import_records(records)
        assert target.messages("b") == [{"role": "user", "content": "hi"}]
        assert target.snapshot("a") == source.snapshot("a")


# Events of several sessions in one import batch: each message is filed under its own session


def interleave(store: SessionStore, order: list[int], sessions_count: int) -> None:
    """Open `sessions_count` sessions, then inject one message at a time in `order` (each entry
    names a session): single `message_injected` events of different sessions side by side."""
    for index in range(sessions_count):
        store.open_session(f"s{index}")
    for turn, index in enumerate(order):
        role = "user" if turn % 2 else "assistant"
        store.inject(f"s{index}", {"role": role, "content": f"s{index} turn {turn}"})


def assert_same_transcripts(source: SessionStore, target: SessionStore, count: int) -> None:
    for index in range(count):
        sid = f"s{index}"
        assert target.messages(sid) == source.messages(sid), sid
        assert target.length(sid) == source.length(sid)
    assert target.log.head_hash == source.log.head_hash


@pytest.mark.parametrize("kind", ["memory", "lmdb"])
def test_alternating_injects_to_several_sessions_round_trip_session_by_session(
    tmp_path: Path, kind: str
) -> None:
    """`import_log` folds a whole batch of events at once, where runs of one-message events
    are folded together: a run must never cross from one session into the next."""
    order = [turn % 3 for turn in range(30)] + [0, 0, 1, 2, 2, 2, 1, 0]
    with SessionStore.open(tmp_path / "source", sync=False) as source:
        interleave(source, order, 3)
        export_log(source, tmp_path / "log.jsonl")
        with (
            SessionStore.memory() if kind == "memory" else SessionStore.open(tmp_path / "copy")
        ) as target:
            import_log(target, tmp_path / "log.jsonl")
            assert_same_transcripts(source, target, 3)
            assert [m["content"] for m in target.messages("s1")][:2] == ["s1 turn 1", "s1 turn 4"]
            assert target.verify(projections=True).ok


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    sessions_count=st.integers(2, 4),
    order=st.lists(st.integers(0, 3), min_size=2, max_size=40),
)
def test_any_interleaving_of_sessions_round_trips(sessions_count: int, order: list[int]) -> None:
    order = [index % sessions_count for index in order]
    with SessionStore.memory() as source, SessionStore.memory() as target:
        interleave(source, order, sessions_count)
        out = io.BytesIO()
        export_log(source, out)
        import_log(target, io.BytesIO(out.getvalue()))
        assert_same_transcripts(source, target, sessions_count)
