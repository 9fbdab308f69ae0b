"""Bad input gets a typed error that names what was wrong, and the log is left exactly as it was.

Every case runs on both logs, twice: called directly, and inside an enclosing transaction that
catches the error and commits (an append is atomic on its own, so a refused append inside a
transaction leaves the rest of it intact). After each refusal the head, head hash, every event and
all projection state are compared with a snapshot taken before.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import eventlog.errors
from eventlog import (
    ANY,
    NO_STREAM,
    ConcurrencyError,
    Envelope,
    EventLog,
    InvalidArgumentError,
    LimitExceededError,
    SessionLogError,
    StorageError,
    limits,
)
from eventlog.events import (
    Event,
    Message,
    MessageInjected,
    SessionOpened,
    SessionTrimmed,
)

AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


class Opaque:
    """An object msgpack has no encoding for."""


def said(text: str) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content=text))


def append(events: Any, stream: Any = "s", **options: Any) -> Callable[[EventLog], object]:
    options.setdefault("expected_version", ANY)
    options.setdefault("recorded_at", AT)
    return lambda log: log.append(stream, events, **options)


def in_transaction(action: Callable[[Any], object]) -> Callable[[EventLog], object]:
    """Run `action` on a (possibly nested) transaction of the log."""

    def run(log: EventLog) -> object:
        with log.transaction() as tx:
            return action(tx)

    return run


def in_view(action: Callable[[Any], object]) -> Callable[[EventLog], object]:
    def run(log: EventLog) -> object:
        with log.view() as view:
            return action(view)

    return run


@dataclass(frozen=True)
class Case:
    action: Callable[[EventLog], object]
    error: type[SessionLogError]
    says: str


BIG = "x" * limits.event_bytes_max

CASES: dict[str, Case] = {
    # Events
    "oversized-event": Case(append([said(BIG)]), LimitExceededError, "exceeds event_bytes_max"),
    "oversized-second-event": Case(
        append([said("fine"), said(BIG)]), LimitExceededError, "event 1 (MessageInjected)"
    ),
    "too-many-events": Case(
        append([said("x")] * (limits.events_per_append_max + 1)),
        LimitExceededError,
        f"{limits.events_per_append_max + 1} exceeds events_per_append_max",
    ),
    "object-in-content": Case(
        append([MessageInjected(message=Message(role="user", content=["ok", Opaque()]))]),
        InvalidArgumentError,
        "event 0 (MessageInjected) for stream `s` cannot be stored",
    ),
    "object-in-metadata": Case(
        append([MessageInjected(message=Message(role="user", metadata={"k": Opaque()}))]),
        InvalidArgumentError,
        "cannot be stored",
    ),
    "unorderable-set-in-metadata": Case(
        append([MessageInjected(message=Message(role="user", metadata={"k": {1, "a"}}))]),
        InvalidArgumentError,
        "cannot be stored",
    ),
    "non-str-key-in-metadata": Case(
        append([MessageInjected(message=Message(role="user", metadata={1: "v"}))]),  # type: ignore[dict-item]
        InvalidArgumentError,
        "cannot be stored",
    ),
    "int-too-big": Case(
        append([SessionTrimmed(keep_last=2**64, kept_count=1)]),
        InvalidArgumentError,
        "cannot be stored",
    ),
    "wrongly-typed-role": Case(
        append([said("ok"), MessageInjected(message=Message(role=5))]),  # type: ignore[arg-type]
        InvalidArgumentError,
        "message.role",
    ),
    "wrongly-typed-int": Case(
        append([SessionTrimmed(keep_last="3", kept_count=1)]),  # type: ignore[arg-type]
        InvalidArgumentError,
        "keep_last",
    ),
    "empty-event-list": Case(append([]), InvalidArgumentError, "at least one event"),
    "empty-event-tuple": Case(append(()), InvalidArgumentError, "at least one event"),
    "events-generator": Case(
        append(said(str(n)) for n in range(2)), InvalidArgumentError, "list or tuple"
    ),
    "single-event-not-in-list": Case(append(said("x")), InvalidArgumentError, "list or tuple"),
    "events-none": Case(append(None), InvalidArgumentError, "got NoneType"),
    "dict-as-event": Case(
        append([said("ok"), {"type": "message_injected"}]),
        InvalidArgumentError,
        "event 1 must be an eventlog.events.Event, got dict",
    ),
    "message-as-event": Case(
        append([Message(role="user")]), InvalidArgumentError, "event 0 must be"
    ),
    "event-base-class": Case(append([Event()]), InvalidArgumentError, "cannot be stored"),
    # Time
    "naive-recorded-at": Case(
        append([said("x")], recorded_at=datetime(2024, 5, 1)),
        InvalidArgumentError,
        "recorded_at must be a timezone-aware datetime",
    ),
    "str-recorded-at": Case(
        append([said("x")], recorded_at="2024-05-01T00:00:00Z"),
        InvalidArgumentError,
        "recorded_at",
    ),
    # Stream names
    "empty-stream": Case(append([said("x")], ""), InvalidArgumentError, "must not be empty"),
    "long-stream": Case(
        append([said("x")], "x" * (limits.stream_name_bytes_max + 1)),
        LimitExceededError,
        "257 exceeds stream_name_bytes_max",
    ),
    "long-stream-in-utf8": Case(
        append([said("x")], "é" * (limits.stream_name_bytes_max // 2 + 1)),
        LimitExceededError,
        "258 exceeds stream_name_bytes_max",
    ),
    "nul-in-stream": Case(append([said("x")], "a\x00b"), InvalidArgumentError, "NUL"),
    "surrogate-in-stream": Case(append([said("x")], "a\ud800"), InvalidArgumentError, "UTF-8"),
    "int-stream": Case(append([said("x")], 5), InvalidArgumentError, "must be a str, got int"),
    "bytes-stream": Case(
        append([said("x")], b"s"), InvalidArgumentError, "must be a str, got bytes"
    ),
    "none-stream": Case(
        append([said("x")], None), InvalidArgumentError, "must be a str, got NoneType"
    ),
    # Expected version
    "str-expected": Case(
        append([said("x")], expected_version="0"), InvalidArgumentError, "got str"
    ),
    "float-expected": Case(
        append([said("x")], expected_version=1.0), InvalidArgumentError, "got float"
    ),
    "bool-expected": Case(
        append([said("x")], expected_version=True), InvalidArgumentError, "got bool"
    ),
    "none-expected": Case(
        append([said("x")], expected_version=None), InvalidArgumentError, "got NoneType"
    ),
    "enum-name-expected": Case(
        append([said("x")], expected_version="ANY"), InvalidArgumentError, "expected_version"
    ),
    "negative-expected": Case(
        append([said("x")], expected_version=-1), InvalidArgumentError, ">= 0, got -1"
    ),
    # Meta
    "list-meta": Case(
        append([said("x")], meta=[("k", "v")]), InvalidArgumentError, "meta must be a dict"
    ),
    "int-key-meta": Case(append([said("x")], meta={1: "v"}), InvalidArgumentError, "str keys"),
    "unencodable-meta": Case(
        append([said("x")], meta={"k": Opaque()}), InvalidArgumentError, "meta cannot be stored"
    ),
    "oversized-meta": Case(
        append([said("x")], meta={"k": "x" * limits.meta_bytes_max}),
        LimitExceededError,
        "exceeds meta_bytes_max",
    ),
    # Projection state
    "str-key-put": Case(
        in_transaction(lambda tx: tx.kv_put("k", b"v")),
        InvalidArgumentError,
        "projection key must be bytes, got str",
    ),
    "empty-key-put": Case(
        in_transaction(lambda tx: tx.kv_put(b"", b"v")), InvalidArgumentError, "got 0"
    ),
    "long-key-put": Case(
        in_transaction(lambda tx: tx.kv_put(b"k" * (limits.kv_key_bytes_max + 1), b"v")),
        InvalidArgumentError,
        f"1 to {limits.kv_key_bytes_max} bytes, got {limits.kv_key_bytes_max + 1}",
    ),
    "bytearray-key-put": Case(
        in_transaction(lambda tx: tx.kv_put(bytearray(b"k"), b"v")),
        InvalidArgumentError,
        "got bytearray",
    ),
    "str-value-put": Case(
        in_transaction(lambda tx: tx.kv_put(b"k", "v")),
        InvalidArgumentError,
        "projection value must be bytes, got str",
    ),
    "none-value-put": Case(
        in_transaction(lambda tx: tx.kv_put(b"k", None)),
        InvalidArgumentError,
        "projection value must be bytes, got NoneType",
    ),
    "oversized-value-put": Case(
        in_transaction(lambda tx: tx.kv_put(b"k", bytes(limits.kv_value_bytes_max + 1))),
        LimitExceededError,
        "exceeds kv_value_bytes_max",
    ),
    "str-key-put-many": Case(
        in_transaction(lambda tx: tx.kv_put_many([(b"a", b"1"), ("k", b"v")])),
        InvalidArgumentError,
        "projection key must be bytes, got str",
    ),
    "long-key-put-many": Case(
        in_transaction(lambda tx: tx.kv_put_many([(b"k" * (limits.kv_key_bytes_max + 1), b"")])),
        InvalidArgumentError,
        f"1 to {limits.kv_key_bytes_max} bytes",
    ),
    "str-value-put-many": Case(
        in_transaction(lambda tx: tx.kv_put_many([(b"a", b"1"), (b"k", "v")])),
        InvalidArgumentError,
        "projection value must be bytes, got str",
    ),
    "oversized-value-put-many": Case(
        in_transaction(lambda tx: tx.kv_put_many([(b"k", bytes(limits.kv_value_bytes_max + 1))])),
        LimitExceededError,
        "exceeds kv_value_bytes_max",
    ),
    "str-key-get": Case(
        in_view(lambda view: view.kv_get("k")), InvalidArgumentError, "must be bytes, got str"
    ),
    "str-key-delete": Case(
        in_transaction(lambda tx: tx.kv_delete("k")),
        InvalidArgumentError,
        "must be bytes, got str",
    ),
    "empty-key-delete": Case(
        in_transaction(lambda tx: tx.kv_delete(b"")), InvalidArgumentError, "got 0"
    ),
    "str-prefix-scan": Case(
        in_view(lambda view: view.kv_scan("k")), InvalidArgumentError, "prefix"
    ),
    "str-start-scan": Case(
        in_view(lambda view: view.kv_scan(start="k")), InvalidArgumentError, "start"
    ),
    "int-stop-scan": Case(in_view(lambda view: view.kv_scan(stop=3)), InvalidArgumentError, "stop"),
    "negative-limit-scan": Case(
        in_view(lambda view: view.kv_scan(limit=-1)), InvalidArgumentError, "limit"
    ),
    "str-limit-scan": Case(
        in_view(lambda view: view.kv_scan(limit="2")), InvalidArgumentError, "limit"
    ),
    # Reads
    "negative-after-read": Case(
        lambda log: log.read(after=-1), InvalidArgumentError, "`after` must be an int from 0 to"
    ),
    "after-past-any-position": Case(
        lambda log: log.read(after=2**64), InvalidArgumentError, "`after` must be an int from 0 to"
    ),
    "zero-limit-read": Case(
        lambda log: log.read(limit=0), InvalidArgumentError, "`limit` must be an int >= 1"
    ),
    "negative-limit-read": Case(lambda log: log.read(limit=-5), InvalidArgumentError, "got -5"),
    "float-after-read": Case(lambda log: log.read(after=1.0), InvalidArgumentError, "`after`"),
    "huge-limit-read": Case(
        lambda log: log.read(limit=limits.read_page_events_max + 1),
        LimitExceededError,
        "exceeds read_page_events_max",
    ),
    "negative-after-read-stream": Case(
        lambda log: log.read_stream("s", after=-1), InvalidArgumentError, "read_stream: `after`"
    ),
    "zero-limit-read-stream": Case(
        lambda log: log.read_stream("s", limit=0), InvalidArgumentError, "read_stream: `limit`"
    ),
    "bad-stream-read-stream": Case(
        lambda log: log.read_stream(""), InvalidArgumentError, "must not be empty"
    ),
    "bad-stream-version": Case(lambda log: log.stream_version(7), InvalidArgumentError, "got int"),
    "bad-stream-tail": Case(
        lambda log: next(log.tail(stream="a\x00")), InvalidArgumentError, "NUL"
    ),
    "negative-after-subscribe": Case(
        lambda log: log.subscribe(print, after=-1), InvalidArgumentError, "subscribe: `after`"
    ),
    "bad-stream-subscribe": Case(
        lambda log: log.subscribe(print, stream=""), InvalidArgumentError, "must not be empty"
    ),
    # Concurrency: not bad input, but refused the same way.
    "stale-version": Case(
        append([said("x")], expected_version=0), ConcurrencyError, "expected version 0"
    ),
    "no-stream-on-existing": Case(
        append([said("x")], expected_version=NO_STREAM), ConcurrencyError, "got 2"
    ),
}


@dataclass(frozen=True)
class Snapshot:
    head: int
    head_hash: bytes
    events: list[Envelope]
    kv: list[tuple[bytes, bytes]]
    version: int


def snapshot(log: EventLog) -> Snapshot:
    with log.view() as view:
        kv = view.kv_scan()
    return Snapshot(log.head, log.head_hash, log.read(), kv, log.stream_version("s"))


@pytest.fixture
def seeded(log: EventLog) -> Iterator[EventLog]:
    """A log holding two events in stream `s`, one in `t`, and two projection keys."""
    log.append("s", [said("one"), said("two")], expected_version=NO_STREAM, recorded_at=AT)
    log.append("t", [said("three")], expected_version=NO_STREAM, recorded_at=AT)
    with log.transaction() as tx:
        tx.kv_put(b"k", b"v")
        tx.kv_put(b"k2", b"v2")
    yield log


def check_refusal(log: EventLog, case: Case) -> SessionLogError:
    with pytest.raises(case.error, match=re.escape(case.says)) as caught:
        case.action(log)
    error = caught.value
    assert type(error) is case.error, f"{type(error).__name__} is not {case.error.__name__}"
    assert isinstance(error, SessionLogError)
    if isinstance(error, InvalidArgumentError):
        assert isinstance(error, ValueError)
    return error


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_refused_and_changes_nothing(seeded: EventLog, name: str) -> None:
    before = snapshot(seeded)
    check_refusal(seeded, CASES[name])
    assert snapshot(seeded) == before
    assert seeded.verify().ok
    # The log still takes good input, at the next position.
    assert seeded.append("s", [said("after")], expected_version=2) == [before.head + 1]


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_inside_a_transaction_leaves_the_rest_of_it(seeded: EventLog, name: str) -> None:
    before = snapshot(seeded)
    with seeded.transaction() as tx:
        tx.append("u", [said("before the error")], expected_version=NO_STREAM, recorded_at=AT)
        check_refusal(seeded, CASES[name])
        tx.append("u", [said("after the error")], expected_version=1, recorded_at=AT)
    after = snapshot(seeded)
    assert after.events[: before.head] == before.events
    assert [e.stream for e in after.events[before.head :]] == ["u", "u"]
    assert [e.position for e in after.events[before.head :]] == [before.head + 1, before.head + 2]
    assert (after.kv, after.version) == (before.kv, before.version)
    assert seeded.verify().ok


def test_limit_errors_carry_the_limit_and_the_value(log: EventLog) -> None:
    with pytest.raises(LimitExceededError) as caught:
        log.append(
            "s", [said("x")] * (limits.events_per_append_max + 1), expected_version=NO_STREAM
        )
    error = caught.value
    assert error.what == "events in one append"
    assert error.limit_name == "events_per_append_max"
    assert error.limit == limits.events_per_append_max
    assert error.actual == limits.events_per_append_max + 1


def test_an_event_just_under_the_size_limit_is_stored(log: EventLog) -> None:
    text = "x" * (limits.event_bytes_max - 1024)
    assert log.append("s", [said(text)], expected_version=NO_STREAM) == [1]
    (envelope,) = log.read()
    assert isinstance(envelope.data, MessageInjected)
    assert envelope.data.message.content == text


def test_names_at_the_stream_limit_and_aware_times_are_accepted(log: EventLog) -> None:
    longest = "é" * (limits.stream_name_bytes_max // 2)
    assert log.append(longest, [said("x")], expected_version=NO_STREAM) == [1]
    assert log.stream_version(longest) == 1
    plus_two = timezone(timedelta(hours=2))
    log.append("s", [said("y")], expected_version=NO_STREAM, recorded_at=AT.astimezone(plus_two))
    assert log.read()[-1].recorded_at == AT
    meta = {"k": "x" * (limits.meta_bytes_max - 16)}
    log.append("s", [said("z")], expected_version=1, meta=meta)
    assert log.read()[-1].meta == meta


def test_a_caught_error_in_a_second_append_keeps_the_first(log: EventLog) -> None:
    with log.transaction() as tx:
        assert tx.append("a", [said("first")], expected_version=NO_STREAM) == [1]
        with pytest.raises(InvalidArgumentError, match=r"message\.role"):
            tx.append(
                "b",
                [said("fine"), MessageInjected(message=Message(role=5))],  # type: ignore[arg-type]
                expected_version=NO_STREAM,
            )
        with pytest.raises(ConcurrencyError):
            tx.append("a", [said("stale")], expected_version=0)
        assert tx.head == 1
        assert tx.stream_version("b") == 0
        assert tx.append("b", [said("second")], expected_version=NO_STREAM) == [2]
    assert [(e.stream, e.version, e.position) for e in log.read()] == [("a", 1, 1), ("b", 1, 2)]
    assert log.verify().ok


@pytest.mark.parametrize(
    "second",
    [
        pytest.param(
            lambda tx: tx.append("b", [said("x"), said(BIG)], expected_version=0), id="big"
        ),
        pytest.param(lambda tx: tx.append("a", [said("x")], expected_version=0), id="stale"),
        pytest.param(lambda tx: tx.kv_put(b"", b"v"), id="bad-key"),
    ],
)
def test_an_uncaught_error_in_a_second_append_drops_the_first(
    log: EventLog, second: Callable[[Any], object]
) -> None:
    with pytest.raises(SessionLogError), log.transaction() as tx:
        tx.append("a", [said("first")], expected_version=NO_STREAM)
        tx.kv_put(b"k", b"v")
        second(tx)
    assert log.head == 0
    assert log.read() == []
    assert log.stream_version("a") == 0
    with log.view() as view:
        assert view.kv_scan() == []


def test_every_error_is_a_session_log_error() -> None:
    classes = [
        value
        for value in vars(eventlog.errors).values()
        if isinstance(value, type) and issubclass(value, BaseException)
    ]
    assert len(classes) >= 12
    for cls in classes:
        assert issubclass(cls, SessionLogError), cls
    for cls in (InvalidArgumentError, LimitExceededError):
        assert issubclass(cls, ValueError)
    assert issubclass(LimitExceededError, InvalidArgumentError)
    assert not issubclass(ConcurrencyError, ValueError)
    assert issubclass(eventlog.errors.StorageError, OSError)
    assert issubclass(eventlog.errors.UnknownSessionError, KeyError)


def test_session_opened_needs_its_fields(log: EventLog) -> None:
    with pytest.raises(InvalidArgumentError, match="created_at"):
        log.append(
            "s",
            [SessionOpened(session_id="s", created_at="yesterday")],  # type: ignore[arg-type]
            expected_version=NO_STREAM,
        )
    assert log.head == 0


def test_a_failed_projection_delete_leaves_the_transaction_unable_to_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storage error part way through a write, caught by the caller, must not let the rest of
    the transaction commit as if the write had not been tried: put, put_many and delete alike."""
    with EventLog.open(tmp_path / "log") as log:
        with log.transaction() as first:
            first.kv_put(b"a", b"1")
        writes: list[tuple[str, Callable[[Any], object]]] = [
            ("kv_delete", lambda tx: tx.kv_delete(b"a")),
            ("kv_put", lambda tx: tx.kv_put(b"a", b"2")),
            ("kv_put_many", lambda tx: tx.kv_put_many([(b"a", b"2")])),
        ]
        for method, write in writes:
            monkeypatch.setattr(log._storage._txn_type, method, _failing)  # type: ignore[attr-defined]
            with (
                pytest.raises(StorageError, match="a write inside this transaction failed"),
                log.transaction() as tx,
            ):
                log.append("s", [said("kept only if it commits")], expected_version=ANY)
                with pytest.raises(StorageError, match="injected"):
                    write(tx)
            monkeypatch.undo()
            with log.view() as view:
                assert view.kv_get(b"a") == b"1", method
                assert view.head == 0, method


def _failing(*args: object) -> bool:
    raise StorageError("injected storage failure")
