"""What an encrypted session wrote itself must open under its own key: a message of its own stripped
of its ciphertext (plain text put in its place), or relabelled to the destroyed key of another
session, is refused naming its position, where it read as the forged text or as a forgotten
placeholder. What a fork inherited keeps its rules: a plain parent's messages read plain, and a
forgotten parent's as placeholders. A session whose own key is gone reads as forgotten
(`ForgottenError`) even where its projection does not say so yet (a view of the past)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

import projections as pj
from eventlog import ForgottenError, IntegrityError
from eventlog import events as ev
from sessions import ConcurrencyError, ContextPolicy, LocalKeyProvider, SessionStore

KEY = LocalKeyProvider(bytes(range(32)))


def stored(store: SessionStore, sid: str, kind: type[ev.Event]) -> tuple[int, Any]:
    """(position, event) of the last `kind` event of `sid`, as stored."""
    return [(e.position, e.data) for e in store.log.read_stream(sid) if type(e.data) is kind][-1]


def state_in(view: Any, sid: str) -> pj.SessionState:
    state = pj.load_state(view, sid)
    assert state is not None
    return state


@contextmanager
def opener_of(store: SessionStore, sid: str) -> Iterator[Any]:
    """The session's opener, in a read of the store."""
    sealer = store._sealer
    assert sealer is not None
    with store.log.view() as view:
        yield sealer.opener(view, state_in(view, sid), "test")


def slot_of(store: SessionStore, sid: str) -> int:
    with store.log.view() as view:
        return state_in(view, sid).key_slot


def relabelled(blob: bytes, slot: int) -> bytes:
    """`blob` with the keyring slot of its header (after the format byte) set to `slot`."""
    return blob[:1] + slot.to_bytes(4, "big") + blob[5:]


def refused(open_event: Any, data: ev.Event, position: int, wanted: list[int]) -> None:
    with pytest.raises(IntegrityError) as caught:
        open_event(data, position, wanted)
    assert caught.value.position == position
    assert f"position {position}" in str(caught.value)


def written(store: SessionStore, sid: str) -> tuple[int, ev.MessageInjected, int, Any]:
    store.inject(sid, {"role": "user", "content": "one-secret"})
    store.inject_many(sid, [{"role": "user", "content": f"many-{i}-secret"} for i in range(5)])
    at, lone = stored(store, sid, ev.MessageInjected)
    listed_at, listed = stored(store, sid, ev.MessagesInjected)
    return at, lone, listed_at, listed


def test_an_own_message_stripped_of_its_seal_is_refused(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        sid = store.open_session("s")
        at, lone, listed_at, listed = written(store, sid)
        forged = ev.Message(role="user", content="forged")
        with opener_of(store, sid) as open_event:
            assert open_event(lone, at, [0])[0].content == "one-secret"
            refused(open_event, ev.MessageInjected(message=forged), at, [0])
            # A batch's ciphertext taken away and plain text put in the first shell (format 2),
            # or in every message (as if the list had been written plain).
            shells = listed.messages
            for messages in ([forged, *shells[1:]], [forged] * len(shells)):
                for wanted in ([0], [0, 1, 2, 3, 4]):
                    refused(open_event, ev.MessagesInjected(messages=messages), listed_at, wanted)


def test_an_own_message_relabelled_to_a_destroyed_key_is_refused(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        gone, sid = store.open_session("gone"), store.open_session("s")
        store.inject_many(gone, [{"role": "user", "content": "x"}] * 3)
        at, lone, listed_at, listed = written(store, sid)
        store.forget(gone)
        slot = slot_of(store, gone)
        moved = msgspec.structs.replace(lone.message, sealed=relabelled(lone.message.sealed, slot))
        first = listed.messages[0]
        shells = [msgspec.structs.replace(first, sealed=relabelled(first.sealed, slot))]
        with opener_of(store, sid) as open_event:
            refused(open_event, ev.MessageInjected(message=moved), at, [0])
            for wanted in ([0], [4], [0, 1, 2, 3, 4]):
                data = ev.MessagesInjected(messages=[*shells, *listed.messages[1:]])
                refused(open_event, data, listed_at, wanted)
            # Untouched, they open.
            assert open_event(listed, listed_at, [4])[0].content == "many-4-secret"


def test_what_a_fork_inherited_reads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SessionStore.open(path) as store:
        store.open_session("plain")
        store.inject_many("plain", [{"role": "user", "content": f"p{i}"} for i in range(3)])
    with SessionStore.open(path, keys=KEY, hot_sessions=0) as store:
        store.open_session("sealed")
        store.inject_many("sealed", [{"role": "user", "content": f"s{i}"} for i in range(3)])
        of_plain, of_sealed = store.fork("plain", "a"), store.fork("sealed", "b")
        for child in (of_plain, of_sealed):
            store.inject(child, {"role": "user", "content": "own"})
        assert [m["content"] for m in store.messages(of_plain)] == ["p0", "p1", "p2", "own"]
        store.forget("sealed")
        shown = store.messages(of_sealed, last=4)
        assert [m["metadata"] for m in shown[:3]] == [{"forgotten": True}] * 3
        assert shown[3]["content"] == "own"


def test_a_view_of_the_past_of_a_forgotten_session_refuses_its_content(tmp_path: Path) -> None:
    # As of a position before the forget, the session's projection is not yet forgotten, but
    # its key is gone: its content read as placeholders, title and all, as if it had none.
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        sid = store.open_session("s", title="a-title-secret", metadata={"m": "meta-secret"})
        store.inject(sid, {"role": "user", "content": "one-secret"})
        store.inject_many(sid, [{"role": "user", "content": f"m{i}-secret"} for i in range(5)])
        child = store.fork_at(sid, keep_first=3)
        store.inject(child, {"role": "user", "content": "the child's own"})
        before = store.log.head
        store.forget(sid)
        past = store.as_of(before)
        reads = {
            "messages": lambda: past.messages(sid),
            "a page": lambda: past.messages(sid, after=1, limit=2),
            "the last": lambda: past.messages(sid, last=1),
            "context": lambda: past.context(sid),
            "snapshot": lambda: past.snapshot(sid),
            "summary": lambda: past.summary(sid),
        }
        for read in reads.values():
            with pytest.raises(ForgottenError):
                read()
        # A listing shows it without its title; the fork keeps its own messages.
        listed = {s["session_id"]: s for s in past.list_sessions()["sessions"]}
        assert listed[sid]["title"] is None
        shown = past.messages(child)
        assert [m["metadata"] for m in shown[:3]] == [{"forgotten": True}] * 3
        assert shown[3]["content"] == "the child's own"


def test_another_session_s_message_is_not_read_as_the_session_s_own(tmp_path: Path) -> None:
    # A transcript pointed at another session's events (its references altered): what was
    # written since the session was opened is its own, so it must be under its own key.
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        sid, other = store.open_session("s"), store.open_session("other")
        at, lone, listed_at, listed = written(store, other)
        with opener_of(store, sid) as open_event:
            refused(open_event, lone, at, [0])
            for wanted in ([0], [4], [0, 1, 2, 3, 4]):
                refused(open_event, listed, listed_at, wanted)
        with opener_of(store, other) as open_event:
            assert open_event(lone, at, [0])[0].content == "one-secret"


def test_another_session_s_value_is_not_read_as_a_root_session_s_own(tmp_path: Path) -> None:
    # A session that is not a fork holds only values it sealed itself: one of another session's
    # put in its projection (a title, a metadata value) is refused, not shown as its own.
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        sid = store.open_session("s", title="s-title", metadata={"m": "s-meta"})
        other = store.open_session("other", title="o-title", metadata={"m": "o-meta"})
        sealer = store._sealer
        assert sealer is not None
        with store.log.view() as view:
            mine, theirs = state_in(view, sid), state_in(view, other)
        assert sealer.open_state(mine, "test").title == "s-title"
        for changed in (
            msgspec.structs.replace(mine, title=theirs.title),
            msgspec.structs.replace(mine, metadata=theirs.metadata),
            msgspec.structs.replace(mine, system_prompt=theirs.title),
        ):
            with pytest.raises(IntegrityError):
                sealer.open_state(changed, "test")
        # A fork holds what it inherited under its parent's key, and reads it.
        child = store.fork(other, "kid")
        snap = store.snapshot(child)
        assert snap is not None and snap["metadata"] == {"m": "o-meta"}


def test_a_compaction_does_not_keep_what_a_forget_destroyed_while_it_ran(
    tmp_path: Path,
) -> None:
    # A fork's compaction reads its parent's messages, runs its strategy outside the write
    # transaction, then commits the replacement under the fork's own key: if the parent was
    # forgotten meanwhile, committing would keep its content readable after the forget.
    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY, hot_sessions=0) as store:
        store.open_session("parent")
        store.inject_many("parent", [{"role": "user", "content": f"p{i}-secret"} for i in range(4)])
        child = store.fork("parent", "kid")
        store.inject(child, {"role": "user", "content": "the child's own"})

        def forget_meanwhile(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
            store.forget("parent")
            return messages[1:]

        with pytest.raises(ConcurrencyError):
            store.compact(child, compact_strategy="custom", custom_compactor=forget_meanwhile)
        shown = store.messages(child)
        assert [m.get("content") for m in shown] == [None] * 4 + ["the child's own"]
        # Compacted again, it keeps what it reads now: placeholders.
        store.compact(child, compact_strategy="custom", custom_compactor=lambda ms: ms[1:])
        assert [m.get("content") for m in store.messages(child)] == [None] * 3 + ["the child's own"]


def test_a_checkpoint_does_not_keep_what_a_forget_destroyed_while_it_ran(tmp_path: Path) -> None:
    # The same for maintain_context's summary: the model runs outside the write on the context
    # as read; a parent forgotten meanwhile sends it back to read (placeholders) and run again.
    with SessionStore.open(tmp_path / "s", keys=KEY, hot_sessions=0) as store:
        store.open_session("parent")
        for i in range(6):
            store.inject("parent", {"role": "user", "content": f"p{i}-secret " * 20})
            store.inject("parent", {"role": "assistant", "content": f"a{i}"})
        child = store.fork("parent", "kid")
        store.inject(child, {"role": "user", "content": "the child's own"})
        seen: list[list[Any]] = []

        def summarize(messages: list[dict[str, Any]], **_: Any) -> str:
            seen.append([m.get("content") for m in messages])
            store.forget("parent")
            return " / ".join(str(m.get("content")) for m in messages)

        policy = ContextPolicy(
            window_tokens=200, summarize_ratio=0.1, keep_turns=1, summarizer=summarize
        )
        store.maintain_context(child, policy=policy)
        assert "secret" in str(seen[0]) and "secret" not in str(seen[1:])
        assert "secret" not in str(store.messages(child))
        assert "secret" not in str(store.context(child))


def test_an_inherited_list_that_lost_its_ciphertext_is_refused(tmp_path: Path) -> None:
    # Before the fork, what a message without a ciphertext is cannot be told from the fork (a
    # parent from before the store had keys wrote plain), but a list whose other messages are
    # the empty shells of a sealed list lost the ciphertext its first one held.
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        store.open_session("parent")
        listed_at, listed = written(store, "parent")[2:]
        child = store.fork("parent", "kid")
        forged = [ev.Message(role="user", content="forged"), *listed.messages[1:]]
        with opener_of(store, child) as open_event:
            assert open_event(listed, listed_at, [0])[0].content == "many-0-secret"
            for wanted in ([0], [0, 1, 2, 3, 4]):
                refused(open_event, ev.MessagesInjected(messages=forged), listed_at, wanted)
