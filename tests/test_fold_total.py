"""Folds are total: every event of the catalog, with any field values its schema allows, appended
to any stream, is folded without an error, and the store still opens, verifies and rebuilds to
the same projections afterwards. An event that makes no sense for the state it meets changes
nothing; it never takes the store down (a log holding it must stay openable for good).

Values come from the catalog's own schema (`msgspec.inspect`), so a new event or field is covered
the day it is added.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog import ANY, SessionLogError
from eventlog import events as ev
from replay import export_log, import_log
from sessions import SessionStore

# Integers a fold may meet: small ones, the edges of every width a key packs them into, and
# anything msgpack can carry.
_INT_EDGES = [-(2**63), -(2**31), -1, 0, 1, 2**15, 2**16, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
EDGE_INTS = st.integers(-3, 12) | st.sampled_from(_INT_EDGES)
INTS = EDGE_INTS | st.integers(-(2**63), 2**64 - 1)
TEXT = st.one_of(
    st.sampled_from(["", "s1", "s2", "tool", "user", "assistant"]), st.text(max_size=8)
)
JSON = st.recursive(
    st.none() | st.booleans() | INTS | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
STREAMS = ["s1", "s2", "fresh", "$bearer/h1", "$bearer/h2", "$other"]
# Where an event of each kind meets state: a session with a transcript, or a bearer stream.
HOME = {"session": st.sampled_from(["s1", "s2"]), "bearer": st.sampled_from(["$bearer/h1"])}


def of_type(info: msgspec.inspect.Type, ints: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    """Every value the schema type `info` allows (bounded in size), its integers from `ints`."""
    simple: dict[type[msgspec.inspect.Type], st.SearchStrategy[Any]] = {
        msgspec.inspect.IntType: ints,
        msgspec.inspect.StrType: TEXT,
        msgspec.inspect.BoolType: st.booleans(),
        msgspec.inspect.NoneType: st.none(),
        msgspec.inspect.AnyType: JSON,
        msgspec.inspect.FloatType: st.floats(),
        msgspec.inspect.BytesType: st.binary(max_size=40),
    }
    if type(info) in simple:
        return simple[type(info)]
    if isinstance(info, msgspec.inspect.DateTimeType):
        zone = st.just(UTC) if info.tz else st.none() | st.just(UTC)
        return st.datetimes(timezones=zone)
    if isinstance(info, msgspec.inspect.ListType):
        return st.lists(of_type(info.item_type, ints), max_size=3)
    if isinstance(info, msgspec.inspect.DictType):
        return st.dictionaries(
            of_type(info.key_type, ints), of_type(info.value_type, ints), max_size=3
        )
    if isinstance(info, msgspec.inspect.UnionType):
        return st.one_of([of_type(member, ints) for member in info.types])
    if isinstance(info, msgspec.inspect.StructType):
        return of_struct(info.cls, ints)
    raise AssertionError(f"the catalog uses a type this strategy does not know: {info!r}")


@cache
def of_struct(cls: type[msgspec.Struct], ints: st.SearchStrategy[int] = INTS) -> Any:
    """Instances of `cls`, every field drawn (a default is one of the values it may take)."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    fields = {f.name: st.deferred(lambda f=f: of_type(f.type, ints)) for f in info.fields}
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


ANY_EVENT = st.one_of([of_struct(cls) for cls in ev.EVENT_TYPES])


def with_state(store: SessionStore) -> SessionStore:
    """`store` with state for the folds to meet: a session with a tool exchange and a fork of it."""
    store.open_session("s1")
    store.inject_many(
        "s1",
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "name": "grep"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "x" * 500},
        ],
    )
    store.fork_at("s1", 2, "s2")
    return store


def append_all(store: SessionStore, batch: list[tuple[str, ev.Event]]) -> None:
    """Append each event; the log may refuse one (too big, say) with its own typed error, but a
    fold must never fail."""
    for stream, event in batch:
        try:
            store.log.append(stream, [event], expected_version=ANY)
        except SessionLogError as exc:
            assert "cannot be stored" in str(exc) or "exceeds" in str(exc), exc


def assert_sound(store: SessionStore) -> None:
    """The projections are exactly what the log folds to, and every session reads."""
    report = store.verify(projections=True)
    assert report.ok, report
    for session in store.list_sessions(limit=200)["sessions"]:
        store.snapshot(session["session_id"])


# Each event type gets its own share of examples, its events mixed with any others: a fold that
# fails on a rare field value of one type is not left to the luck of a catalog-wide draw.
PER_TYPE = settings(
    max_examples=max(20, settings.default.max_examples // 3),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("cls", ev.EVENT_TYPES, ids=lambda cls: cls.__name__)
@PER_TYPE
@given(data=st.data())
def test_every_event_of_the_catalog_folds_and_the_store_stays_sound(
    cls: type[ev.Event], data: st.DataObject
) -> None:
    others = st.lists(st.tuples(st.sampled_from(STREAMS), ANY_EVENT), max_size=2)
    before = data.draw(others)
    # The event under test, where it meets state, its integers near every edge a key packs.
    target = data.draw(st.tuples(HOME[cls.stream_kind], of_struct(cls, EDGE_INTS)))
    batch = [*before, target, *data.draw(others)]
    with with_state(SessionStore.memory()) as store:
        append_all(store, batch)
        assert_sound(store)


@pytest.mark.parametrize("cls", ev.EVENT_TYPES, ids=lambda cls: cls.__name__)
@settings(max_examples=3)
@given(data=st.data())
def test_the_strategy_reaches_every_event_type(cls: type[ev.Event], data: st.DataObject) -> None:
    """The property above draws from the whole catalog, not a hand-kept list of it, and every
    type there can be generated."""
    assert cls in ev.EVENT_TYPES
    assert isinstance(data.draw(of_struct(cls)), cls)
    assert cls.stream_kind in HOME


def pruned(position: int, index: int) -> ev.ContextPruned:
    result = ev.PrunedResult(
        position=position, index=index, action="hard_clear", chars=1, notice=""
    )
    return ev.ContextPruned(results=[result])


@pytest.mark.parametrize(
    "event",
    [
        pruned(3, -1),
        pruned(-1, 0),
        pruned(2**64 - 1, 2**16),
        ev.SessionTrimmed(keep_last=-5, kept_count=2**63),
        ev.SessionCompacted(strategy="x", replace_start=5, replace_end=-2),
        ev.ContextCompacted(
            insert_at=-1,
            boundary=ev.Message(role="user"),
            summary=ev.Message(role="assistant"),
            summarized_start=2**63,
        ),
    ],
    ids=["pruned-index-1", "pruned-position-1", "pruned-huge", "trim", "compact", "cx-compact"],
)
def test_a_crafted_event_neither_fails_its_append_nor_bricks_the_store(
    tmp_path: Path, event: ev.Event
) -> None:
    """`ContextPruned(index=-1)` once made the fold raise `struct.error`: the append failed, and
    a log holding one (imported from elsewhere) could never be opened as a store."""
    with with_state(SessionStore.open(tmp_path / "source")) as store:
        store.log.append("s1", [event], expected_version=ANY)
        head = store.log.head
        export = tmp_path / "log.jsonl"
        export_log(store, export)
    with SessionStore.open(tmp_path / "source") as store:
        assert_sound(store)
    with SessionStore.open(tmp_path / "copy") as copy:
        assert import_log(copy, export).written == head
    with SessionStore.open(tmp_path / "copy") as copy:
        assert_sound(copy)


@pytest.mark.parametrize("parent", ["", "s1\x00t", "p" * 600], ids=["empty", "nul", "too-long"])
def test_a_fork_from_a_parent_no_stream_can_be_opens_an_empty_session(
    tmp_path: Path, parent: str
) -> None:
    """A fork event's parent id is not a stream name the log checked. One that no stream can have
    (empty, with a NUL, longer than a stream name may be) made the fold ask for a projection key
    that cannot exist: the append failed, and a log holding such an event could not be imported.
    Such a name was never a session: the child has no parent, and its ancestry reads."""
    forked = ev.SessionForked(
        session_id="child",
        parent_id=parent,
        parent_version=1,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        keep_first=1,
    )
    with with_state(SessionStore.open(tmp_path / "source")) as store:
        store.log.append("child", [forked], expected_version=ANY)
        snapshot = store.snapshot("child")
        assert snapshot is not None and snapshot["transcript"] == []
        kept = None if len(parent) > 256 else parent  # 600 bytes: no state key could hold it
        assert store.ancestry("child") == {"parent_id": kept, "child_ids": [], "root_id": "child"}
        assert "child" not in store.ancestry("s1")["child_ids"]
        assert_sound(store)
        export = tmp_path / "log.jsonl"
        export_log(store, export)
        head = store.log.head
    with SessionStore.open(tmp_path / "copy") as copy:
        assert import_log(copy, export).written == head
        assert_sound(copy)
