"""The log's contract, run against every implementation: the in-memory reference log and LMDB.

Each test takes the `log` fixture, parametrized over both logs, so a behaviour one of them gets
wrong fails under that log's name. The contract: dense positions and stream versions from 1,
optimistic concurrency that writes nothing on a mismatch, transactions that commit all or nothing
(nested blocks are savepoints), bounded paged reads, ordered projection state, subscriptions that
see committed events exactly once and in order, and byte-identical stores for identical input.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from eventlog import (
    ANY,
    GENESIS_HASH,
    NO_STREAM,
    ConcurrencyError,
    Envelope,
    EventLog,
    ExpectedVersion,
    InvalidArgumentError,
    LimitExceededError,
    LogClosedError,
    cluster_key,
    limits,
)
from eventlog.events import (
    Event,
    Message,
    MessageInjected,
    SessionOpened,
    SessionRenamed,
    SessionTrimmed,
    Usage,
)
from tests.test_log_statemachine import scan_model

AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


class Boom(Exception):
    """Raised by a test to abort a transaction."""


def said(text: str) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content=text))


def said_many(prefix: str, count: int) -> list[Event]:
    return [said(f"{prefix}{index}") for index in range(count)]


def texts(envelopes: list[Envelope]) -> list[str]:
    out: list[str] = []
    for envelope in envelopes:
        assert isinstance(envelope.data, MessageInjected)
        content = envelope.data.message.content
        assert isinstance(content, str)
        out.append(content)
    return out


def positions(envelopes: list[Envelope]) -> list[int]:
    return [envelope.position for envelope in envelopes]


def kv_all(log: EventLog) -> list[tuple[bytes, bytes]]:
    with log.view() as view:
        return view.kv_scan()


def bulk(log: EventLog, stream: str, count: int) -> None:
    """Append `count` small events to `stream`, in as few appends as the limit allows."""
    done = log.stream_version(stream)
    while count:
        chunk = min(count, limits.events_per_append_max)
        log.append(stream, said_many("", chunk), expected_version=done)
        done += chunk
        count -= chunk


def fill(log: EventLog, plan: list[tuple[str, int]]) -> None:
    """Append `count` events to `stream` for each pair of `plan`, one append per pair."""
    for number, (stream, count) in enumerate(plan):
        log.append(
            stream,
            said_many(f"{stream}.{number}.", count),
            expected_version=ANY,
            recorded_at=AT + timedelta(seconds=number),
        )


# Positions, versions, head


def test_an_empty_log_has_nothing(log: EventLog) -> None:
    assert log.head == 0
    assert log.head_hash == GENESIS_HASH
    assert log.read() == []
    assert log.read_stream("s") == []
    assert log.stream_version("s") == 0
    assert list(log.iter_all()) == []
    report = log.verify()
    assert report.ok
    assert (report.events_checked, report.streams_checked) == (0, 0)
    assert report.head_hash == GENESIS_HASH


def test_positions_are_dense_from_one_and_versions_dense_per_stream(log: EventLog) -> None:
    assert log.append("a", said_many("a", 3), expected_version=NO_STREAM) == [1, 2, 3]
    assert log.append("b", said_many("b", 2), expected_version=NO_STREAM) == [4, 5]
    assert log.append("a", said_many("a", 1), expected_version=3) == [6]
    assert log.append("c", (said("c"),), expected_version=0) == [7]

    everything = log.read()
    assert positions(everything) == list(range(1, 8))
    assert [(e.stream, e.version) for e in everything] == [
        ("a", 1),
        ("a", 2),
        ("a", 3),
        ("b", 1),
        ("b", 2),
        ("a", 4),
        ("c", 1),
    ]
    assert [(e.version, e.position) for e in log.read_stream("a")] == [
        (1, 1),
        (2, 2),
        (3, 3),
        (4, 6),
    ]
    assert log.head == 7
    assert (log.stream_version("a"), log.stream_version("b"), log.stream_version("c")) == (4, 2, 1)
    assert log.stream_version("missing") == 0


def test_an_envelope_carries_what_was_appended(log: EventLog) -> None:
    opened = SessionOpened(session_id="s-1", created_at=AT, title="hello", metadata={"k": [1, 2]})
    reply = MessageInjected(
        message=Message(role="assistant", content="hi", usage=Usage(input_tokens=3))
    )
    meta = {"client": "c-1", "correlation": {"id": 7}}
    log.append("s-1", [opened, reply], expected_version=NO_STREAM, meta=meta, recorded_at=AT)

    first, second = log.read()
    assert first.data == opened
    assert second.data == reply
    assert (first.type, second.type) == ("session_opened", "message_injected")
    assert first.meta == second.meta == meta
    assert first.recorded_at == second.recorded_at == AT
    assert first.hash != second.hash
    assert log.head_hash == second.hash


def test_recorded_at_defaults_to_now_in_utc(log: EventLog) -> None:
    before = datetime.now(UTC)
    log.append("s", [said("x")], expected_version=ANY)
    after = datetime.now(UTC)
    (envelope,) = log.read()
    assert envelope.recorded_at.utcoffset() == timedelta(0)
    assert before <= envelope.recorded_at <= after
    assert envelope.meta == {}


def test_head_hash_follows_every_append(log: EventLog) -> None:
    seen = [log.head_hash]
    for index in range(5):
        log.append(f"s{index % 2}", [said(str(index))], expected_version=ANY, recorded_at=AT)
        assert log.head_hash == log.read()[-1].hash
        seen.append(log.head_hash)
    assert len(set(seen)) == len(seen), "identical events at new positions must hash differently"


# Optimistic concurrency


def test_no_stream_any_and_exact_versions_accept_the_right_state(log: EventLog) -> None:
    assert log.append("s", [said("1")], expected_version=NO_STREAM) == [1]
    assert log.append("s", [said("2")], expected_version=ANY) == [2]
    assert log.append("s", [said("3")], expected_version=2) == [3]
    assert log.append("t", [said("4")], expected_version=ANY) == [4]
    assert log.append("u", [said("5")], expected_version=0) == [5]
    assert log.stream_version("s") == 3


@pytest.mark.parametrize(
    ("expected", "stream"),
    [
        pytest.param(1, "s", id="stale"),
        pytest.param(0, "s", id="zero-on-existing"),
        pytest.param(3, "s", id="from-the-future"),
        pytest.param(NO_STREAM, "s", id="no-stream-on-existing"),
        pytest.param(1, "new", id="int-on-missing"),
    ],
)
def test_a_wrong_expected_version_raises_and_writes_nothing(
    log: EventLog, expected: int | ExpectedVersion, stream: str
) -> None:
    log.append("s", said_many("s", 2), expected_version=NO_STREAM, recorded_at=AT)
    log.append("other", [said("o")], expected_version=NO_STREAM, recorded_at=AT)
    head, head_hash, everything = log.head, log.head_hash, log.read()
    actual = log.stream_version(stream)

    with pytest.raises(ConcurrencyError) as caught:
        log.append(stream, [said("late")], expected_version=expected, recorded_at=AT)

    assert (caught.value.stream, caught.value.expected, caught.value.actual) == (
        stream,
        expected,
        actual,
    )
    assert f"`{stream}`" in str(caught.value)
    assert (log.head, log.head_hash, log.read()) == (head, head_hash, everything)
    assert log.stream_version(stream) == actual
    assert len(log.read_stream(stream)) == actual
    # The next correct append takes the next position: the refused one left no hole.
    assert log.append(stream, [said("ok")], expected_version=actual) == [head + 1]
    assert log.verify().ok


# Transactions


def test_a_transaction_commits_appends_to_several_streams_together(log: EventLog) -> None:
    with log.transaction() as tx:
        assert tx.append("a", said_many("a", 2), expected_version=NO_STREAM) == [1, 2]
        assert tx.append("b", said_many("b", 1), expected_version=NO_STREAM) == [3]
        assert tx.append("a", said_many("a", 1), expected_version=2) == [4]
        tx.kv_put(b"k", b"v")
    assert [(e.stream, e.version) for e in log.read()] == [("a", 1), ("a", 2), ("b", 1), ("a", 3)]
    assert kv_all(log) == [(b"k", b"v")]
    assert log.verify().ok


def test_an_exception_in_a_transaction_writes_nothing(log: EventLog) -> None:
    fill(log, [("a", 2)])
    with log.transaction() as tx:
        tx.kv_put(b"kept", b"old")
        tx.kv_put(b"doomed", b"old")
    head, head_hash, everything = log.head, log.head_hash, log.read()
    kv_before = kv_all(log)

    with pytest.raises(Boom), log.transaction() as tx:
        tx.append("a", [said("x")], expected_version=2)
        tx.append("b", said_many("b", 3), expected_version=NO_STREAM)
        log.append("c", [said("via the log")], expected_version=ANY)  # joins the transaction
        tx.kv_put(b"kept", b"new")
        tx.kv_put(b"fresh", b"new")
        assert tx.kv_delete(b"doomed")
        raise Boom

    assert (log.head, log.head_hash, log.read()) == (head, head_hash, everything)
    assert log.read(after=head) == []
    assert log.read_stream("b") == []
    assert log.read_stream("c") == []
    assert (log.stream_version("a"), log.stream_version("b"), log.stream_version("c")) == (2, 0, 0)
    assert kv_all(log) == kv_before
    assert log.append("b", [said("b")], expected_version=NO_STREAM) == [head + 1]
    assert log.verify().ok


def test_a_concurrency_error_escaping_a_transaction_drops_its_earlier_appends(
    log: EventLog,
) -> None:
    fill(log, [("a", 1)])
    head = log.head
    with pytest.raises(ConcurrencyError), log.transaction() as tx:
        tx.append("b", [said("b")], expected_version=NO_STREAM)
        tx.append("a", [said("a")], expected_version=0)
    assert log.head == head
    assert log.stream_version("b") == 0


def test_reads_inside_a_transaction_see_its_own_writes(log: EventLog) -> None:
    fill(log, [("a", 1)])
    with log.transaction() as tx:
        tx.append("a", [said("a2")], expected_version=1)
        tx.append("b", [said("b1")], expected_version=NO_STREAM)
        assert tx.head == log.head == 3
        assert tx.stream_version("a") == log.stream_version("a") == 2
        assert tx.stream_version("b") == 1
        assert texts(tx.read()) == texts(log.read()) == ["a.0.0", "a2", "b1"]
        assert texts(tx.read_stream("a", after=1)) == ["a2"]
        assert texts(log.read_stream("b")) == ["b1"]
        assert log.head_hash == tx.read()[-1].hash
        assert tx.append("b", [said("b2")], expected_version=1) == [4]
        assert log.append("b", [said("b3")], expected_version=2) == [5]
        tx.kv_put(b"k1", b"v1")
        assert tx.kv_get(b"k1") == b"v1"
        assert tx.kv_scan() == [(b"k1", b"v1")]
        assert tx.kv_delete(b"k1")
        assert not tx.kv_delete(b"k1")
        assert tx.kv_get(b"k1") is None
    assert log.head == 5
    assert texts(log.read_stream("b")) == ["b1", "b2", "b3"]


def test_an_inner_failure_undoes_only_the_inner_block(log: EventLog) -> None:
    fill(log, [("a", 1)])
    with log.transaction() as outer:
        outer.append("a", [said("outer 1")], expected_version=1)
        outer.kv_put(b"outer", b"1")
        with pytest.raises(Boom), log.transaction() as inner:
            inner.append("a", [said("inner")], expected_version=2)
            inner.append("b", [said("inner b")], expected_version=NO_STREAM)
            inner.kv_put(b"inner", b"1")
            inner.kv_put(b"outer", b"overwritten")
            assert inner.head == 4
            raise Boom
        assert outer.head == 2
        assert outer.stream_version("a") == 2
        assert outer.stream_version("b") == 0
        assert outer.kv_get(b"outer") == b"1"
        assert outer.kv_get(b"inner") is None
        with log.transaction() as kept:
            kept.append("c", [said("inner kept")], expected_version=NO_STREAM)
            kept.kv_put(b"kept", b"1")
        outer.append("a", [said("outer 2")], expected_version=2)
    assert [(e.stream, e.version) for e in log.read()] == [("a", 1), ("a", 2), ("c", 1), ("a", 3)]
    assert texts(log.read()) == ["a.0.0", "outer 1", "inner kept", "outer 2"]
    assert positions(log.read()) == [1, 2, 3, 4]
    assert kv_all(log) == [(b"kept", b"1"), (b"outer", b"1")]
    assert log.verify().ok


def test_an_outer_failure_undoes_committed_inner_blocks_too(log: EventLog) -> None:
    with pytest.raises(Boom), log.transaction() as outer:
        outer.append("a", [said("outer")], expected_version=NO_STREAM)
        with log.transaction() as inner:
            inner.append("b", [said("inner")], expected_version=NO_STREAM)
            inner.kv_put(b"inner", b"1")
        raise Boom
    assert log.head == 0
    assert kv_all(log) == []
    assert (log.stream_version("a"), log.stream_version("b")) == (0, 0)


def test_a_transaction_cannot_be_used_after_its_block(log: EventLog) -> None:
    with log.transaction() as committed:
        committed.append("a", [said("1")], expected_version=NO_STREAM)
    with pytest.raises(Boom), log.transaction() as aborted:
        raise Boom
    with log.transaction() as outer:
        with log.transaction() as inner:
            pass
        outer.append("a", [said("2")], expected_version=1)
    head, everything = log.head, log.read()
    for tx in (committed, aborted, inner, outer):
        with pytest.raises(InvalidArgumentError, match="transaction has ended"):
            tx.append("a", [said("late")], expected_version=ANY)
        with pytest.raises(InvalidArgumentError, match="transaction has ended"):
            tx.kv_put(b"k", b"v")
        with pytest.raises(InvalidArgumentError, match="transaction has ended"):
            tx.read()
    assert (log.head, log.read()) == (head, everything)
    assert kv_all(log) == []
    assert log.verify().ok


# Paged reads


PLAN = [("a", 4), ("b", 3), ("a", 1), ("c", 6), ("b", 2), ("a", 5), ("c", 2), ("d", 2)]


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 25, 26, 1000])
def test_read_pages_concatenate_to_the_whole_log(log: EventLog, limit: int) -> None:
    fill(log, PLAN)
    whole = log.read(limit=limits.read_page_events_max)
    assert positions(whole) == list(range(1, 26))
    pages: list[list[Envelope]] = []
    after = 0
    while page := log.read(after=after, limit=limit):
        assert len(page) == min(limit, 25 - after)  # full pages, then the rest
        assert page[0].position == after + 1
        pages.append(page)
        after = page[-1].position
    assert [e for page in pages for e in page] == whole
    assert len(pages) == -(-25 // limit)
    assert list(log.iter_all(page_events=limit)) == whole
    assert list(log.iter_all(after=10, page_events=limit)) == whole[10:]


@pytest.mark.parametrize("limit", [1, 2, 5, 11, 12, 1000])
def test_read_stream_pages_concatenate_to_the_whole_stream(log: EventLog, limit: int) -> None:
    fill(log, PLAN)
    for stream, length in [("a", 10), ("b", 5), ("c", 8), ("d", 2)]:
        whole = log.read_stream(stream)
        assert [e.version for e in whole] == list(range(1, length + 1))
        assert whole == [e for e in log.read() if e.stream == stream]
        pages: list[Envelope] = []
        after = 0
        while page := log.read_stream(stream, after=after, limit=limit):
            assert len(page) == min(limit, length - after)
            assert page[0].version == after + 1
            pages.extend(page)
            after = page[-1].version
        assert pages == whole


def test_read_windows_and_ends(log: EventLog) -> None:
    fill(log, PLAN)
    assert positions(log.read(after=10, limit=5)) == [11, 12, 13, 14, 15]
    assert positions(log.read(after=24)) == [25]
    assert log.read(after=25) == []
    assert log.read(after=1000) == []
    assert [e.version for e in log.read_stream("a", after=8, limit=5)] == [9, 10]
    assert log.read_stream("a", after=10) == []
    assert log.read_stream("missing", after=3) == []


def test_read_page_limit_is_enforced(log: EventLog) -> None:
    fill(log, [("a", 3)])
    assert len(log.read(limit=limits.read_page_events_max)) == 3
    assert len(log.read_stream("a", limit=limits.read_page_events_max)) == 3
    for read in (log.read, lambda **kw: log.read_stream("a", **kw)):
        with pytest.raises(LimitExceededError) as caught:
            read(limit=limits.read_page_events_max + 1)
        assert caught.value.limit_name == "read_page_events_max"
        assert caught.value.actual == limits.read_page_events_max + 1


def test_default_page_size(log: EventLog) -> None:
    count = limits.read_page_events_default + 5
    log.append("s", said_many("", count), expected_version=NO_STREAM)
    assert len(log.read()) == limits.read_page_events_default
    assert len(log.read_stream("s")) == limits.read_page_events_default
    assert len(list(log.iter_all())) == count


# Projection state


KEYS = [
    b"\x00",
    b"a",
    b"a\x00",
    b"a\xff",
    b"ab",
    b"ab\x00",
    b"ab\xff",
    b"ab\xff\xff",
    b"abc",
    b"b",
    b"ba",
    b"c",
    b"\xff",
    b"\xff\xff",
    b"\xff\xffz",
]
STORED = {key: b"v" + key for key in KEYS}


def test_kv_scan_orders_filters_and_limits(log: EventLog) -> None:
    with log.transaction() as tx:
        for key in reversed(KEYS):
            tx.kv_put(key, STORED[key])

    prefixes = [b"", b"a", b"ab", b"ab\xff", b"\xff", b"\xff\xff", b"z"]
    bounds = [None, b"", b"a\x00", b"ab", b"ab\xff", b"b", b"\xff", b"\xff\xff\xff"]
    checked = 0
    with log.view() as view:
        for prefix, start, stop, reverse, limit in itertools.product(
            prefixes, bounds, bounds, [False, True], [None, 0, 1, 3]
        ):
            got = view.kv_scan(prefix, start=start, stop=stop, reverse=reverse, limit=limit)
            want = scan_model(STORED, prefix, start, stop, reverse, limit)
            assert got == want, (prefix, start, stop, reverse, limit)
            checked += bool(want)
    assert checked > 500, "most scans should find something"


def test_kv_scan_inside_a_transaction_sees_pending_state(log: EventLog) -> None:
    with log.transaction() as tx:
        tx.kv_put(b"p/2", b"two")
        tx.kv_put(b"p/1", b"one")
        tx.kv_put(b"q/1", b"other")
    with log.transaction() as tx:
        tx.kv_put(b"p/3", b"three")
        tx.kv_put(b"p/1", b"uno")
        assert tx.kv_delete(b"p/2")
        assert tx.kv_scan(b"p/") == [(b"p/1", b"uno"), (b"p/3", b"three")]
        assert tx.kv_scan(b"p/", reverse=True, limit=1) == [(b"p/3", b"three")]
    assert kv_all(log) == [(b"p/1", b"uno"), (b"p/3", b"three"), (b"q/1", b"other")]


def test_kv_cluster_values_reads_one_suffix_of_each_stream_under_a_prefix(log: EventLog) -> None:
    names = ["a", "a\x01", "ab", "abc", "b", "ü"]
    with log.transaction() as tx:
        for name in names:
            tx.append(name, [said(name)], expected_version=ANY)  # index chunks around them
            for suffix in (b"P", b"t", b"tt", b"u"):
                tx.kv_put(cluster_key(name, suffix), name.encode() + suffix)
        tx.kv_put(cluster_key("c", b"t"), b"no events")
        tx.kv_put(b"a\x00t", b"not a cluster key")
    with log.view() as view:
        assert view.kv_cluster_values("a", b"t") == [
            ("a", b"at"),
            ("a\x01", b"a\x01t"),
            ("ab", b"abt"),
            ("abc", b"abct"),
        ]
        assert view.kv_cluster_values("", b"tt") == [(n, n.encode() + b"tt") for n in names]
        assert view.kv_cluster_values("", b"t")[-3:] == [
            ("b", b"bt"),
            ("c", b"no events"),
            ("ü", "ü".encode() + b"t"),
        ]
        assert view.kv_cluster_values("ab", b"x") == []
        assert view.kv_cluster_values("d", b"t") == []
    with log.transaction() as tx:  # inside a transaction: its own writes and deletions
        tx.kv_delete(cluster_key("ab", b"t"))
        tx.kv_put(cluster_key("abd", b"t"), b"new")
        assert tx.kv_cluster_values("ab", b"t") == [("abc", b"abct"), ("abd", b"new")]
        for prefix, suffix in ((b"a", b"t"), ("a\x00", b"t"), ("a", "t"), ("\ud800", b"t")):
            with pytest.raises(InvalidArgumentError, match="kv_cluster_values"):
                tx.kv_cluster_values(prefix, suffix)  # type: ignore[arg-type]


def test_kv_values_are_bytes_whatever_buffer_was_given(log: EventLog) -> None:
    with log.transaction() as tx:
        tx.kv_put(b"a", bytearray(b"one"))
        tx.kv_put(b"b", memoryview(b"two"))
        tx.kv_put(b"empty", b"")
    with log.view() as view:
        assert view.kv_get(b"a") == b"one"
        assert view.kv_get(b"b") == b"two"
        assert view.kv_get(b"empty") == b""
        assert view.kv_get(b"none") is None
        assert all(type(value) is bytes for _, value in view.kv_scan())


def test_kv_put_many_writes_every_pair_over_earlier_values(log: EventLog) -> None:
    # What a projection defers or caches over these writes: tests/test_projection_pending.py.
    with log.transaction() as tx:
        tx.kv_put(b"a", b"old")
        tx.kv_put_many([(b"c", b"3"), (b"a", bytearray(b"1")), (b"b", memoryview(b"2"))])
        assert tx.kv_scan() == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
        tx.kv_put_many([])
    assert kv_all(log) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]


def test_a_checked_append_reads_back_the_same_events(log: EventLog) -> None:
    seen = Recorder()
    log.subscribe(seen, after=0)
    with log.transaction() as tx:
        tx.append("a", said_many("a", 3), expected_version=NO_STREAM, checked=True)
        tx.append("a", said_many("b", 2), expected_version=3, meta={"k": "v"}, checked=True)
    stored = log.read()
    assert seen.seen == stored
    assert texts(stored) == ["a0", "a1", "a2", "b0", "b1"]
    assert [e.meta for e in stored] == [{}, {}, {}, {"k": "v"}, {"k": "v"}]
    assert seen.seen[3].meta is not seen.seen[4].meta  # each envelope has its own meta dict
    assert log.verify().ok


def test_a_huge_transaction_keeps_no_decoded_events_and_still_delivers_them_in_order(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `pending_record_bytes_max` a transaction keeps only how many events it appended;
    subscribers still get every one, in order, read back from the log in pages, and the events a
    subscriber appends while they are delivered come after all of them."""
    monkeypatch.setattr(limits, "pending_record_bytes_max", 2_000)
    monkeypatch.setattr(limits, "read_page_events_default", 7)
    seen: list[int] = []

    def echo(envelope: Envelope) -> None:
        seen.append(envelope.position)
        if envelope.stream == "a" and envelope.version == 3:
            log.append("echo", [said("reply")], expected_version=ANY)

    log.subscribe(echo)
    with log.transaction() as tx:
        for first in range(0, 60, 6):
            tx.append("a", said_many(f"{first}-", 6), expected_version=first or NO_STREAM)
        assert tx.pending_count == 60
        assert tx.pending == []  # nothing decoded is held for delivery
        with log.transaction() as inner:  # a savepoint carries the count up
            inner.append("b", [said("b")], expected_version=NO_STREAM)
        assert tx.pending_count == 61
    assert seen == list(range(1, 63))
    assert [e.stream for e in log.read(after=60)] == ["b", "echo"]


# Idempotency keys: a command retried after an unknown outcome writes once


def test_a_retried_append_with_the_same_key_writes_once(log: EventLog) -> None:
    first = log.append(
        "s", [said("a"), said("b")], expected_version=NO_STREAM, meta={"idempotency_key": "req-1"}
    )
    # The retry carries the version the caller expected the first time: the key decides.
    again = log.append(
        "s", [said("a"), said("b")], expected_version=NO_STREAM, meta={"idempotency_key": "req-1"}
    )
    assert first == again == [1, 2]
    assert log.head == 2
    assert log.append("s", [said("c")], expected_version=2, meta={"idempotency_key": "req-2"})
    with pytest.raises(InvalidArgumentError, match="was used for stream `s`"):
        log.append("t", [said("x")], expected_version=NO_STREAM, meta={"idempotency_key": "req-1"})
    with pytest.raises(InvalidArgumentError, match="non-empty str"):
        log.append("s", [said("x")], expected_version=3, meta={"idempotency_key": 7})
    with pytest.raises(LimitExceededError, match="idempotency_key_chars_max"):
        log.append(
            "s",
            [said("x")],
            expected_version=3,
            meta={"idempotency_key": "k" * (limits.idempotency_key_chars_max + 1)},
        )
    assert log.head == 3
    assert log.verify().ok


def test_a_key_from_an_aborted_transaction_is_forgotten(log: EventLog) -> None:
    with pytest.raises(ConcurrencyError), log.transaction() as tx:
        tx.append("s", [said("a")], expected_version=NO_STREAM, meta={"idempotency_key": "k"})
        tx.append("s", [said("b")], expected_version=NO_STREAM)  # stale: aborts the whole
    assert log.head == 0
    assert log.append(
        "s", [said("a")], expected_version=NO_STREAM, meta={"idempotency_key": "k"}
    ) == [1]


def test_an_idempotency_key_outlives_a_reopen(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        log.append("s", [said("a")], expected_version=NO_STREAM, meta={"idempotency_key": "k"})
    with EventLog.open(tmp_path / "log") as again:
        assert again.append(
            "s", [said("a")], expected_version=NO_STREAM, meta={"idempotency_key": "k"}
        ) == [1]
        assert again.head == 1


# Subscriptions


class Recorder:
    def __init__(self) -> None:
        self.seen: list[Envelope] = []

    def __call__(self, envelope: Envelope) -> None:
        self.seen.append(envelope)

    @property
    def positions(self) -> list[int]:
        return positions(self.seen)


def test_subscribe_catches_up_then_goes_live_without_gap_or_repeat(log: EventLog) -> None:
    fill(log, [("a", 3), ("b", 2)])
    from_two, from_start, live_only = Recorder(), Recorder(), Recorder()
    log.subscribe(from_two, after=2)
    log.subscribe(from_start, after=0)
    log.subscribe(live_only)
    assert from_two.positions == [3, 4, 5]
    assert from_start.positions == [1, 2, 3, 4, 5]
    assert live_only.positions == []

    fill(log, [("a", 2), ("c", 1)])
    assert from_two.positions == list(range(3, 9))
    assert from_start.seen == log.read()
    assert live_only.positions == [6, 7, 8]


def test_subscribe_catch_up_spans_several_pages(log: EventLog) -> None:
    count = limits.read_page_events_max + 7
    bulk(log, "s", count)
    recorder = Recorder()
    log.subscribe(recorder, after=3)
    log.append("s", [said("live")], expected_version=count)
    assert recorder.positions == list(range(4, count + 2))


def test_subscribers_hear_only_after_commit_and_never_of_an_abort(log: EventLog) -> None:
    recorder = Recorder()
    heads: list[int] = []

    def reads_the_log(envelope: Envelope) -> None:
        heads.append(log.head)  # the event is committed and readable by the time we hear of it
        assert log.read(after=envelope.position - 1, limit=1) == [envelope]

    log.subscribe(recorder)
    log.subscribe(reads_the_log, on_error=lambda exc, _: pytest.fail(f"subscriber: {exc}"))
    with log.transaction() as tx:
        tx.append("a", said_many("a", 2), expected_version=NO_STREAM)
        tx.append("b", [said("b")], expected_version=NO_STREAM)
        assert recorder.seen == []
    assert recorder.positions == [1, 2, 3]
    assert heads == [3, 3, 3]

    with pytest.raises(Boom), log.transaction() as tx:
        tx.append("a", [said("aborted")], expected_version=2)
        raise Boom
    with log.transaction() as tx:
        with pytest.raises(Boom), log.transaction() as inner:
            inner.append("a", [said("inner aborted")], expected_version=2)
            raise Boom
        tx.append("c", [said("c")], expected_version=NO_STREAM)
    assert recorder.positions == [1, 2, 3, 4]
    assert texts(recorder.seen) == ["a0", "a1", "b", "c"]
    assert recorder.seen == log.read()


def test_a_stream_subscription_sees_only_its_stream(log: EventLog) -> None:
    fill(log, [("a", 2), ("b", 2)])
    only_a = Recorder()
    log.subscribe(only_a, after=0, stream="a")
    fill(log, [("b", 1), ("a", 3), ("c", 1)])
    assert {e.stream for e in only_a.seen} == {"a"}
    assert [e.version for e in only_a.seen] == [1, 2, 3, 4, 5]
    assert only_a.seen == log.read_stream("a")


def test_a_raising_subscriber_breaks_nothing_else(
    log: EventLog, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[tuple[BaseException, Envelope]] = []
    before, after = Recorder(), Recorder()

    def broken(envelope: Envelope) -> None:
        raise Boom(f"at {envelope.position}")

    log.subscribe(before)
    failing = log.subscribe(broken, on_error=lambda exc, env: errors.append((exc, env)))
    silent = log.subscribe(broken)
    log.subscribe(after)

    with caplog.at_level(logging.ERROR, logger="sessionlog.eventlog"):
        assert log.append("a", said_many("a", 2), expected_version=NO_STREAM) == [1, 2]
        assert log.append("b", [said("b")], expected_version=NO_STREAM) == [3]

    assert before.positions == after.positions == [1, 2, 3]
    assert [(str(exc), env.position) for exc, env in errors] == [
        ("at 1", 1),
        ("at 2", 2),
        ("at 3", 3),
    ]
    assert all(isinstance(exc, Boom) for exc, _ in errors)
    assert (failing.errors, silent.errors) == (3, 3)
    assert failing.active and silent.active
    logged = [r for r in caplog.records if r.name == "sessionlog.eventlog"]
    assert len(logged) == 3, "the subscriber without on_error is logged, once per event"
    assert log.head == 3
    assert log.verify().ok


def test_a_raising_on_error_breaks_nothing_else(
    log: EventLog, caplog: pytest.LogCaptureFixture
) -> None:
    others = Recorder()

    def broken(envelope: Envelope) -> None:
        raise Boom(f"at {envelope.position}")

    def broken_handler(exc: BaseException, envelope: Envelope) -> None:
        raise Boom(f"handler at {envelope.position}")

    log.subscribe(broken, on_error=broken_handler)
    log.subscribe(others)
    with caplog.at_level(logging.ERROR, logger="sessionlog.eventlog"):
        assert log.append("a", said_many("a", 2), expected_version=NO_STREAM) == [1, 2]
        assert log.append("a", [said("b")], expected_version=2) == [3]
    assert others.positions == [1, 2, 3]
    assert len([r for r in caplog.records if r.name == "sessionlog.eventlog"]) == 3


def test_subscribing_inside_a_transaction_hears_only_committed_events(log: EventLog) -> None:
    fill(log, [("a", 2)])
    live, caught_up = Recorder(), Recorder()
    with pytest.raises(Boom), log.transaction() as tx:
        tx.append("a", [said("aborted")], expected_version=2)
        log.subscribe(live)
        log.subscribe(caught_up, after=1)
        assert caught_up.positions == [2], "an uncommitted event must not be delivered"
        raise Boom
    log.append("a", [said("committed")], expected_version=2)
    assert live.positions == [3]
    assert caught_up.positions == [2, 3]
    assert texts(caught_up.seen) == ["a.0.1", "committed"]

    pending = Recorder()
    with log.transaction() as tx:
        tx.append("b", [said("pending")], expected_version=NO_STREAM)
        log.subscribe(pending)
        assert pending.seen == []
    assert texts(pending.seen) == ["pending"]


def test_unsubscribing_stops_delivery(log: EventLog) -> None:
    closed, scoped, kept = Recorder(), Recorder(), Recorder()
    subscription = log.subscribe(closed)
    log.subscribe(kept)
    with log.subscribe(scoped):
        log.append("a", [said("1")], expected_version=ANY)
    log.append("a", [said("2")], expected_version=ANY)
    subscription.close()
    subscription.close()  # closing twice is harmless
    assert not subscription.active
    log.append("a", [said("3")], expected_version=ANY)
    assert scoped.positions == [1]
    assert closed.positions == [1, 2]
    assert kept.positions == [1, 2, 3]


def test_a_subscriber_that_appends_still_sees_everything_in_order(log: EventLog) -> None:
    reactor_saw: list[int] = []
    everyone = Recorder()
    errors: list[BaseException] = []

    def reactor(envelope: Envelope) -> None:
        reactor_saw.append(envelope.position)
        if envelope.stream == "in":
            (text,) = texts([envelope])
            log.append("out", [said(f"re {text}")], expected_version=ANY)

    log.subscribe(everyone, on_error=lambda exc, _: errors.append(exc))
    log.subscribe(reactor, on_error=lambda exc, _: errors.append(exc))
    late = Recorder()
    log.subscribe(late)

    log.append("in", said_many("q", 2), expected_version=NO_STREAM)
    with log.transaction() as tx:
        tx.append("in", [said("q2")], expected_version=2)
        tx.append("side", [said("s")], expected_version=NO_STREAM)

    assert errors == []
    whole = log.read()
    assert len(whole) == 7
    assert everyone.seen == late.seen == whole
    assert reactor_saw == positions(whole)
    assert texts(log.read_stream("out")) == ["re q0", "re q1", "re q2"]


# Tail


def test_tail_without_follow_yields_what_is_there_and_stops(log: EventLog) -> None:
    fill(log, [("a", 2), ("b", 3), ("a", 1)])
    assert list(log.tail()) == log.read()
    assert positions(list(log.tail(after=4))) == [5, 6]
    assert list(log.tail(stream="a")) == log.read_stream("a")
    assert [e.version for e in log.tail(after=2, stream="a")] == [3]
    assert list(log.tail(after=6)) == []
    assert list(log.tail(follow=True, stop=lambda: True)) == log.read()


def test_tail_pages_through_a_long_log(log: EventLog) -> None:
    count = limits.read_page_events_default * 2 + 3
    log.append("s", said_many("", count), expected_version=NO_STREAM)
    assert positions(list(log.tail(after=1))) == list(range(2, count + 1))


# Verify, close


def test_verify_is_ok_on_a_healthy_log(log: EventLog) -> None:
    fill(log, PLAN)
    with log.transaction() as tx:
        tx.append("e", [SessionRenamed(title=None)], expected_version=NO_STREAM)
        tx.append("a", [SessionTrimmed(keep_last=1, kept_count=1)], expected_version=10)
    report = log.verify()
    assert report.ok, report.problem
    assert report.events_checked == log.head == 27
    assert report.streams_checked == 5
    assert report.head_hash == log.head_hash
    assert (report.first_bad_position, report.problem) == (None, None)


def test_verify_reports_progress_on_a_long_log(log: EventLog) -> None:
    count = limits.read_page_events_max + 1
    bulk(log, "s", count)
    progress: list[tuple[int, int]] = []
    report = log.verify(progress=lambda done, total: progress.append((done, total)))
    assert report.ok
    assert report.events_checked == count
    assert progress[0] == (limits.read_page_events_max, count)
    assert progress[-1] == (count, count)


CLOSED_CALLS: dict[str, Callable[[EventLog], object]] = {
    "append": lambda log: log.append("s", [said("x")], expected_version=ANY),
    "transaction": lambda log: log.transaction().__enter__(),
    "read": lambda log: log.read(),
    "read_stream": lambda log: log.read_stream("s"),
    "head": lambda log: log.head,
    "head_hash": lambda log: log.head_hash,
    "stream_version": lambda log: log.stream_version("s"),
    "iter_all": lambda log: list(log.iter_all()),
    "tail": lambda log: list(log.tail()),
    "verify": lambda log: log.verify(),
    "subscribe": lambda log: log.subscribe(Recorder()),
    "view": lambda log: log.view().__enter__(),
    "size_bytes": lambda log: log.size_bytes(),
}


@pytest.mark.parametrize("call", sorted(CLOSED_CALLS))
def test_a_closed_log_refuses_everything(log: EventLog, call: str) -> None:
    recorder = Recorder()
    log.subscribe(recorder)
    log.append("s", [said("before")], expected_version=NO_STREAM)
    log.close()
    log.close()  # closing twice is harmless
    assert log.closed
    with pytest.raises(LogClosedError, match="closed"):
        CLOSED_CALLS[call](log)
    assert recorder.positions == [1]


def test_lmdb_log_keeps_everything_across_reopen(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as first:
        fill(first, PLAN)
        with first.transaction() as tx:
            tx.kv_put(b"k", b"v")
        everything, head_hash = first.read(), first.head_hash
    with EventLog.open(tmp_path / "log") as again:
        assert again.read() == everything
        assert again.head_hash == head_hash
        assert again.stream_version("a") == 10
        assert kv_all(again) == [(b"k", b"v")]
        assert again.append("a", [said("more")], expected_version=10) == [26]
        assert again.verify().ok


# The two logs are byte-compatible


def write_sample(log: EventLog, shift: timedelta = timedelta(0)) -> None:
    opened = SessionOpened(
        session_id="s-ü", created_at=AT, formation={"b": 2, "a": [1, {"y": None, "x": 1.5}]}
    )
    log.append("s-ü", [opened], expected_version=NO_STREAM, recorded_at=AT + shift)
    with log.transaction() as tx:
        tx.append(
            "s-ü",
            said_many("m", 3),
            expected_version=1,
            meta={"z": 1, "a": {"k": [True, None]}},
            recorded_at=AT + timedelta(seconds=1) + shift,
        )
        tx.append(
            "bearer/x",
            [SessionRenamed(title="t")],
            expected_version=NO_STREAM,
            recorded_at=AT + timedelta(seconds=2) + shift,
        )
    with pytest.raises(Boom), log.transaction() as tx:
        tx.append("s-ü", [said("aborted")], expected_version=ANY, recorded_at=AT)
        raise Boom
    log.append("s-ü", [said("last")], expected_version=4, recorded_at=AT + shift)


def test_identical_input_gives_identical_hashes_on_both_logs(
    log_factory: Callable[[str], EventLog],
) -> None:
    memory, lmdb_log, shifted = log_factory("memory"), log_factory("lmdb"), log_factory("lmdb")
    write_sample(memory)
    write_sample(lmdb_log)
    write_sample(shifted, shift=timedelta(microseconds=1))

    assert memory.read() == lmdb_log.read()
    assert [e.hash for e in memory.read()] == [e.hash for e in lmdb_log.read()]
    assert memory.head_hash == lmdb_log.head_hash == memory.verify().head_hash
    assert lmdb_log.verify().head_hash == memory.head_hash
    # The hash covers recorded_at: a microsecond apart is a different chain from the first event.
    assert shifted.head == memory.head
    assert all(a.hash != b.hash for a, b in zip(memory.read(), shifted.read(), strict=True))


def test_kv_cluster_values_passes_over_a_key_whose_name_is_no_utf8(log: EventLog) -> None:
    # `kv_put` takes any `@` + bytes + NUL + suffix; a listing must not fail on such a key.
    with log.transaction() as tx:
        tx.kv_put(b"@\xff\x00t", b"odd")
        tx.kv_put(cluster_key("ok", b"t"), b"fine")
    with log.view() as view:
        assert view.kv_cluster_values("", b"t") == [("ok", b"fine")]
