"""`Transaction.stamp_next_append` and `LogView.appended_with`: how a layer above the commands
marks a request's first event with its idempotency key, and finds it again, on every log."""

from __future__ import annotations

import pytest

from eventlog import ANY, EventLog, InvalidArgumentError, LimitExceededError
from eventlog.events import Message, MessageInjected


def said(text: str) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content=text))


def test_the_stamp_marks_only_the_next_append(log: EventLog) -> None:
    with log.transaction() as tx:
        tx.stamp_next_append({"idempotency_key": "req-1", "request_sha256": "ab"})
        tx.append("s", [said("a"), said("b")], expected_version=ANY)
        tx.append("s", [said("c")], expected_version=ANY)
    events = log.read()
    assert [e.meta.get("idempotency_key") for e in events] == ["req-1", "req-1", None]
    assert events[0].meta["request_sha256"] == "ab"
    with log.view() as view:
        assert view.appended_with("req-1") == ("s", 1, 2)
        assert view.appended_with("req-2") is None


def test_a_cleared_or_rolled_back_stamp_marks_nothing(log: EventLog) -> None:
    with log.transaction() as tx:
        tx.stamp_next_append({"idempotency_key": "gone"})
        tx.stamp_next_append(None)
        tx.append("s", [said("a")], expected_version=ANY)
    with log.transaction() as tx:
        with pytest.raises(RuntimeError), log.transaction() as savepoint:
            savepoint.stamp_next_append({"idempotency_key": "undone"})
            raise RuntimeError("refused")
        tx.append("s", [said("b")], expected_version=ANY)
    assert [e.meta for e in log.read()] == [{}, {}]
    with log.view() as view:
        assert view.appended_with("gone") is None and view.appended_with("undone") is None


def test_an_append_with_its_own_key_keeps_it_and_spends_the_stamp(log: EventLog) -> None:
    with log.transaction() as tx:
        tx.stamp_next_append({"idempotency_key": "outer"})
        tx.append("s", [said("a")], expected_version=ANY, meta={"idempotency_key": "own"})
        tx.append("s", [said("b")], expected_version=ANY)
    assert [e.meta.get("idempotency_key") for e in log.read()] == ["own", None]


def test_bad_stamps_and_keys_are_refused(log: EventLog) -> None:
    with log.transaction() as tx:
        with pytest.raises(LimitExceededError):
            tx.stamp_next_append({"x": "y" * 10_000})
        with pytest.raises(InvalidArgumentError):
            tx.appended_with("")
        for digests in (["absent"], ["n"]):  # a digest is a str value of the stamp
            with pytest.raises(InvalidArgumentError, match="digests must name str values"):
                tx.stamp_next_append({"idempotency_key": "k", "n": 1}, digests=digests)
        with pytest.raises(InvalidArgumentError):
            tx.stamp_next_append({"idempotency_key": "k"}, digests=["idempotency_key"], stream="")
        assert tx.next_stamp is None
    assert log.head == 0


def test_the_log_stores_named_digests_as_they_are(log: EventLog) -> None:
    """The log itself keys nothing: `digests` and `stream` are for the layer above (the engine
    keys them for an encrypted session); what the stamp holds at the append is what is stored."""
    with log.transaction() as tx:
        stamp = {"idempotency_key": "k", "request_sha256": "ab"}
        tx.stamp_next_append(stamp, digests=["request_sha256"], stream="s")
        pending = tx.next_stamp
        assert pending is not None
        assert (pending.digests, pending.stream) == (("request_sha256",), "s")
        tx.append("s", [said("a")], expected_version=ANY)
        assert tx.next_stamp is None
    assert log.read()[0].meta == {"idempotency_key": "k", "request_sha256": "ab"}
