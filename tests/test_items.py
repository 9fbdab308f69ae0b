"""Items stored verbatim, taking the tail back (pop / rewind), the last N entries, optimistic
concurrency on the transcript's length, idempotency keys, and the asyncio face."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog import ANY, EventLog
from eventlog import events as ev
from sessions import (
    ConcurrencyError,
    InvalidArgumentError,
    LengthConflictError,
    LimitExceededError,
    SessionStore,
    UnknownSessionError,
)
from sessions.aio import AsyncSessionStore

ITEM: dict[str, Any] = {
    "type": "function_call",
    "call_id": "call-1",
    "arguments": '{"city": "Oslo"}',
    "payload": b"\x00\x01\xff raw",
    "at": datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone(timedelta(hours=2))),
    "nested": [1, 2.5, None, True, {"deep": [b"x", {"k": "v"}]}],
    "empty": {},
}


def test_an_item_reads_back_equal_in_value_bytes_as_bytes(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "s") as store:
        store.open_session("s")
        store.inject("s", {"role": "user", "content": "hi"})
        store.inject("s", {"item": ITEM})
        store.inject_many("s", [{"item": ITEM, "metadata": {"m": 1}}, {"item": "just text"}])
        got = store.messages("s")
    with SessionStore.open(tmp_path / "s") as reopened:  # nothing cached: read from the log
        again = reopened.messages("s")
    for entries in (got, again):
        assert entries[1] == {"role": "item", "item": ITEM}
        assert type(entries[1]["item"]["payload"]) is bytes
        assert entries[1]["item"]["nested"][4]["deep"][0] == b"x"
        assert entries[2] == {"role": "item", "item": ITEM, "metadata": {"m": 1}}
        assert entries[3] == {"role": "item", "item": "just text"}


def test_an_item_keeps_a_role_given_with_it_and_is_a_fresh_copy(store: SessionStore) -> None:
    store.open_session("s")
    store.inject("s", {"role": "assistant", "item": {"type": "reasoning", "blob": b"1"}})
    first = store.messages("s")[0]
    assert first == {"role": "assistant", "item": {"type": "reasoning", "blob": b"1"}}
    first["item"]["blob"] = b"changed"
    assert store.messages("s")[0]["item"]["blob"] == b"1"
    assert store.snapshot("s")["transcript"][0]["item"]["blob"] == b"1"  # type: ignore[index]


@pytest.mark.parametrize(
    ("item", "where"),
    [
        ((1, 2), "a tuple"),
        ({"a": {1, 2}}, "['a']: a set"),
        ({"when": datetime(2026, 1, 1)}, "['when']: a datetime needs a timezone"),
        ({1: "x"}, "keys must be strings"),
        ([{"x": object()}], "[0]['x']: a object"),
        ({"big": 2**70}, "cannot be stored"),
    ],
)
def test_an_item_that_would_not_read_back_equal_is_refused(
    store: SessionStore, item: object, where: str
) -> None:
    store.open_session("s")
    head = store.log.head
    with pytest.raises(InvalidArgumentError, match="`item`") as refused:
        store.inject("s", {"item": item})
    assert where in str(refused.value)
    with pytest.raises(InvalidArgumentError, match=r"messages\[1\]"):
        store.inject_many("s", [{"item": 1}, {"item": item}])
    assert store.log.head == head and store.length("s") == 0


def test_an_item_nested_too_deep_is_refused(store: SessionStore) -> None:
    store.open_session("s")
    deep: Any = "leaf"
    for _ in range(80):
        deep = [deep]
    with pytest.raises(LimitExceededError, match="value_depth_max"):
        store.inject("s", {"item": deep})


def test_pop_takes_the_last_entry_and_as_of_still_shows_it(store: SessionStore) -> None:
    store.open_session("s")
    store.inject_many("s", [{"role": "user", "content": "a"}, {"item": ITEM}])
    before = store.log.head
    assert store.pop("s") == {"role": "item", "item": ITEM}
    assert store.messages("s") == [{"role": "user", "content": "a"}]
    assert store.as_of(before).messages("s")[-1] == {"role": "item", "item": ITEM}
    rewound = store.log.read(after=before, limit=1)[0]
    assert rewound.type == "session_rewound"
    assert rewound.data == ev.SessionRewound(to_length=1, removed=1, reason="pop")
    assert store.pop("s") == {"role": "user", "content": "a"}
    head = store.log.head
    assert store.pop("s") is None  # empty: nothing to take, nothing written
    assert store.log.head == head


def test_rewind_hides_the_tail_then_appends_after_it(store: SessionStore) -> None:
    store.open_session("s")
    store.inject_many("s", [{"role": "user", "content": str(i)} for i in range(300)])
    child = store.fork("s")
    assert store.rewind("s", 100, reason="undo") == 200
    assert store.rewind("s", 150) == 0  # already shorter: nothing written
    store.inject("s", {"role": "user", "content": "new"})
    texts = [m["content"] for m in store.messages("s")]
    assert texts == [str(i) for i in range(100)] + ["new"]
    assert store.length(child) == 300  # the fork shares the old tail, untouched
    assert store.messages(child)[-1]["content"] == "299"
    assert store.verify(projections=True).ok


def test_rewind_refuses_bad_arguments_and_unknown_sessions(store: SessionStore) -> None:
    store.open_session("s")
    with pytest.raises(InvalidArgumentError, match="to_length"):
        store.rewind("s", -1)
    with pytest.raises(InvalidArgumentError, match="to_length"):
        store.rewind("s", "3")  # type: ignore[arg-type]
    with pytest.raises(UnknownSessionError):
        store.pop("nope")


@given(
    length=st.integers(0, 40),
    after=st.integers(0, 45),
    limit=st.none() | st.integers(0, 45),
    last=st.integers(0, 45),
)
def test_last_n_is_the_tail_of_the_page(
    length: int, after: int, limit: int | None, last: int
) -> None:
    store = SessionStore.memory()
    store.open_session("s")
    store.inject_many("s", [{"role": "user", "content": str(i)} for i in range(length)])
    store.rewind("s", length // 2)
    store.inject_many("s", [{"item": i} for i in range(length // 3)])
    whole = store.messages("s")
    page = whole[after:] if limit is None else whole[after : after + limit]
    expected = page[max(len(page) - last, 0) :] if last else []
    assert store.messages("s", after=after, limit=limit, last=last) == expected


def test_expected_length_refuses_a_stale_writer(store: SessionStore) -> None:
    store.open_session("s")
    store.inject("s", {"role": "user", "content": "a"}, expected_length=0)
    store.inject_many("s", [{"role": "user", "content": "b"}], expected_length=1)
    head = store.log.head
    for write in (
        lambda: store.inject("s", {"role": "user", "content": "x"}, expected_length=1),
        lambda: store.inject_many("s", [{"item": 1}], expected_length=0),
        lambda: store.pop("s", expected_length=3),
        lambda: store.rewind("s", 0, expected_length=5),
    ):
        with pytest.raises(LengthConflictError) as conflict:
            write()
        assert isinstance(conflict.value, ConcurrencyError)
        assert conflict.value.actual == 2 and conflict.value.session_id == "s"
    assert store.log.head == head and store.length("s") == 2
    with pytest.raises(InvalidArgumentError, match="expected_length"):
        store.inject("s", {"role": "user"}, expected_length=-1)


def test_an_idempotency_key_makes_a_retry_write_nothing(store: SessionStore) -> None:
    store.open_session("s")
    store.inject("s", {"item": ITEM}, idempotency_key="turn-1")
    head = store.log.head
    store.inject("s", {"item": ITEM}, idempotency_key="turn-1")
    batch = [{"role": "user", "content": str(i)} for i in range(1500)]  # several events
    assert store.inject_many("s", batch, idempotency_key="turn-2", expected_length=1) == 1501 - 1
    assert store.inject_many("s", batch, idempotency_key="turn-2", expected_length=1) == 0
    assert store.length("s") == 1501
    assert store.log.head > head
    store.inject("s", {"role": "user", "content": "other"}, idempotency_key="turn-3")
    assert store.length("s") == 1502
    keys = [
        e.data.idempotency_key
        for e in store.log.read_stream("s")
        if hasattr(e.data, "idempotency_key")
    ]
    assert [k for k in keys if k] == ["turn-1", "turn-2", "turn-3"]
    assert store.verify(projections=True).ok
    store.rebuild()
    assert store.inject_many("s", batch, idempotency_key="turn-2") == 0  # remembered by the fold


def test_keys_belong_to_one_incarnation_and_one_session(store: SessionStore) -> None:
    store.open_session("s")
    store.inject("s", {"role": "user", "content": "a"}, idempotency_key="k")
    other = store.open_session("t")
    store.inject(other, {"role": "user", "content": "a"}, idempotency_key="k")
    assert store.length(other) == 1
    child = store.fork("s")
    store.inject(child, {"role": "user", "content": "b"}, idempotency_key="k")
    assert store.length(child) == 2
    store.delete("s")
    store.open_session("s")
    store.inject("s", {"role": "user", "content": "again"}, idempotency_key="k")
    assert store.messages("s") == [{"role": "user", "content": "again"}]


@pytest.mark.parametrize("key", ["", 7, "x" * 513])
def test_a_bad_idempotency_key_is_refused(store: SessionStore, key: object) -> None:
    store.open_session("s")
    with pytest.raises(InvalidArgumentError, match="idempotency_key"):
        store.inject("s", {"role": "user"}, idempotency_key=key)  # type: ignore[arg-type]
    assert store.length("s") == 0


@given(to_length=st.integers(-(2**63), 2**63 - 1), removed=st.integers(-(2**63), 2**63 - 1))
def test_the_fold_takes_any_rewind_and_any_key(to_length: int, removed: int) -> None:
    store = SessionStore.memory()
    store.open_session("s")
    store.inject_many("s", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    store.log.append(
        "s", [ev.SessionRewound(to_length=to_length, removed=removed)], expected_version=ANY
    )
    kept = min(max(to_length, 0), 2)
    assert store.length("s") == kept
    long_key = "ключ\x00" * 2000  # longer than any LMDB key: no verb takes it, the fold must
    message = ev.Message(role="user", content="c")
    injected = ev.MessageInjected(message=message, idempotency_key=long_key)
    store.log.append("s", [injected], expected_version=ANY)
    assert store.length("s") == kept + 1


def test_rewound_sessions_rebuild_to_the_same_projection(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path / "log")
    store = SessionStore(log)
    store.open_session("s")
    store.inject_many("s", [{"item": {"i": i, "b": bytes([i])}} for i in range(200)])
    store.rewind("s", 130)
    store.pop("s")
    store.inject("s", {"item": {"last": b"\x00"}}, idempotency_key="k")
    before = store.messages("s")
    store.rebuild()
    assert store.messages("s") == before
    assert len(before) == 130 and before[-1]["item"] == {"last": b"\x00"}
    store.close()


def test_the_async_face_runs_off_the_loop(tmp_path: Path) -> None:
    async def main() -> None:
        loop_thread = threading.get_ident()
        async with await AsyncSessionStore.open(tmp_path / "aio") as store:
            assert await store.run(threading.get_ident) != loop_thread
            sid = await store.open_session("s")
            await store.inject(sid, {"item": ITEM}, idempotency_key="1")
            await store.inject(sid, {"item": ITEM}, idempotency_key="1")
            written = await asyncio.gather(
                *(store.inject_many(sid, [{"role": "user", "content": str(i)}]) for i in range(5))
            )
            assert written == [1] * 5
            assert await store.length(sid) == 6
            assert (await store.messages(sid, last=6))[0] == {"role": "item", "item": ITEM}
            assert (await store.pop(sid))["content"] == "4"  # type: ignore[index]
            assert await store.rewind(sid, 1) == 4
            with pytest.raises(LengthConflictError):
                await store.inject(sid, {"role": "user"}, expected_length=0)
            child = await store.fork(sid)
            assert (await store.snapshot(child))["length"] == 1  # type: ignore[index]
        with SessionStore.open(tmp_path / "aio") as reopened:
            assert reopened.messages("s") == [{"role": "item", "item": ITEM}]

    asyncio.run(main())


def test_the_item_datetime_comes_back_in_utc_equal_in_value(store: SessionStore) -> None:
    store.open_session("s")
    store.inject("s", {"item": {"at": ITEM["at"]}})
    got = store.messages("s")[0]["item"]["at"]
    assert got == ITEM["at"] and got.tzinfo == UTC


def test_a_key_longer_than_an_lmdb_key_is_remembered_on_lmdb(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "s")
    store.open_session("s")
    long_key = "ключ\x00" * 2000
    message = ev.Message(role="user", content="c")
    injected = ev.MessageInjected(message=message, idempotency_key=long_key)
    store.log.append("s", [injected], expected_version=ANY)
    assert store.length("s") == 1
    store.close()
    with SessionStore.open(tmp_path / "s") as again:
        assert again.verify(projections=True).ok
        assert again.length("s") == 1


@pytest.mark.parametrize("kind", ["lmdb", "postgres"])
def test_items_rewinds_and_keys_on_each_durable_backend(kind: str, tmp_path: Path) -> None:
    from tests.conftest import make_log

    store = SessionStore(make_log(kind, tmp_path))
    try:
        store.open_session("s")
        store.inject_many("s", [{"item": ITEM}, {"item": {"n": 1}}], idempotency_key="k")
        assert store.inject_many("s", [{"item": ITEM}], idempotency_key="k") == 0
        before = store.log.head
        assert store.pop("s") == {"role": "item", "item": {"n": 1}}
        assert store.messages("s") == [{"role": "item", "item": ITEM}]
        assert store.as_of(before).length("s") == 2
        with pytest.raises(LengthConflictError):
            store.inject("s", {"item": 2}, expected_length=0)
        store.rebuild()
        assert store.messages("s", last=1) == [{"role": "item", "item": ITEM}]
        assert store.inject_many("s", [{"item": ITEM}], idempotency_key="k") == 0
        assert store.verify(projections=True).ok
    finally:
        store.close()
