"""A sub-agent's `parent_spawn_ref` in an encrypted session, and what `forget` leaves of it: the
caller's `loop_id` and `tool_call_id` are kept as digests keyed by the child's data key, with
their texts sealed beside them under that key, so the snapshot, the record and the child's first
loop show them while the key lives, the parent's loop still lists the child (by `keyed_loop_id`,
the parent's own digest), and after `forget` no file holds their text and no guess can be
checked. Plain stores, and references stored in the clear before, read as they always did."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

import projections as pj
from eventlog import events as ev
from projections import _runtime as rt
from sessions import (
    ForgottenError,
    InvalidArgumentError,
    SessionExistsError,
    SessionStore,
)
from sessions._keyring import KEYED_TEXT
from sessions._seal import SEALED_TEXT
from sessions._sealed_fields import KEYED_REFS
from sessions.runtime import MockProvider, Runtime
from tests.conftest import assert_rebuild_changes_nothing
from tests.test_encryption import KEY, every_byte
from tests.test_forget_traces import kinds_holding

PLAN = "plan-ticket-5823"
CALL = "call-ticket-5823"


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())  # type: ignore[arg-type]


def opened_ref(store: SessionStore, sid: str) -> dict[str, Any] | None:
    """The `parent_spawn_ref` of the child's `session_opened`, as the log stores it."""
    first = store.log.read_stream(sid, limit=1)[0].data
    assert isinstance(first, ev.SessionOpened)
    return first.parent_spawn_ref


def projected_ref(store: SessionStore, sid: str) -> dict[str, Any] | None:
    """The `parent_spawn_ref` the session projection keeps, as it is stored."""
    with store.log.view() as view:
        state = pj.load_state(view, sid)
    assert state is not None
    return state.parent_spawn_ref


def listed(store: SessionStore, parent: str, loop_id: str) -> list[dict[str, Any]]:
    """The child references the parent's loop record keeps, as the projection stores them."""
    held = store.keyed_digest(parent, loop_id) or loop_id  # as the parent's loop index holds it
    with store.log.view() as view:
        loop = rt.load_loop(view, parent, held)
    assert loop is not None
    return loop.child_loop_refs


def spawn(store: SessionStore, **prompt: Any) -> tuple[str, str, dict[str, Any]]:
    """A parent runtime session whose loop `PLAN` spawns a child: ids and the reference given."""

    async def body() -> tuple[str, str, dict[str, Any]]:
        async with Runtime(store, providers=[MockProvider()]) as runtime:
            parent = str((await runtime.create("planner"))["session_id"])
            await runtime.prompt(parent, "plan", loop_id=PLAN, **prompt)
            ref = {"session_id": parent, "loop_id": PLAN, "tool_call_id": CALL}
            child = str((await runtime.create("worker", parent_spawn_ref=ref))["session_id"])
            await runtime.prompt(child, "work", loop_id="work-1")
            return parent, child, ref

    result: tuple[str, str, dict[str, Any]] = run(body)
    return result


def records(store: SessionStore, *sids: str) -> list[Any]:
    async def body() -> list[Any]:
        async with Runtime(store, providers=[MockProvider()]) as runtime:
            return [await runtime.record(sid) for sid in sids]

    found: list[Any] = run(body)
    return found


def test_a_spawn_ref_leaves_no_loop_id_text_and_no_checkable_guess_after_forget(
    tmp_path: Path,
) -> None:
    """The reproducer: the child's `session_opened` and projected state held the parent's loop id
    and tool call id in the clear (and the parent's loop record the tool call id), so after both
    sessions were forgotten the store's files still held them. Now the log and the projection
    hold digests and sealed copies; reads show the texts while the keys live."""
    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:
        parent, child, ref = spawn(store)
        stored = opened_ref(store, child)
        assert stored is not None
        for text in (PLAN, CALL):
            assert kinds_holding(store, child, text) == set()
            assert text.encode() not in msgspec.json.encode(projected_ref(store, child))
            assert text.encode() not in msgspec.json.encode(listed(store, parent, PLAN))
        assert stored["session_id"] == parent  # ancestry stays readable
        assert stored["loop_id"] == store.keyed_digest(child, PLAN)
        assert stored["tool_call_id"] == store.keyed_digest(child, CALL)
        assert stored["sealed_loop_id"].startswith(SEALED_TEXT)
        assert stored[rt.KEYED_LOOP_ID] == store.keyed_digest(parent, PLAN)
        # While the keys live every read shows the caller's reference as it was given.
        shown = {**ref, rt.KEYED_LOOP_ID: stored[rt.KEYED_LOOP_ID]}
        summary = store.summary(child)
        assert summary is not None and summary["parent_spawn_ref"] == shown
        parent_record, child_record = records(store, parent, child)
        assert child_record.parent_spawn_ref == shown
        assert child_record.loops[0]["parent_loop_id"] == PLAN  # the first loop continues it
        loop = parent_record.get_loop(PLAN)
        assert loop["child_loop_refs"] == [{"session_id": child, "tool_call_id": CALL}]
        fork = store.fork(child)
        forked = store.summary(fork)
        assert forked is not None and forked["parent_spawn_ref"] == shown
        assert_rebuild_changes_nothing(store)
        for sid in (fork, child, parent):
            store.forget(sid)
        assert store.log.verify().ok
        for sid, text in ((child, PLAN), (child, CALL), (parent, PLAN)):
            with pytest.raises(ForgottenError):
                store.keyed_digest(sid, text)  # the keys a guess would need are gone
        (after,) = records(store, child)
        assert after.parent_spawn_ref == {**shown, "loop_id": None, "tool_call_id": None}
        assert_rebuild_changes_nothing(store)
    every = every_byte(path)
    assert [text for text in (PLAN, CALL) if text.encode() in every] == []


def test_the_child_keeps_its_lineage_while_its_own_key_lives(tmp_path: Path) -> None:
    """The reference is the child's data, under the child's key: forgetting the parent leaves it
    readable to the child (only the parent's digest of the loop id can no longer be checked);
    forgetting the child ends it, while the parent still lists the child by session id."""
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        parent, child, _ = spawn(store)
        store.forget(parent)
        summary = store.summary(child)
        assert summary is not None and summary["parent_spawn_ref"]["loop_id"] == PLAN
        with pytest.raises(ForgottenError):
            store.keyed_digest(parent, PLAN)
        store.forget(child)
        with pytest.raises(ForgottenError):
            store.summary(child)
        parent_record, child_record = records(store, parent, child)
        assert child_record.parent_spawn_ref["loop_id"] is None
        assert child_record.parent_spawn_ref["session_id"] == parent
        (loop,) = parent_record.loops
        assert loop["child_loop_refs"] == [{"session_id": child, "tool_call_id": None}]
        assert_rebuild_changes_nothing(store)


def test_a_plain_store_keeps_the_reference_as_given(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "s") as store:
        parent, child, ref = spawn(store)
        assert opened_ref(store, child) == ref == projected_ref(store, child)
        assert listed(store, parent, PLAN) == [{"session_id": child, "tool_call_id": CALL}]
        parent_record, child_record = records(store, parent, child)
        assert child_record.parent_spawn_ref == ref
        assert child_record.loops[0]["parent_loop_id"] == PLAN
        loop = parent_record.get_loop(PLAN)
        assert loop["child_loop_refs"] == [{"session_id": child, "tool_call_id": CALL}]


def test_references_stored_in_the_clear_before_still_read_link_and_continue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child an encrypted store opened before spawn references were digested (its loop id and
    tool call id in the clear) still shows them, is listed under the parent's loop, continues
    that loop and rebuilds the same."""
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        with monkeypatch.context() as old:
            old.setitem(KEYED_REFS, ev.SessionOpened, ("parent_spawn_ref", ()))
            parent, child, ref = spawn(store)
        stored = opened_ref(store, child)
        assert stored is not None and {name: stored[name] for name in ref} == ref
        assert "sealed_loop_id" not in stored
        summary = store.summary(child)
        assert summary is not None and summary["parent_spawn_ref"] == stored
        parent_record, child_record = records(store, parent, child)
        assert child_record.parent_spawn_ref == stored
        assert child_record.loops[0]["parent_loop_id"] == PLAN
        loop = parent_record.get_loop(PLAN)
        assert loop["child_loop_refs"] == [{"session_id": child, "tool_call_id": CALL}]
        assert_rebuild_changes_nothing(store)


def test_a_sub_agent_of_a_plain_parent_is_listed_without_its_text_kept_by_the_child(
    tmp_path: Path,
) -> None:
    """A parent opened before the store had keys indexes its loop ids in the clear; an encrypted
    child links to it by that text (which the parent's log holds anyway), and keeps its own copy
    of the reference keyed and sealed like any other."""
    path = tmp_path / "s"
    with SessionStore.open(path) as plain:

        async def body() -> str:
            async with Runtime(plain, providers=[MockProvider()]) as runtime:
                parent = str((await runtime.create("planner"))["session_id"])
                await runtime.prompt(parent, "plan", loop_id=PLAN)
                return parent

        parent = run(body)
    with SessionStore.open(path, keys=KEY) as store:

        async def spawned() -> str:
            async with Runtime(store, providers=[MockProvider()]) as runtime:
                ref = {"session_id": parent, "loop_id": PLAN, "tool_call_id": CALL}
                return str((await runtime.create("worker", parent_spawn_ref=ref))["session_id"])

        child = run(spawned)
        stored = opened_ref(store, child)
        assert stored is not None and stored["loop_id"].startswith(KEYED_TEXT)
        assert stored[rt.KEYED_LOOP_ID] == PLAN  # the parent's loop index holds it so
        (parent_record,) = records(store, parent)
        loop = parent_record.get_loop(PLAN)
        assert loop["child_loop_refs"] == [{"session_id": child, "tool_call_id": CALL}]
        assert_rebuild_changes_nothing(store)


def test_opening_again_compares_the_reference_as_given(tmp_path: Path) -> None:
    """`open_session` with the same reference reuses the session; another one is refused. A
    reference that brings the engine's own `sealed_` field to an encrypted session is refused."""
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        parent = store.open_session("parent")
        ref = {"session_id": parent, "loop_id": PLAN, "tool_call_id": CALL}
        assert store.open_session("child", parent_spawn_ref=ref) == "child"
        assert store.open_session("child", parent_spawn_ref=dict(ref)) == "child"
        with pytest.raises(SessionExistsError, match="parent_spawn_ref"):
            store.open_session("child", parent_spawn_ref={**ref, "loop_id": "other"})
        head = store.log.head
        with pytest.raises(InvalidArgumentError, match="sealed_loop_id"):
            store.open_session("other", parent_spawn_ref={**ref, "sealed_loop_id": "x"})
        assert store.log.head == head
        assert PLAN.encode() not in msgspec.json.encode(opened_ref(store, "child"))


def test_the_viewers_tree_shows_an_encrypted_sub_agents_tool_call_while_its_key_lives(
    tmp_path: Path,
) -> None:
    from service._access import Caller
    from service.viewer._api import family

    with SessionStore.open(tmp_path / "store", keys=KEY) as store:
        parent, child, _ = spawn(store)
        admin = Caller("admin", admin=True, all_sessions=True)
        nodes = {node["id"]: node for node in family(store, admin, parent)["nodes"]}
        assert nodes[child]["kind"] == "subagent" and nodes[child]["parent_id"] == parent
        assert nodes[child]["at"] == CALL  # the spawning call, opened with the child's key
        store.forget(child)  # the tree is still drawn, the child a node with nothing to open
        nodes = {node["id"]: node for node in family(store, admin, parent)["nodes"]}
        assert nodes[child]["status"] == "forgotten" and nodes[child]["at"] is None
        assert nodes[parent]["kind"] == "root"
        other_parent, other_child, _ = spawn(store)
        store.forget(other_parent)  # a child's tree is drawn from below its forgotten parent
        nodes = {node["id"]: node for node in family(store, admin, other_child)["nodes"]}
        assert list(nodes) == [other_child] and nodes[other_child]["kind"] == "root"
