"""The session verbs against seed 001: lifecycle, compaction, fail-loud errors, subscribers and
transactions, each on the durable LMDB store and on the in-memory reference store."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import projections
import sessions
from eventlog import Envelope
from sessions import (
    CapacityError,
    InvalidArgumentError,
    LimitExceededError,
    SessionExistsError,
    SessionLogError,
    SessionStore,
    UnknownSessionError,
)
from tests.conftest import refused

StoreFactory = Callable[..., SessionStore]


@pytest.fixture(params=["lmdb", "memory"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """Every test here runs on LMDB and on the in-memory reference store."""
    return str(request.param)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def filled(store: SessionStore, sid: str, count: int, prefix: str = "m") -> str:
    store.open_session(sid)
    for i in range(count):
        store.inject(sid, user(f"{prefix}{i}"))
    return sid


def contents(store: SessionStore, sid: str) -> list[Any]:
    snap = store.snapshot(sid)
    assert snap is not None, sid
    return [m["content"] for m in snap["transcript"]]


def types(store: SessionStore, sid: str) -> list[str]:
    return [envelope.type for envelope in store.log.read_stream(sid)]


def dump(store: SessionStore) -> list[tuple[bytes, bytes]]:
    with store.log.view() as view:
        return projections.dump(view)


# open_session, exists, length, snapshot


def test_open_session_is_idempotent_and_writes_nothing_the_second_time(store: SessionStore) -> None:
    assert store.open_session("s1", title="first") == "s1"
    head = store.log.head
    assert store.open_session("s1") == "s1"
    assert store.open_session("s1", title="first") == "s1"  # the same call again
    assert store.log.head == head
    snap = store.snapshot("s1")
    assert snap is not None
    assert snap["title"] == "first" and snap["system_prompt"] is None
    assert types(store, "s1") == ["session_opened"]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"system_prompt": "other"}, "already open with another system_prompt ("),
        ({"title": "second"}, "already open with another title ("),
        ({"scope": "ephemeral"}, "already open with another scope ("),
        ({"metadata": {"k": 2}}, "already open with another metadata ("),
        ({"title": "second", "metadata": {"k": 2}}, "another title, metadata ("),
    ],
)
def test_open_session_with_other_options_is_a_conflict(
    store: SessionStore, options: dict[str, Any], named: str
) -> None:
    store.open_session("s1", title="first", metadata={"k": 1})
    store.rename("s1", "renamed")  # later changes do not count: the opening call does
    assert store.open_session("s1", title="first", metadata={"k": 1}) == "s1"
    refused(store, SessionExistsError, named, lambda: store.open_session("s1", **options))
    child = store.fork("s1", "kid")
    assert store.open_session(child, title="renamed") == child  # a fork holds what it copied
    refused(store, SessionExistsError, "another title",
            lambda: store.open_session(child, title="x"))  # fmt: skip


def test_open_session_none_mints_uuid7_ids_that_sort_by_time(store: SessionStore) -> None:
    before_ms = time.time_ns() // 1_000_000
    first = store.open_session()
    after_ms = time.time_ns() // 1_000_000
    parsed = uuid.UUID(first)
    assert str(parsed) == first
    assert parsed.version == 7 and first[14] == "7"
    assert parsed.variant == uuid.RFC_4122
    assert before_ms <= parsed.int >> 80 <= after_ms
    assert store.exists(first) and types(store, first) == ["session_opened"]
    # Mint until the millisecond moves on (a busy loop, no sleep): the later id sorts after.
    later = first
    while uuid.UUID(later).int >> 80 == parsed.int >> 80:
        later = sessions.uuid7()
    assert later > first
    assert store.open_session() != first


def test_open_session_stores_every_option(store: SessionStore) -> None:
    options = {
        "workspace_anchor": {"root": "/repo", "kind": "git"},
        "workspace_policy": {"default_mount_mode": "read_only"},
        "system_prompt": "be brief",
        "tool_format": "native",
        "agent_id": "agent-7",
        "title": "triage",
        "metadata": {"provider": "mock", "params": {"temperature": 0}},
    }
    sid = store.open_session("opts", **options)
    snap = store.snapshot(sid)
    assert snap is not None
    for key, value in options.items():
        assert snap[key] == value, key
    assert store.workspace_anchor(sid) == options["workspace_anchor"]
    assert store.workspace_policy(sid) == options["workspace_policy"]
    opened = store.log.read_stream(sid)[0].data
    assert opened.system_prompt == "be brief" and opened.metadata == options["metadata"]


def test_exists_and_length(store: SessionStore) -> None:
    assert store.exists("nope") is False
    filled(store, "a", 3)
    assert store.exists("a") is True
    assert store.length("a") == 3


def test_snapshot_has_every_field_seed_001_lists(store: SessionStore) -> None:
    filled(store, "p", 3)
    assert store.open_session("p") == "p"  # reused as it is
    child = store.fork_at("p", 2, "c")
    store.set_scratchpad(child, {"plan": ["a"]})
    store.attach(child, "tui", {"mode": "controller"})
    snap = store.snapshot(child)
    assert snap is not None
    seed_fields = {
        "transcript",
        "length",
        "created_at",
        "system_prompt",
        "tool_format",
        "scratchpad",
        "scratchpad_version",
        "parent_id",
        "child_ids",
        "branched_at_event_index",
        "live_clients",
        "live_controller_id",
    }
    assert seed_fields <= set(snap)
    assert snap["transcript"] == [user("m0"), user("m1")]
    assert snap["length"] == 2
    assert datetime.fromisoformat(snap["created_at"]).tzinfo is not None
    assert snap["system_prompt"] is None and snap["tool_format"] is None
    assert snap["scratchpad"] == {"plan": ["a"]} and snap["scratchpad_version"] == 1
    assert snap["parent_id"] == "p" and snap["child_ids"] == []
    assert snap["branched_at_event_index"] == 2
    assert [c["client_id"] for c in snap["live_clients"]] == ["tui"]
    assert snap["live_controller_id"] == "tui"
    parent = store.snapshot("p")
    assert parent is not None and parent["child_ids"] == ["c"] and parent["parent_id"] is None


def test_snapshot_is_a_copy(store: SessionStore) -> None:
    store.open_session("a")
    store.inject("a", {"role": "user", "content": "x", "metadata": {"k": [1]}})
    snap = store.snapshot("a")
    assert snap is not None
    snap["transcript"][0]["metadata"]["k"].append(2)
    snap["transcript"].append(user("y"))
    assert store.snapshot("a")["transcript"] == [  # type: ignore[index]
        {"role": "user", "content": "x", "metadata": {"k": [1]}}
    ]


# ancestry, fork, fork_at


def test_forks_five_deep_resolve_to_the_root(store: SessionStore) -> None:
    chain = [filled(store, "root", 1)]
    for depth in range(5):
        chain.append(store.fork(chain[-1], f"d{depth}"))
    for i, sid in enumerate(chain):
        ancestry = store.ancestry(sid)
        assert ancestry == {
            "parent_id": chain[i - 1] if i else None,
            "child_ids": chain[i + 1 : i + 2],
            "root_id": "root",
        }


def test_fork_copies_transcript_and_lineage_but_not_subscribers(store: SessionStore) -> None:
    filled(store, "p", 2)
    seen: list[str] = []
    store.subscribe("p", lambda e: seen.append(e.stream))
    child = store.fork("p")
    assert uuid.UUID(child).version == 7
    assert contents(store, child) == ["m0", "m1"]
    assert store.ancestry(child) == {"parent_id": "p", "child_ids": [], "root_id": "p"}
    assert store.ancestry("p")["child_ids"] == [child]  # type: ignore[index]
    snap = store.snapshot(child)
    assert snap is not None and snap["branched_at_event_index"] is None
    store.inject(child, user("child only"))
    assert seen == []
    assert types(store, child) == ["session_forked", "message_injected"]


PARENT_CHANGES: dict[str, Callable[[SessionStore, str], object]] = {
    "inject": lambda s, sid: s.inject(sid, user("later")),
    "trim": lambda s, sid: s.trim(sid, 1),
    "reset": lambda s, sid: s.reset(sid),
    "compact": lambda s, sid: s.compact(sid, keep_last=1),
    "compact_llm": lambda s, sid: s.compact(
        sid, keep_last=1, compact_strategy="llm", summarizer=lambda ms: "sum"
    ),
    "fork_at_then_inject": lambda s, sid: s.inject(s.fork_at(sid, 1), user("grandchild")),
    "trim_then_inject": lambda s, sid: (s.trim(sid, 2), s.inject(sid, user("after trim"))),
    "close_and_reopen": lambda s, sid: (s.close_session(sid), s.open_session(sid)),
}


@pytest.mark.parametrize("change", sorted(PARENT_CHANGES))
@pytest.mark.parametrize("keep_first", [None, 2])
def test_later_changes_never_cross_a_fork(
    store: SessionStore, change: str, keep_first: int | None
) -> None:
    filled(store, "p", 4)
    fork = store.fork if keep_first is None else (lambda s, d: store.fork_at(s, keep_first, d))
    child = fork("p", "c")
    parent_before, child_before = contents(store, "p"), contents(store, child)
    PARENT_CHANGES[change](store, "p")
    assert contents(store, child) == child_before
    parent_after = contents(store, "p")
    PARENT_CHANGES[change](store, child)
    assert contents(store, "p") == parent_after
    assert parent_before == ["m0", "m1", "m2", "m3"]
    assert child_before == parent_before[: keep_first or 4]


def test_child_and_parent_appending_in_either_order_stay_apart(store: SessionStore) -> None:
    filled(store, "p", 2)
    first = store.fork("p", "first")
    store.inject(first, user("child first"))  # the child reaches the shared end first
    store.inject("p", user("parent second"))
    second = store.fork("p", "second")
    store.inject("p", user("parent third"))
    store.inject(second, user("second child"))
    assert contents(store, "p") == ["m0", "m1", "parent second", "parent third"]
    assert contents(store, first) == ["m0", "m1", "child first"]
    assert contents(store, second) == ["m0", "m1", "parent second", "second child"]


def test_fork_at_keeps_first_n_and_records_the_branch_index(store: SessionStore) -> None:
    filled(store, "p", 4)
    for keep, expected in [(0, []), (1, ["m0"]), (3, ["m0", "m1", "m2"])]:
        child = store.fork_at("p", keep, f"k{keep}")
        assert contents(store, child) == expected
        assert store.snapshot(child)["branched_at_event_index"] == keep  # type: ignore[index]
        assert store.ancestry(child)["root_id"] == "p"  # type: ignore[index]
    beyond = store.fork_at("p", 99, "beyond")
    assert contents(store, beyond) == ["m0", "m1", "m2", "m3"]
    # Ambiguity: seed 001 does not say; the index is clamped to what was kept.
    assert store.snapshot(beyond)["branched_at_event_index"] == 4  # type: ignore[index]
    assert contents(store, "p") == ["m0", "m1", "m2", "m3"]
    assert store.ancestry("p")["child_ids"] == ["k0", "k1", "k3", "beyond"]  # type: ignore[index]


def test_fork_onto_an_existing_session_is_refused(store: SessionStore) -> None:
    filled(store, "p", 1)
    store.open_session("taken")
    refused(store, SessionExistsError, "`taken` already exists", lambda: store.fork("p", "taken"))
    refused(store, SessionExistsError, "already exists", lambda: store.fork_at("p", 0, "taken"))
    refused(store, SessionExistsError, "`p` already exists", lambda: store.fork("p", "p"))
    store.close_session("taken")
    assert store.fork("p", "taken") == "taken"  # a closed id is free again
    assert contents(store, "taken") == ["m0"]


# reset, trim, inject


def test_reset_keeps_the_id_and_subscribers(store: SessionStore) -> None:
    filled(store, "a", 3)
    seen: list[str] = []
    store.subscribe("a", lambda e: seen.append(e.type))
    assert store.reset("a") is None
    assert store.exists("a") and store.length("a") == 0 and contents(store, "a") == []
    store.inject("a", user("again"))
    assert seen == ["session_reset", "message_injected"]
    assert contents(store, "a") == ["again"]


@pytest.mark.parametrize(("keep", "kept"), [(0, 0), (2, 2), (5, 5), (9, 5)])
def test_trim_keeps_the_last_messages_and_returns_the_count(
    store: SessionStore, keep: int, kept: int
) -> None:
    filled(store, "a", 5)
    assert store.trim("a", keep) == kept
    assert contents(store, "a") == [f"m{i}" for i in range(5 - kept, 5)]
    assert store.length("a") == kept


def test_inject_keeps_unknown_fields_and_every_known_one(store: SessionStore) -> None:
    store.open_session("a")
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": "hi"}],
        "name": "bot",
        "tool_calls": [{"id": "c1", "name": "ls"}],
        "usage": {"input_tokens": 3, "output_tokens": 4},
        "model": "m-1",
        "metadata": {"trace": "t"},
        "x_custom": {"nested": [1, 2]},
        "provider_raw": "kept",
    }
    assert store.inject("a", message) is None
    assert store.snapshot("a")["transcript"] == [message]  # type: ignore[index]
    store.inject("a", {"role": "tool", "tool_call_id": "c1", "content": "ok", "files": ["/f"]})
    last = store.snapshot("a")["transcript"][-1]  # type: ignore[index]
    assert last["tool_call_id"] == "c1" and last["files"] == [{"path": "/f"}]


# inject_many


def mixed_messages(count: int) -> list[dict[str, Any]]:
    """Plain text messages with richer ones (tool calls, usage, unknown keys) among them."""
    out: list[dict[str, Any]] = []
    for i in range(count):
        if i % 5 == 3:
            out.append(
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": f"t{i}"}],
                    "tool_calls": [{"id": f"c{i}", "name": "ls"}],
                    "usage": {"input_tokens": i, "output_tokens": 1},
                    "x_custom": {"n": i},
                }
            )
        else:
            out.append(user(f"m{i}"))
    return out


@pytest.mark.parametrize("per_event", [1_000, 7])
@pytest.mark.parametrize("kind", ["plain", "mixed"])
def test_inject_many_equals_one_inject_per_message(
    make_store: StoreFactory, kind: str, per_event: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same transcripts as one inject per message; the batch is recorded as
    `messages_injected` events of at most `messages_per_event_max` messages."""
    monkeypatch.setattr(sessions._store.limits, "messages_per_event_max", per_event)
    messages = [user(f"m{i}") for i in range(30)] if kind == "plain" else mixed_messages(30)
    batched, one_by_one = make_store(hot_sessions=0), make_store()  # batched: read cold
    for store in (batched, one_by_one):
        store.open_session("a")
        store.open_session("b")
        store.inject("a", user("first"))
    head = batched.log.head
    assert batched.inject_many("a", messages) == 30
    batches = -(-30 // per_event)
    assert batched.log.head == head + batches  # one event per batch, in one commit
    assert types(batched, "a")[2:] == ["messages_injected"] * batches
    for message in messages:
        one_by_one.inject("a", message)
    for store in (batched, one_by_one):
        store.inject("b", user("after"))  # the next command sees the batch's projection
        store.fork_at("a", 10, "c")
        store.trim("c", 6)
    assert contents(batched, "a") == contents(one_by_one, "a")
    assert batched.snapshot("a")["transcript"] == [user("first"), *messages]  # type: ignore[index]
    assert contents(batched, "c") == contents(one_by_one, "c")
    assert batched.length("a") == 31
    # the projection equals one built event by event, and a rebuild
    keep = dump(batched)
    batched.rebuild()
    assert dump(batched) == keep
    assert batched.log.verify().ok


def test_inject_many_inside_a_transaction_and_after_a_fork(store: SessionStore) -> None:
    filled(store, "a", 4)
    store.fork("a", "b")  # "a" shares its segment with "b" now: the batch must start a new one
    with store.transaction():
        store.inject_many("a", [user("x"), user("y")])
        store.inject("a", user("z"))
        store.inject_many("b", [user("only b")])
    assert contents(store, "a") == ["m0", "m1", "m2", "m3", "x", "y", "z"]
    assert contents(store, "b") == ["m0", "m1", "m2", "m3", "only b"]


def test_inject_many_of_nothing_writes_nothing_but_needs_a_session(store: SessionStore) -> None:
    store.open_session("a")
    head = store.log.head
    assert store.inject_many("a", []) == 0
    assert store.log.head == head
    refused(store, UnknownSessionError, "nope", lambda: store.inject_many("nope", []))


def test_inject_many_refuses_the_whole_batch_for_one_bad_message(store: SessionStore) -> None:
    filled(store, "a", 2)
    batch = [user("ok"), user("fine"), {"content": "no role"}, user("never")]
    refused(
        store,
        InvalidArgumentError,
        "inject_many: messages[2]: a message needs a non-empty string `role`",
        lambda: store.inject_many("a", batch),
    )
    files = [{"role": "user", "files": [f"/f{i}" for i in range(11)]}]
    refused(store, LimitExceededError, "messages[0]", lambda: store.inject_many("a", files))
    for wrong in ("text", {"role": "user"}, None, 5):
        refused(
            store,
            InvalidArgumentError,
            "a list of message dicts",
            lambda w=wrong: store.inject_many("a", w),
        )  # type: ignore[misc]
    refused(store, UnknownSessionError, "gone", lambda: store.inject_many("gone", [user("x")]))
    assert contents(store, "a") == ["m0", "m1"]


def test_inject_many_keeps_to_the_transcript_limit(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sessions._store.limits, "messages_per_transcript_max", 5)
    filled(store, "a", 3)
    refused(
        store,
        LimitExceededError,
        "inject_many: transcript length",
        lambda: store.inject_many("a", [user("1"), user("2"), user("3")]),
    )
    assert store.inject_many("a", [user("1"), user("2")]) == 2


def test_messages_handed_in_are_not_shared_with_the_store(store: SessionStore) -> None:
    store.open_session("a")
    seen: list[Envelope] = []
    store.subscribe("a", seen.append)
    plain, rich = user("p"), mixed_messages(4)[3]
    store.inject_many("a", [plain, rich])
    plain["content"] = "changed"
    rich["tool_calls"].append({"id": "late"})
    rich["x_custom"]["n"] = "changed"
    transcript = store.snapshot("a")["transcript"]  # type: ignore[index]
    assert transcript[0] == user("p")
    assert transcript[1]["tool_calls"] == [{"id": "c3", "name": "ls"}]
    assert transcript[1]["x_custom"] == {"n": 3}
    (batch,) = seen
    assert [m.content for m in batch.data.messages] == ["p", [{"type": "text", "text": "t3"}]]  # type: ignore[attr-defined]
    assert batch.data.messages[1].tool_calls == [{"id": "c3", "name": "ls"}]  # type: ignore[attr-defined]


# compact


def many(store: SessionStore, sid: str, count: int) -> str:
    return filled(store, sid, count)


def test_compact_truncate_keeps_the_last_12_by_default(store: SessionStore) -> None:
    many(store, "a", 20)
    assert store.compact("a") == 12
    assert contents(store, "a") == [f"m{i}" for i in range(8, 20)]
    assert types(store, "a")[-1] == "session_compacted"
    assert store.compact("a", compact_strategy="truncate", keep_last=3) == 3
    assert contents(store, "a") == ["m17", "m18", "m19"]


def test_compact_with_nothing_to_do_writes_nothing(store: SessionStore) -> None:
    many(store, "a", 5)
    head = store.log.head
    assert store.compact("a") == 5
    assert store.compact("a", compact_strategy="observation_mask", keep_last=0) == 5
    assert store.log.head == head


def tool_transcript(store: SessionStore, sid: str) -> str:
    store.open_session(sid)
    store.inject(sid, user("q"))
    store.inject(sid, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]})
    store.inject(sid, {"role": "tool", "tool_call_id": "c1", "content": "L" * 300})
    store.inject(sid, {"role": "tool", "tool_call_id": "c2", "content": "short"})
    store.inject(sid, {"role": "assistant", "content": "done"})
    store.inject(sid, {"role": "tool", "tool_call_id": "c3", "content": "R" * 300})
    return sid


def test_compact_observation_mask_masks_long_older_tool_outputs(store: SessionStore) -> None:
    tool_transcript(store, "a")
    assert store.compact("a", compact_strategy="observation_mask", keep_last=1) == 6
    got = contents(store, "a")
    assert got[2] == "[tool output masked: 300 characters]"
    assert got[3] == "short" and got[0] == "q"
    assert got[5] == "R" * 300  # the newest are never touched


def test_compact_observation_mask_callbacks(store: SessionStore) -> None:
    tool_transcript(store, "a")
    masked: list[dict[str, Any]] = []
    compressed: list[list[dict[str, Any]]] = []

    def mask(message: dict[str, Any]) -> str:
        masked.append(message)
        return f"<masked {message['tool_call_id']}>"

    def compress(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        compressed.append(messages)
        return [m for m in messages if m["role"] != "user"]

    kept = store.compact(
        "a",
        compact_strategy="observation_mask",
        keep_last=1,
        tool_output_max_chars=4,
        mask_callback=mask,
        compress_callback=compress,
    )
    assert [m["tool_call_id"] for m in masked] == ["c1", "c2"]
    # keep_last=1 would keep only a tool result: its call ("done"'s turn) stays too.
    assert [m["content"] for m in compressed[0]] == ["q", "", "<masked c1>", "<masked c2>"]
    assert kept == 5
    assert contents(store, "a") == ["", "<masked c1>", "<masked c2>", "done", "R" * 300]


def test_compact_llm_records_the_summary_so_replay_never_summarizes(
    store: SessionStore,
) -> None:
    many(store, "a", 6)
    calls: list[list[dict[str, Any]]] = []

    def summarizer(messages: list[dict[str, Any]]) -> str:
        calls.append(messages)
        return f"summary of {len(messages)}"

    assert store.compact("a", compact_strategy="llm", keep_last=2, summarizer=summarizer) == 4
    assert len(calls) == 1 and [m["content"] for m in calls[0]] == ["m0", "m1", "m2", "m3"]
    transcript = store.snapshot("a")["transcript"]  # type: ignore[index]
    assert transcript[1] == {
        "role": "assistant",
        "content": "summary of 4",
        "synthetic": True,
        "summary": True,
    }
    assert transcript[0]["role"] == "user" and transcript[0]["summary"] is True
    assert [m["content"] for m in transcript[2:]] == ["m4", "m5"]
    event = store.log.read_stream("a")[-1]
    assert event.type == "session_compacted" and event.data.strategy == "llm"
    assert "summary of 4" in [m.content for m in event.data.replacement]
    before = dump(store)
    store.rebuild()
    assert dump(store) == before
    assert store.as_of(store.log.head).snapshot("a")["transcript"] == transcript  # type: ignore[index]
    assert len(calls) == 1


def test_compact_llm_refuses_an_empty_summary_and_writes_nothing(store: SessionStore) -> None:
    """An empty assistant message would be refused by the provider on every later call."""
    many(store, "a", 6)
    before = store.log.head
    with pytest.raises(InvalidArgumentError, match="non-empty str"):
        store.compact("a", compact_strategy="llm", keep_last=2, summarizer=lambda ms: "  ")
    assert store.log.head == before and contents(store, "a") == [f"m{i}" for i in range(6)]


def test_compact_keeps_an_anthropic_tool_result_with_its_tool_use(store: SessionStore) -> None:
    """`keep_last` landing on a user message of `tool_result` blocks moves back to its call."""
    store.open_session("a")
    use = {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}
    answer = {"type": "tool_result", "tool_use_id": "t1", "content": "r"}
    store.inject_many(
        "a",
        [
            user("q"),
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [answer]},
            {"role": "assistant", "content": "done"},
        ],
    )
    assert store.compact("a", compact_strategy="truncate", keep_last=2) == 3
    assert store.context("a")[0] == {"role": "assistant", "content": [use]}


def test_compact_llm_uses_the_store_summarizer(make_store: StoreFactory) -> None:
    calls = []
    store = make_store(summarizer=lambda ms: calls.append(ms) or "S")
    many(store, "a", 4)
    assert store.compact("a", compact_strategy="llm", keep_last=1) == 3
    assert contents(store, "a")[1:] == ["S", "m3"] and len(calls) == 1


def test_compact_custom_gets_the_whole_transcript(store: SessionStore) -> None:
    many(store, "a", 4)
    got: list[list[dict[str, Any]]] = []

    def compactor(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        got.append(messages)
        return [{"role": "system", "content": "reset"}, messages[-1]]

    assert store.compact("a", compact_strategy="custom", custom_compactor=compactor) == 2
    assert [m["content"] for m in got[0]] == ["m0", "m1", "m2", "m3"]
    assert contents(store, "a") == ["reset", "m3"]


def test_compact_below_the_token_threshold_writes_nothing(make_store: StoreFactory) -> None:
    store = make_store(token_counter=lambda message: 10)
    many(store, "a", 5)  # 50 tokens
    head = store.log.head
    assert store.compact("a", keep_last=1, token_threshold=50) == 5
    assert store.log.head == head
    assert store.compact("a", keep_last=1, token_threshold=49) == 1
    assert contents(store, "a") == ["m4"]


def test_compact_hard_limit_applies_its_own_strategy(make_store: StoreFactory) -> None:
    store = make_store(token_counter=lambda message: 10)
    many(store, "a", 8)
    used: list[int] = []

    def halve(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        used.append(len(messages))
        return messages[len(messages) // 2 :]

    kept = store.compact(
        "a",
        compact_strategy="observation_mask",
        keep_last=6,
        hard_limit_tokens=30,
        hard_limit_strategy="custom",
        custom_compactor=halve,
    )
    assert used == [8]
    assert kept == 3 and contents(store, "a") == ["m5", "m6", "m7"]
    event = store.log.read_stream("a")[-1].data
    assert event.tokens_before == 80 and event.tokens_after == 30


def test_compact_keep_last_never_separates_a_tool_result_from_its_call(
    store: SessionStore,
) -> None:
    tool_transcript(store, "a")
    # The last 3 would start at a tool result: the call before it stays too.
    assert store.compact("a", keep_last=3) == 5
    assert [m["role"] for m in store.snapshot("a")["transcript"]] == [  # type: ignore[index]
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
    ]


def test_compact_hard_limit_never_separates_a_tool_result_from_its_call(
    make_store: StoreFactory,
) -> None:
    store = make_store(token_counter=lambda m: len(m.get("content") or "") or 1)
    store.open_session("a")
    store.inject("a", user("q"))
    store.inject("a", {"role": "assistant", "content": "C" * 50, "tool_calls": [{"id": "c"}]})
    store.inject("a", {"role": "tool", "tool_call_id": "c", "content": "r"})
    store.inject("a", user("z"))
    store.fork_at("a", 3, "b")  # q, call, result
    assert store.compact("a", hard_limit_tokens=10) == 1
    assert contents(store, "a") == ["z"]  # the call went together with its result
    assert store.compact("b", hard_limit_tokens=10) == 2
    assert [m["role"] for m in store.snapshot("b")["transcript"]] == [  # type: ignore[index]
        "assistant",
        "tool",
    ]  # over the limit, but a lone result would answer nothing


# close_session


@pytest.mark.parametrize(
    ("status", "reason", "detail"),
    [
        (None, None, {}),
        ("timeout", "timeout", {"reason": "timeout"}),
        ({"reason": "budget", "spent": 3}, "budget", {"reason": "budget", "spent": 3}),
    ],
)
def test_close_session_records_the_reason_and_keeps_the_session_readable(
    store: SessionStore, status: Any, reason: str | None, detail: dict[str, Any]
) -> None:
    filled(store, "a", 2)
    store.fork("a", "kid")
    assert store.close_session("a", status) is None
    closed = store.log.read_stream("a")[-1]
    assert closed.type == "agent_session_closed"
    assert closed.data.reason == reason and closed.data.status == detail
    assert store.exists("a") is False  # no longer open: every write is refused
    refused(store, UnknownSessionError, "inject", lambda: store.inject("a", user("x")))
    refused(store, UnknownSessionError, "fork", lambda: store.fork("a"))
    # ... but a closed session stays readable, marked closed, with its family.
    snap = store.snapshot("a")
    assert snap is not None and snap["status"] == "closed"
    assert [m["content"] for m in snap["transcript"]] == ["m0", "m1"]
    assert store.length("a") == 2 and len(store.messages("a")) == 2
    assert store.ancestry("a") == {"parent_id": None, "child_ids": ["kid"], "root_id": "a"}
    assert store.ancestry("kid")["root_id"] == "a"  # type: ignore[index]
    assert types(store, "a") == [
        "session_opened",
        "message_injected",
        "message_injected",
        "agent_session_closed",
    ]
    assert store.ancestry("kid")["parent_id"] == "a"  # type: ignore[index]
    assert store.open_session("a") == "a"
    snap = store.snapshot("a")
    assert snap is not None
    assert snap["transcript"] == [] and snap["child_ids"] == [] and snap["parent_id"] is None
    assert store.ancestry("a")["root_id"] == "a"  # type: ignore[index]


# current_id


def test_current_id_outside_inside_and_nested(store: SessionStore) -> None:
    assert sessions.current_id() is None
    store.open_session("a")
    with store.driving("a") as sid:
        assert sid == "a" and sessions.current_id() == "a"
        with store.driving("b"):
            assert sessions.current_id() == "b"
        assert sessions.current_id() == "a"
    assert sessions.current_id() is None
    with pytest.raises(InvalidArgumentError, match="driving"), store.driving(""):
        pass
    assert sessions.current_id() is None


def test_current_id_inside_a_subscriber_is_its_session(store: SessionStore) -> None:
    store.open_session("a")
    store.open_session("b")
    seen: list[tuple[str | None, str]] = []
    store.subscribe("a", lambda e: seen.append((sessions.current_id(), e.stream)))
    with store.driving("b"):
        store.inject("a", user("x"))
        assert sessions.current_id() == "b"
    assert seen == [("a", "a")]


# list_sessions, rename, delete


def test_list_sessions_pages_with_a_cursor(store: SessionStore) -> None:
    ids = sorted(f"s{i:02d}" for i in range(7))
    for sid in reversed(ids):
        store.open_session(sid, title=f"t-{sid}")
    for limit in (1, 2, 3, 7, 200):
        seen: list[str] = []
        cursor = None
        while True:
            page = store.list_sessions(cursor=cursor, limit=limit)
            assert len(page["sessions"]) <= limit
            seen += [s["session_id"] for s in page["sessions"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == ids, limit
    first = store.list_sessions(limit=1)["sessions"][0]
    assert first["title"] == "t-s00" and first["status"] == "active" and first["length"] == 0


@pytest.mark.parametrize("limit", [0, 201, -1, True, "5", None])
def test_list_sessions_refuses_bad_limits(store: SessionStore, limit: Any) -> None:
    refused(store, InvalidArgumentError, "from 1 to 200", lambda: store.list_sessions(limit=limit))


@pytest.mark.parametrize("cursor", [5, "\ud800", "x" * 600])
def test_list_sessions_refuses_bad_cursors(store: SessionStore, cursor: Any) -> None:
    refused(store, InvalidArgumentError, "cursor", lambda: store.list_sessions(cursor=cursor))


def test_list_sessions_filters_by_status(store: SessionStore) -> None:
    for sid in ("a", "b", "c", "d"):
        store.open_session(sid)
    store.close_session("b")
    store.delete("c", reason="gdpr")

    def listed(**kwargs: Any) -> list[str]:
        return [s["session_id"] for s in store.list_sessions(**kwargs)["sessions"]]

    assert listed() == ["a", "b", "d"]
    assert listed(status="active") == ["a", "d"]
    assert listed(status="closed") == ["b"]
    assert listed(status="deleted") == ["c"]
    refused(store, InvalidArgumentError, "status", lambda: store.list_sessions(status="gone"))


def test_rename_and_delete(store: SessionStore) -> None:
    filled(store, "a", 1)
    store.rename("a", "named")
    assert store.snapshot("a")["title"] == "named"  # type: ignore[index]
    assert store.list_sessions()["sessions"][0]["title"] == "named"
    store.delete("a", reason="cleanup")
    assert store.exists("a") is False and store.snapshot("a") is None
    assert store.list_sessions()["sessions"] == []
    refused(store, UnknownSessionError, "rename", lambda: store.rename("a", "x"))
    assert types(store, "a") == [
        "session_opened",
        "message_injected",
        "session_renamed",
        "session_deleted",
    ]
    assert store.log.read_stream("a")[-1].data.reason == "cleanup"


# capacity and the hot-session cache


def test_max_sessions_caps_open_sessions(make_store: StoreFactory) -> None:
    store = make_store(max_sessions=2)
    store.open_session("a")
    store.open_session("b")
    refused(store, CapacityError, "max_sessions = 2", lambda: store.open_session("c"))
    refused(store, CapacityError, "max_sessions", lambda: store.fork("a", "c"))
    refused(store, CapacityError, "max_sessions", store.open_session)
    assert store.open_session("a") == "a"  # reopening an open session needs no room
    store.close_session("a")
    assert store.open_session("c") == "c"
    store.delete("b")
    assert store.fork("c", "d") == "d"
    assert not store.exists("a")


def test_a_small_hot_cache_never_loses_anything(make_store: StoreFactory) -> None:
    store = make_store(hot_sessions=2)
    ids = [filled(store, f"s{i}", i + 1, prefix=f"{i}-") for i in range(5)]
    for round_ in range(3):
        for i, sid in enumerate(ids):
            assert contents(store, sid)[: i + 1] == [f"{i}-{j}" for j in range(i + 1)]
            store.inject(sid, user(f"r{round_}"))
            assert contents(store, sid)[-1] == f"r{round_}"
            assert store.length(sid) == i + 2 + round_
    store.trim(ids[0], 1)
    for sid in reversed(ids):
        assert contents(store, sid)[-1] == "r2"
    assert contents(store, ids[0]) == ["r2"]


# rebuild and as_of


def busy(store: SessionStore) -> None:
    filled(store, "a", 5)
    store.fork_at("a", 2, "b")
    store.inject("b", user("b"))
    store.trim("a", 3)
    store.compact("a", keep_last=1, compact_strategy="llm", summarizer=lambda ms: "S")
    store.set_scratchpad("b", {"k": 1})
    store.attach("b", "ui", {"mode": "controller"})
    store.add_root("b", "/extra")
    store.close_session("b", "done")
    store.open_session("c", title="c")
    store.delete("c")


def test_rebuild_equals_the_incremental_state(store: SessionStore) -> None:
    busy(store)
    before = dump(store)
    snapshots = {sid: store.snapshot(sid) for sid in ("a", "b", "c")}
    assert store.rebuild() == store.log.head
    assert dump(store) == before
    assert {sid: store.snapshot(sid) for sid in ("a", "b", "c")} == snapshots


@pytest.mark.parametrize("count", [127, 128, 129, 256, 300])
def test_transcripts_across_reference_chunks(store: SessionStore, count: int) -> None:
    size = projections._state.REFS_PER_CHUNK
    filled(store, "a", count)
    want = [f"m{i}" for i in range(count)]
    for keep in sorted({0, 1, size - 1, size, size + 1, count - 1, count}):
        store.fork_at("a", keep, f"k{keep}")
        assert contents(store, f"k{keep}") == want[:keep], keep
    store.inject_many("k1", [user(f"x{i}") for i in range(size + 2)])  # a new segment, 2 chunks
    assert contents(store, "k1") == ["m0", *[f"x{i}" for i in range(size + 2)]]
    assert contents(store, "a") == want
    assert store.trim("a", size + 1) == min(count, size + 1)
    assert contents(store, "a") == want[-(size + 1) :]
    before = dump(store)
    store.rebuild()
    assert dump(store) == before


def test_transcripts_match_a_list_model_with_tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The list-model property again with two references per chunk, so that nearly every
    operation crosses a chunk boundary."""
    monkeypatch.setattr(projections._state, "REFS_PER_CHUNK", 2)
    test_transcripts_match_a_list_model()


def test_a_damaged_reference_chunk_is_reported_and_rebuild_repairs_it(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "s", hot_sessions=0) as store:
        filled(store, "a", 200)
        want = contents(store, "a")
        store.fork("a", "b")  # the chunk "a" was filling, held in its transcript, goes out
        with store.log.transaction() as tx:
            key = tx.kv_scan(projections._keys.REF_PREFIX)[-1][0]  # that chunk
            tx.kv_put(key, b"\x00" * 15)  # of the wrong size
        with pytest.raises(sessions.IntegrityError, match="rebuild the projection"):
            store.snapshot("a")
        with pytest.raises(sessions.IntegrityError, match="rebuild the projection"):
            store.snapshot("b")
        with pytest.raises(sessions.IntegrityError, match="rebuild the projection"):
            store.inject("b", user("more"))  # never folds onto a damaged chunk
        store.rebuild()
        assert contents(store, "a") == want
        assert contents(store, "b") == want


def test_opening_a_store_with_another_projection_layout_rebuilds_it(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SessionStore.open(path) as store:
        filled(store, "a", 5)
        store.fork_at("a", 2, "b")
        expected = dump(store)
        with store.log.transaction() as tx:  # what an older version would have left behind
            tx.kv_clear()
            tx.kv_put(projections._keys.LAYOUT_KEY, b"\x01")
            tx.kv_put(projections._keys.POSITION_KEY, store.log.head.to_bytes(8, "big"))
            tx.kv_put(b"g/stale", b"junk")
    with SessionStore.open(path) as store:
        assert dump(store) == expected
        assert contents(store, "b") == ["m0", "m1"]


def test_a_store_whose_transcripts_predate_item_timestamp_is_rebuilt_on_open(
    tmp_path: Path,
) -> None:
    # Transcripts written before they kept `item_timestamp` lack it; the fold of the same log
    # now gives it, so such a store must be rebuilt, not verified as drifted.
    path = tmp_path / "s"
    with SessionStore.open(path) as store:
        store.open_session("a")
        store.inject("a", {"role": "user", "content": "x", "item": {"timestamp": 12.5}})
        key = projections._state.transcript_key("a")
        with store.log.view() as view:
            now = projections.load_transcript(view, "a")
        assert now is not None and now.item_timestamp == 12.5
        older = msgspec.msgpack.encode([now.ranges, now.length, now.version, now.last_activity_at])
        with store.log.transaction() as tx:  # what the version before would have left behind
            tx.kv_put(key, older)
            tx.kv_put(projections._keys.LAYOUT_KEY, b"\x04")
    with SessionStore.open(path) as store:
        with store.log.view() as view:
            assert projections.load_transcript(view, "a").item_timestamp == 12.5  # type: ignore[union-attr]
        assert store.verify(projections=True).ok


def test_as_of_shows_the_past_and_refuses_writes(store: SessionStore) -> None:
    filled(store, "a", 2)
    middle = store.log.head
    store.inject("a", user("later"))
    store.fork("a", "b")
    past = store.as_of(middle)
    assert contents(past, "a") == ["m0", "m1"]
    assert past.exists("b") is False and past.ancestry("a")["child_ids"] == []  # type: ignore[index]
    assert store.as_of(0).exists("a") is False
    for write in (
        lambda: past.inject("a", user("x")),
        lambda: past.open_session("z"),
        lambda: past.reset("a"),
        lambda: past.set_scratchpad("a", {}),
        past.rebuild,
    ):
        with pytest.raises(InvalidArgumentError, match="read-only view"):
            write()
    assert past.log.head == middle and contents(past, "a") == ["m0", "m1"]
    assert contents(store, "a") == ["m0", "m1", "later"]
    for bad in (-1, store.log.head + 1, True, "3"):
        refused(store, InvalidArgumentError, "as_of", lambda bad=bad: store.as_of(bad))


SHARING_VERBS = ["inject", "fork", "fork_at", "trim", "reset", "compact", "close", "summarize"]


def pages(store: SessionStore, sid: str, count: int) -> list[list[Any]]:
    """Pages of the transcript as `messages` reads them: the last `count`, and `count` after
    the first."""
    return [
        [m["content"] for m in store.messages(sid, last=count)],
        [m["content"] for m in store.messages(sid, after=1, limit=count)],
    ]


def pages_of(expected: list[Any], count: int) -> list[list[Any]]:
    return [expected[len(expected) - min(count, len(expected)) :], expected[1 : 1 + count]]


@given(
    st.lists(
        st.tuples(
            st.sampled_from([*SHARING_VERBS, "pop", "rewind"]),
            st.integers(0, 3),
            st.integers(0, 4),
        ),
        max_size=30,
    ),
    st.sampled_from([1, 3]),
)
def test_transcripts_match_a_list_model(steps: list[tuple[str, int, int]], hot: int) -> None:
    """Any mix of verbs over shared segments gives each session exactly its own list, now and
    in `as_of` every past position, read through a cache of `hot` transcripts that a session
    shares with its family (each read may reuse another session's cached first messages)."""
    store = SessionStore.memory(hot_sessions=hot)
    model: dict[str, list[str]] = {"s0": []}
    store.open_session("s0")
    history = [(store.log.head, {"s0": []})]
    for n, (verb, pick, count) in enumerate(steps):
        sid = sorted(model)[pick % len(model)]
        if verb == "inject":
            store.inject(sid, user(f"#{n}"))
            model[sid].append(f"#{n}")
        elif verb == "fork":
            model[store.fork(sid, f"s{n + 1}")] = list(model[sid])
        elif verb == "fork_at":
            model[store.fork_at(sid, count, f"s{n + 1}")] = model[sid][:count]
        elif verb == "trim":
            assert store.trim(sid, count) == min(count, len(model[sid]))
            model[sid] = model[sid][len(model[sid]) - min(count, len(model[sid])) :]
        elif verb == "reset":
            store.reset(sid)
            model[sid] = []
        elif verb == "close":  # and reopen empty under the same id
            store.close_session(sid)
            store.open_session(sid)
            model[sid] = []
        elif verb == "summarize" and len(model[sid]) > count:
            older = len(model[sid]) - count
            kept = store.compact(
                sid, keep_last=count, compact_strategy="llm", summarizer=lambda ms, n=n: f"S{n}"
            )
            assert kept == count + 2
            boundary = f"[summary of the {older} earlier messages]"
            model[sid] = [boundary, f"S{n}", *model[sid][older:]]
        elif verb == "compact":
            assert store.compact(sid, keep_last=count) == min(count, len(model[sid]))
            model[sid] = model[sid][len(model[sid]) - min(count, len(model[sid])) :]
        elif verb == "pop":
            popped = store.pop(sid)
            assert (popped or {}).get("content") == (model[sid].pop() if model[sid] else None)
        elif verb == "rewind":
            assert store.rewind(sid, count) == max(len(model[sid]) - count, 0)
            del model[sid][count:]
        for other, expected in model.items():
            for _ in range(2):  # a page asked for twice is kept: the second read may be cached
                assert pages(store, other, count) == pages_of(expected, count), other
            assert contents(store, other) == expected, (other, steps[: n + 1])
        history.append((store.log.head, {k: list(v) for k, v in model.items()}))
    before = dump(store)
    store.rebuild()
    assert dump(store) == before
    for position, expected_then in history:
        past = store.as_of(position)
        assert {sid: contents(past, sid) for sid in expected_then} == expected_then


# Fail loud


def test_unknown_option_keys_are_refused(store: SessionStore) -> None:
    filled(store, "a", 3)
    refused(store, InvalidArgumentError, "'colour'", lambda: store.open_session("b", colour=1))
    assert not store.exists("b")
    refused(store, InvalidArgumentError, "'keep_first'", lambda: store.compact("a", keep_first=1))
    refused(store, InvalidArgumentError, "unknown option", lambda: store.compact("a", mode="x"))
    refused(
        store,
        InvalidArgumentError,
        "compact_strategy",
        lambda: store.compact("a", compact_strategy="zip"),
    )
    refused(
        store,
        InvalidArgumentError,
        "needs `custom_compactor`",
        lambda: store.compact("a", compact_strategy="custom"),
    )
    refused(
        store,
        InvalidArgumentError,
        "needs a `summarizer`",
        lambda: store.compact("a", compact_strategy="llm"),
    )
    assert store.length("a") == 3


@pytest.mark.parametrize(
    ("message", "text"),
    [
        ({"content": "no role"}, "non-empty string `role`"),
        ({"role": "", "content": "x"}, "non-empty string `role`"),
        ({"role": "   "}, "non-empty string `role`"),
        ({"role": 3}, "non-empty string `role`"),
        ({"role": None}, "non-empty string `role`"),
        (["user", "hi"], "must be a dict, got list"),
        ("hello", "must be a dict, got str"),
        (None, "must be a dict, got NoneType"),
        ({"role": "user", 1: "x"}, "keys must be strings"),
    ],
)
def test_bad_messages_are_refused(store: SessionStore, message: Any, text: str) -> None:
    store.open_session("a")
    refused(store, InvalidArgumentError, text, lambda: store.inject("a", message))
    assert store.length("a") == 0


def test_more_than_ten_files_on_a_message_is_refused(store: SessionStore) -> None:
    store.open_session("a")
    store.inject("a", {"role": "user", "files": [f"/f{i}" for i in range(10)]})
    error = refused(
        store,
        LimitExceededError,
        "11 exceeds files_per_message_max = 10",
        lambda: store.inject("a", {"role": "user", "files": [f"/f{i}" for i in range(11)]}),
    )
    assert isinstance(error, InvalidArgumentError)
    assert store.length("a") == 1


@pytest.mark.parametrize("bad", [-1, True, False, "3", 2.0, None])
def test_counts_must_be_non_negative_ints(store: SessionStore, bad: Any) -> None:
    filled(store, "a", 3)
    expected = "must be >= 0" if bad == -1 and bad is not True else "must be an int"
    refused(store, InvalidArgumentError, f"`keep_last` {expected}", lambda: store.trim("a", bad))
    refused(
        store, InvalidArgumentError, f"`keep_first` {expected}", lambda: store.fork_at("a", bad)
    )
    if bad is not None:  # compact treats keep_last=None as "the default"
        refused(
            store,
            InvalidArgumentError,
            f"`keep_last` {expected}",
            lambda: store.compact("a", keep_last=bad),
        )
        refused(
            store,
            InvalidArgumentError,
            "token_threshold",
            lambda: store.compact("a", token_threshold=bad),
        )
    assert store.length("a") == 3 and store.ancestry("a")["child_ids"] == []  # type: ignore[index]


READS_OF_CLOSED = ("length", "messages")
LIFECYCLE: dict[str, Callable[[SessionStore, str], object]] = {
    "reset": lambda s, sid: s.reset(sid),
    "fork": lambda s, sid: s.fork(sid),
    "fork_at": lambda s, sid: s.fork_at(sid, 1),
    "close_session": lambda s, sid: s.close_session(sid),
    "trim": lambda s, sid: s.trim(sid, 1),
    "inject": lambda s, sid: s.inject(sid, user("x")),
    "length": lambda s, sid: s.length(sid),
    "compact": lambda s, sid: s.compact(sid),
    "rename": lambda s, sid: s.rename(sid, "t"),
    "delete": lambda s, sid: s.delete(sid),
    "messages": lambda s, sid: s.messages(sid),
    "subscribe": lambda s, sid: s.subscribe(sid, print),
    "scratchpad": lambda s, sid: s.scratchpad(sid),
    "set_scratchpad": lambda s, sid: s.set_scratchpad(sid, {"a": 1}),
    "clear_scratchpad": lambda s, sid: s.clear_scratchpad(sid),
    "attach": lambda s, sid: s.attach(sid, "c"),
    "takeover": lambda s, sid: s.takeover(sid, "c"),
    "detach": lambda s, sid: s.detach(sid, "c"),
    "heartbeat": lambda s, sid: s.heartbeat(sid, "c"),
    "live_clients": lambda s, sid: s.live_clients(sid),
    "client_inject_prompt": lambda s, sid: s.client_inject_prompt(sid, "c", "hi"),
    "route_permission": lambda s, sid: s.route_permission(sid, "c", {"tool": "rm"}),
    "workspace_anchor": lambda s, sid: s.workspace_anchor(sid),
    "set_workspace_anchor": lambda s, sid: s.set_workspace_anchor(sid, {"root": "/"}),
    "workspace_policy": lambda s, sid: s.workspace_policy(sid),
    "set_workspace_policy": lambda s, sid: s.set_workspace_policy(sid, {}),
    "add_root": lambda s, sid: s.add_root(sid, "/r"),
    "remove_root": lambda s, sid: s.remove_root(sid, "/r"),
    "list_roots": lambda s, sid: s.list_roots(sid),
}


@pytest.mark.parametrize(
    ("verb", "how"),
    [
        (verb, how)
        for verb in sorted(LIFECYCLE)
        for how in ("never", "closed", "deleted")
        if not (how == "closed" and verb in READS_OF_CLOSED)  # a closed session is still read
    ],
)
def test_every_verb_on_an_unknown_id_raises(store: SessionStore, verb: str, how: str) -> None:
    if how != "never":
        store.open_session("ghost")
        store.close_session("ghost") if how == "closed" else store.delete("ghost")
    said = (
        f"{verb}: session `ghost` is closed (`open_session` opens it again)"
        if how == "closed"
        else f"{verb}: no session `ghost`"
    )
    error = refused(store, UnknownSessionError, said, lambda: LIFECYCLE[verb](store, "ghost"))
    assert isinstance(error, KeyError) and isinstance(error, SessionLogError)
    assert error.session_id == "ghost"  # type: ignore[attr-defined]
    assert str(error) == said
    assert error.closed == (how == "closed")  # type: ignore[attr-defined]


def test_exists_open_snapshot_and_ancestry_tolerate_unknown_ids(store: SessionStore) -> None:
    head = store.log.head
    assert store.exists("ghost") is False
    assert store.snapshot("ghost") is None
    assert store.ancestry("ghost") is None
    assert store.log.head == head
    assert store.open_session("ghost") == "ghost" and store.exists("ghost")


BAD_IDS = [
    ("", "non-empty"),
    (" padded", "surrounding space"),
    ("$system", "reserved"),
    ("a\x00b", "control characters"),
    ("line\nbreak", "control characters"),
    ("del\x7f", "control characters"),
    ("x" * 129, "129 exceeds session_id_bytes_max = 128"),
    ("é" * 65, "130 exceeds session_id_bytes_max"),
    ("y" * 600, "session_id_bytes_max"),
    ("\ud800", "not valid UTF-8"),
    (7, "must be a str, got int"),
    (b"bytes", "must be a str, got bytes"),
]


@pytest.mark.parametrize(("bad", "text"), BAD_IDS)
def test_bad_session_ids_are_refused(store: SessionStore, bad: Any, text: str) -> None:
    filled(store, "a", 1)
    refused(store, InvalidArgumentError, text, lambda: store.open_session(bad))
    refused(store, InvalidArgumentError, text, lambda: store.fork("a", bad))
    refused(store, InvalidArgumentError, text, lambda: store.fork_at("a", 0, bad))
    refused(store, InvalidArgumentError, text, lambda: store.inject(bad, user("x")))
    refused(store, InvalidArgumentError, text, lambda: store.length(bad))
    # The tolerant queries answer "no such session" instead of raising.
    assert store.exists(bad) is False
    assert store.snapshot(bad) is None and store.ancestry(bad) is None


def test_a_128_byte_id_is_fine(store: SessionStore) -> None:
    sid = "é" * 64
    assert store.open_session(sid) == sid and store.exists(sid)


# Subscribers


def test_subscribers_get_each_committed_event_once_in_order_after_commit(
    store: SessionStore,
) -> None:
    store.open_session("a")
    seen: list[tuple[int, str, int]] = []
    store.subscribe("a", lambda e: seen.append((e.position, e.type, store.length("a"))))
    store.inject("a", user("1"))
    store.inject("a", user("2"))
    store.trim("a", 1)
    assert [(t, n) for _, t, n in seen] == [
        ("message_injected", 1),
        ("message_injected", 2),
        ("session_trimmed", 1),
    ]
    positions = [p for p, _, _ in seen]
    assert positions == sorted(set(positions))
    assert positions == [e.position for e in store.log.read_stream("a")[1:]]


def test_subscribers_never_see_refused_commands_or_aborted_transactions(
    store: SessionStore,
) -> None:
    store.open_session("a")
    seen: list[str] = []
    store.subscribe("a", lambda e: seen.append(e.type))
    with pytest.raises(InvalidArgumentError):
        store.inject("a", {"content": "no role"})
    with pytest.raises(RuntimeError, match="abort"), store.transaction():
        store.inject("a", user("x"))
        store.reset("a")
        assert seen == []  # nothing is delivered before the commit
        raise RuntimeError("abort")
    assert seen == [] and store.length("a") == 0
    with store.transaction():
        store.inject("a", user("x"))
        store.inject("a", user("y"))
        assert seen == []
    assert seen == ["message_injected", "message_injected"]


def test_a_failing_subscriber_is_reported_and_breaks_nothing(store: SessionStore) -> None:
    store.open_session("a")
    errors: list[tuple[BaseException, Envelope]] = []
    good: list[str] = []

    def bad(envelope: Envelope) -> None:
        raise ValueError(f"boom at {envelope.position}")

    handle = store.subscribe("a", bad, on_error=lambda exc, env: errors.append((exc, env)))
    quiet = store.subscribe("a", bad)  # no on_error: logged, and kept on the handle
    store.subscribe("a", lambda e: good.append(e.type))
    store.inject("a", user("x"))
    store.reset("a")
    assert good == ["message_injected", "session_reset"]
    assert [str(exc) for exc, _ in errors] == [
        f"boom at {e.position}" for e in store.log.read_stream("a")[1:]
    ]
    assert [env.type for _, env in errors] == ["message_injected", "session_reset"]
    assert [str(e) for e in handle.errors] == [str(exc) for exc, _ in errors]
    assert len(quiet.errors) == 2 and isinstance(quiet.errors[0], ValueError)
    assert store.length("a") == 0 and store.exists("a")


def test_unsubscribe_stops_delivery(store: SessionStore) -> None:
    store.open_session("a")
    seen: list[str] = []
    handle = store.subscribe("a", lambda e: seen.append(e.type))
    store.inject("a", user("x"))
    handle.close()
    handle.close()  # twice is harmless
    store.inject("a", user("y"))
    assert seen == ["message_injected"] and handle.active is False
    with store.subscribe("a", lambda e: seen.append("ctx")):
        store.reset("a")
    store.reset("a")
    assert seen == ["message_injected", "ctx"]


@pytest.mark.parametrize("end", ["close", "delete"])
def test_a_subscription_ends_with_its_session(store: SessionStore, end: str) -> None:
    store.open_session("a")
    seen: list[str] = []
    handle = store.subscribe("a", lambda e: seen.append(e.type))
    store.close_session("a") if end == "close" else store.delete("a")
    assert handle.active is False
    store.open_session("a")
    store.inject("a", user("x"))
    assert seen == ["agent_session_closed" if end == "close" else "session_deleted"]


def test_a_subscriber_may_write_to_the_store(store: SessionStore) -> None:
    store.open_session("a")
    store.open_session("audit")

    def mirror(envelope: Envelope) -> None:
        store.inject("audit", user(f"saw {envelope.type}"))

    store.subscribe("a", mirror)
    store.inject("a", user("x"))
    assert contents(store, "audit") == ["saw message_injected"]


# Transactions


def test_a_transaction_commits_several_commands_atomically(store: SessionStore) -> None:
    head = store.log.head
    with store.transaction() as tx:
        assert tx is store
        store.open_session("a")
        store.inject("a", user("x"))
        store.fork("a", "b")
        store.inject("b", user("y"))
        with pytest.raises(UnknownSessionError):
            store.inject("nope", user("z"))  # a refused command inside leaves the rest alone
        assert contents(store, "b") == ["x", "y"]
    assert store.log.head == head + 4
    assert contents(store, "a") == ["x"] and contents(store, "b") == ["x", "y"]


def test_an_exception_inside_a_transaction_writes_nothing(store: SessionStore) -> None:
    filled(store, "a", 2)
    head, before = store.log.head, dump(store)
    with pytest.raises(KeyError, match="stop"), store.transaction():
        store.inject("a", user("x"))
        store.open_session("b")
        store.fork("a", "c")
        store.close_session("a")
        raise KeyError("stop")
    assert store.log.head == head and dump(store) == before
    assert contents(store, "a") == ["m0", "m1"]
    assert not store.exists("b") and not store.exists("c")
    store.inject("a", user("after"))
    assert contents(store, "a") == ["m0", "m1", "after"]


# The hot cache after appends


def test_ranges_added_finds_appended_messages_only() -> None:
    added = projections.ranges_added
    assert added((), ((1, 0, 3),)) == ((1, 0, 3),)
    assert added(((1, 0, 3),), ((1, 0, 3),)) == ()
    assert added(((1, 0, 3),), ((1, 0, 5),)) == ((1, 3, 5),)
    assert added(((1, 0, 3),), ((1, 0, 5), (2, 0, 1))) == ((1, 3, 5), (2, 0, 1))
    assert added(((7, 2, 4), (1, 0, 3)), ((7, 2, 4), (1, 0, 3), (9, 0, 2))) == ((9, 0, 2),)
    assert added(((1, 0, 3),), ((1, 1, 3),)) is None  # trimmed from the front
    assert added(((1, 0, 3),), ((1, 0, 2),)) is None  # shortened
    assert added(((1, 0, 3),), ()) is None  # reset
    assert added(((1, 0, 3), (2, 0, 1)), ((1, 0, 3),)) is None
    assert added(((1, 0, 3),), ((2, 0, 3),)) is None  # another segment (compaction)


def test_ranges_shared_counts_the_first_messages_two_transcripts_share() -> None:
    shared = projections.ranges_shared
    assert shared((), ((1, 0, 3),)) == (0, ((1, 0, 3),))
    assert shared(((1, 0, 3),), ((1, 0, 3),)) == (3, ())  # the same
    assert shared(((1, 0, 3),), ((1, 0, 5),)) == (3, ((1, 3, 5),))  # appended
    assert shared(((1, 0, 3),), ((1, 0, 3), (2, 0, 1))) == (3, ((2, 0, 1),))  # a fork's own
    assert shared(((1, 0, 5),), ((1, 0, 2),)) == (2, ())  # taken back, or forked at 2
    assert shared(((1, 0, 5),), ((1, 0, 2), (4, 0, 3))) == (2, ((4, 0, 3),))  # then appended
    assert shared(((1, 0, 3), (2, 0, 4)), ((1, 0, 3), (2, 0, 2))) == (5, ())
    assert shared(((1, 0, 3), (2, 0, 4)), ((1, 0, 3), (5, 0, 2))) == (3, ((5, 0, 2),))
    assert shared(((1, 0, 3),), ((1, 1, 3),)) == (0, ((1, 1, 3),))  # trimmed from the front
    assert shared(((1, 0, 3),), ((2, 0, 3),)) == (0, ((2, 0, 3),))  # another segment
    assert shared(((1, 0, 3),), ()) == (0, ())  # reset


def test_a_family_reads_its_shared_messages_from_the_cache(make_store: StoreFactory) -> None:
    store = make_store(hot_sessions=8)
    filled(store, "a", 5)
    parent, _ = store.message_structs("a")
    store.fork("a", "b")
    store.fork_at("a", 2, "c")
    store.inject("c", user("own"))
    store.inject("a", user("after"))
    forked, _ = store.message_structs("b")
    assert [m.content for m in forked] == ["m0", "m1", "m2", "m3", "m4"]
    assert all(mine is theirs for mine, theirs in zip(forked, parent, strict=True))
    prefix, _ = store.message_structs("c")
    assert [m.content for m in prefix] == ["m0", "m1", "own"]
    assert prefix[0] is parent[0] and prefix[1] is parent[1]
    grown, _ = store.message_structs("a")  # its own entry, taken over by a fork's: read again
    assert [m.content for m in grown] == ["m0", "m1", "m2", "m3", "m4", "after"]
    assert grown[0] is parent[0]
    cold = SessionStore(store.log, hot_sessions=0)
    for sid in "abc":
        assert contents(cold, sid) == contents(store, sid)


def test_a_polled_page_is_read_once_then_kept(make_store: StoreFactory) -> None:
    store = make_store(hot_sessions=8)
    filled(store, "a", 6)
    first, fresh = store.message_structs("a", last=3)
    assert fresh and [m.content for m in first] == ["m3", "m4", "m5"]
    second, fresh = store.message_structs("a", last=3)  # asked twice in a row: kept
    assert not fresh and second == first and second[0] is not first[0]
    third, fresh = store.message_structs("a", last=3)
    assert not fresh and all(a is b for a, b in zip(third, second, strict=True))
    handed = store.messages("a", last=3)
    handed[0]["content"] = "changed"
    assert [m["content"] for m in store.messages("a", last=3)] == ["m3", "m4", "m5"]
    store.inject("a", user("m6"))  # the page moved: read again
    moved, fresh = store.message_structs("a", last=3)
    assert fresh and [m.content for m in moved] == ["m4", "m5", "m6"]
    whole, _ = store.message_structs("a")  # the whole transcript cached: pages are cut from it
    cut, fresh = store.message_structs("a", after=2, limit=2)
    assert not fresh and cut[0] is whole[2] and cut[1] is whole[3]
    with store.transaction():  # a transaction's reads never come from, nor go to, the cache
        inside, fresh = store.message_structs("a", after=2, limit=2)
        assert fresh and inside[0] is not whole[2]


def test_pages_asked_for_once_do_not_push_a_kept_page_out(make_store: StoreFactory) -> None:
    """A reader that asks once for the tail of each of many sessions (a list of previews)
    leaves the page a poller keeps where it is."""
    store = make_store(hot_sessions=2)
    for sid in "abcdef":
        filled(store, sid, 4)
    store.message_structs("a", last=2)
    kept, fresh = store.message_structs("a", last=2)
    assert not fresh
    for sid in "bcdef":  # more sessions than the cache holds, each asked once
        preview, fresh = store.message_structs(sid, last=2)
        assert fresh and [m.content for m in preview] == ["m2", "m3"]
    again, fresh = store.message_structs("a", last=2)
    assert not fresh and all(a is b for a, b in zip(again, kept, strict=True))


def test_threads_share_the_cache_of_transcripts_and_pages(make_store: StoreFactory) -> None:
    """Readers on many threads, whole transcripts, pages and context views, over more sessions
    than the cache holds (so entries are dropped while others are read): every read is right,
    none fails."""
    store = make_store(hot_sessions=2)
    family = {sid: [f"{sid}{i}" for i in range(5)] for sid in "abcd"}
    for sid, texts in family.items():
        store.open_session(sid)
        store.inject_many(sid, [user(text) for text in texts])
    store.fork("a", "e")
    family["e"] = family["a"]
    failures: list[BaseException] = []

    def read(seed: int) -> None:
        try:
            for n in range(300):
                sid = "abcde"[(seed + n) % 5]
                if n % 3 == 1:
                    assert [m["content"] for m in store.messages(sid, last=2)] == family[sid][-2:]
                elif n % 3 == 2:
                    assert [m["content"] for m in store.context(sid)] == family[sid]
                else:
                    assert contents(store, sid) == family[sid]
        except BaseException as exc:  # reported by the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=read, args=(seed,)) for seed in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as the interpreter lets them
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert failures == []


def test_a_cached_transcript_follows_every_change(make_store: StoreFactory) -> None:
    store = make_store(hot_sessions=4)
    filled(store, "a", 3)
    expected = ["m0", "m1", "m2"]
    changes: list[tuple[Callable[[], object], list[str]]] = [
        (lambda: store.inject("a", user("x")), [*expected, "x"]),
        (lambda: store.inject_many("a", [user("y"), user("z")]), [*expected, "x", "y", "z"]),
        (lambda: store.set_scratchpad("a", {"k": 1}), [*expected, "x", "y", "z"]),
        (lambda: store.fork("a", "b"), [*expected, "x", "y", "z"]),
        (lambda: store.inject("a", user("after fork")), [*expected, "x", "y", "z", "after fork"]),
        (lambda: store.trim("a", 2), ["z", "after fork"]),
        (lambda: store.inject("a", user("t")), ["z", "after fork", "t"]),
        (lambda: store.compact("a", keep_last=1), ["t"]),
        (lambda: store.inject("a", user("c")), ["t", "c"]),
        (lambda: store.reset("a"), []),
        (lambda: store.inject("a", user("r")), ["r"]),
    ]
    for change, want in changes:
        contents(store, "a")  # warm the cache before each change
        change()
        assert contents(store, "a") == want
        if store.exists("b"):
            assert contents(store, "b") == [*expected, "x", "y", "z"]
