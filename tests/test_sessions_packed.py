"""`inject_many` of `PackedMessages`: the engine decodes them itself, with the same result as the
same messages given as dicts, and refuses a malformed one by its index, writing nothing."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog import limits
from sessions import InvalidArgumentError, LimitExceededError, PackedMessages, SessionStore
from tests.conftest import refused

_pack = msgspec.msgpack.Encoder().encode


def packed(messages: list[dict[str, Any]]) -> PackedMessages:
    data, ends = bytearray(), []
    for message in messages:
        data += _pack(message)
        ends.append(len(data))
    return PackedMessages(bytes(data), ends)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


RICH: list[dict[str, Any]] = [
    {"role": "user", "content": "hello"},
    {
        "role": "assistant",
        "content": [{"type": "text", "text": "calling"}],
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls"}}],
        "usage": {"input_tokens": 3, "output_tokens": 1},
        "model": "m-1",
        "metadata": {"source": {"lines": [2], "records": ["{}"]}},
    },
    {"role": "tool", "content": "a b", "tool_call_id": "c1", "synthetic": True},
    {"role": "user", "content": "x", "extra": {"x_custom": {"n": 1}}},
]


def test_packed_messages_read_back_as_the_same_messages_given_as_dicts(
    store: SessionStore,
) -> None:
    store.open_session("packed")
    store.open_session("dicts")
    assert store.inject_many("packed", packed(RICH)) == len(RICH)
    as_dicts = [{**m, **m.get("extra", {})} for m in RICH]
    for message in as_dicts:
        message.pop("extra", None)
    assert store.inject_many("dicts", as_dicts) == len(RICH)
    transcript = store.snapshot("packed")["transcript"]  # type: ignore[index]
    assert transcript == store.snapshot("dicts")["transcript"]  # type: ignore[index]
    assert transcript[3]["x_custom"] == {"n": 1}
    assert store.log.verify().ok


def test_a_packed_batch_keeps_its_idempotency_key(store: SessionStore) -> None:
    store.open_session("a")
    assert store.inject_many("a", packed(RICH[:2]), idempotency_key="k") == 2
    assert store.inject_many("a", packed(RICH[:2]), idempotency_key="k") == 0
    assert store.length("a") == 2


@pytest.mark.parametrize(
    ("bad", "error", "text"),
    [
        ({"role": 5}, InvalidArgumentError, "messages[1]: not a packed message"),
        ({"role": "user", "content": 7}, InvalidArgumentError, "messages[1]: not a packed"),
        ({"role": "user", "usage": {"input_tokens": "x"}}, InvalidArgumentError, "messages[1]"),
        ({"role": "  "}, InvalidArgumentError, "messages[1]: a message needs a non-empty `role`"),
        ({"role": "user", "sealed": b"x"}, InvalidArgumentError, "messages[1]: a message needs"),
        (
            {"role": "user", "files": [{"path": f"/f{i}"} for i in range(11)]},
            LimitExceededError,
            "messages[1]: files attached to one message",
        ),
        # The fields of any type are held to the rules of the dict path: an extension type,
        # nesting past `value_depth_max` or a float JSON cannot hold would be written and then
        # fail to read back, or break the log's own limits.
        ({"role": "user", "item": msgspec.msgpack.Ext(5, b"x")}, InvalidArgumentError, "[1]"),
        ({"role": "user", "item": _nested(limits.value_depth_max + 5)}, LimitExceededError, "[1]"),
        ({"role": "user", "content": [_nested(70)]}, LimitExceededError, "messages[1]"),
        ({"role": "user", "tool_calls": [_nested(70)]}, LimitExceededError, "messages[1]"),
        ({"role": "user", "metadata": {"x": float("nan")}}, InvalidArgumentError, "messages[1]"),
        ({"role": "user", "extra": {"x": float("inf")}}, InvalidArgumentError, "messages[1]"),
    ],
)
def test_a_bad_packed_message_is_refused_by_index_and_nothing_is_written(
    store: SessionStore, bad: dict[str, Any], error: type[Exception], text: str
) -> None:
    store.open_session("a")
    caught = refused(
        store, error, text, lambda: store.inject_many("a", packed([RICH[0], bad, RICH[2]]))
    )
    assert getattr(caught, "index", None) == 1
    assert store.length("a") == 0


def test_packed_data_that_does_not_frame_its_messages_is_refused(store: SessionStore) -> None:
    store.open_session("a")
    good = packed(RICH[:2])
    first, end = good.ends
    cases = [
        (PackedMessages(good.data, [first, first]), "messages[1]: packed end"),
        (PackedMessages(good.data, [first]), "goes on past its last message"),
        (PackedMessages(good.data[:-1], [first, end]), "messages[1]: packed end"),
        (PackedMessages(b"\xc1" + good.data, [1]), "messages[0]: not a packed message"),
        (PackedMessages(bytearray(good.data), [first, end]), "must be bytes"),  # type: ignore[arg-type]
    ]
    for wrong, text in cases:
        refused(store, InvalidArgumentError, text, lambda w=wrong: store.inject_many("a", w))  # type: ignore[misc]
    assert store.length("a") == 0


def test_a_packed_event_past_its_size_bound_is_refused(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record of a packed batch is still measured: one too big is refused, blamed on its
    one message."""
    store.open_session("a")
    monkeypatch.setattr(limits, "event_bytes_max", 4096)
    big = {"role": "user", "content": "w " * 4000}
    caught = refused(
        store, LimitExceededError, "event_bytes_max", lambda: store.inject_many("a", packed([big]))
    )
    assert getattr(caught, "index", None) == 0


_SAMPLE = packed(RICH)


@given(
    cuts=st.lists(
        st.tuples(st.integers(0, len(_SAMPLE.data) - 1), st.binary(min_size=0, max_size=9)),
        min_size=1,
        max_size=4,
    )
)
def test_packed_bytes_changed_anywhere_are_kept_exactly_or_refused_by_index(
    cuts: list[tuple[int, bytes]],
) -> None:
    # Bytes replaced anywhere in a valid packed batch (declared lengths, type tags, extension
    # types, keys): either every message is kept and reads back as decoded, or the batch is
    # refused with a typed error naming a message, and nothing is written.
    data = bytearray(_SAMPLE.data)
    for at, new in cuts:
        data[at : at + len(new)] = new
    data = data[: len(_SAMPLE.data)]
    ends = [min(end, len(data)) for end in _SAMPLE.ends]
    with SessionStore.memory() as store:
        store.open_session("a")
        head = store.log.head
        try:
            store.inject_many("a", PackedMessages(bytes(data), ends))
        except InvalidArgumentError as exc:
            assert exc.index is None or 0 <= exc.index < len(ends)
            assert store.log.head == head
            return
        assert store.length("a") == len(ends)
        assert len(store.messages("a")) == len(ends)
        assert store.verify(projections=True).ok
