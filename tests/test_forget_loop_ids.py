"""A prompt's caller-chosen loop ids (`loop_id`, `parent_loop_id`, `parallel_group`) in an
encrypted session, and what `forget` leaves of them: `prompt_started` and the runtime projection's
loop index hold their digests keyed by the session's data key, and `prompt_started` sealed copies
of their texts, so records show the caller's ids and a sub-agent still finds its parent's loop
while the key lives, and after `forget` no file holds their text and no guess can be checked.
Loop ids written before they were digested still read, link and rebuild."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from eventlog import events as ev
from projections import _runtime as rt
from sessions import ForgottenError, SessionStore
from sessions._keyring import KEYED_TEXT
from sessions._seal import SEALED_TEXT
from sessions._sealed_fields import KEYED
from sessions.runtime import MockProvider, Runtime
from tests._runtime_providers import FINAL_ANSWER, ScriptedProvider, calls
from tests.conftest import assert_rebuild_changes_nothing
from tests.test_encryption import KEY, every_byte
from tests.test_forget_traces import kinds_holding

LOOP = "loop-ticket-4711"
PARENT = "parent-ticket-4711"
GROUP = "group-ticket-4711"


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())  # type: ignore[arg-type]


def loop_indexed(store: SessionStore, sid: str, loop_id: str) -> bool:
    """Whether the runtime projection's loop index confirms `loop_id` as it is given."""
    with store.log.view() as view:
        return rt.load_loop(view, sid, loop_id) is not None


def started(store: SessionStore, sid: str) -> list[ev.PromptStarted]:
    found = [e.data for e in store.log.read_stream(sid) if isinstance(e.data, ev.PromptStarted)]
    return found


def shown(loop: dict[str, Any]) -> tuple[Any, ...]:
    return loop["loop_id"], loop["parent_loop_id"], loop["parallel_group"]


def test_loop_ids_leave_no_text_and_no_checkable_guess_after_forget(tmp_path: Path) -> None:
    """The reproducer: before loop ids were digested `prompt_started` held all three texts, the
    store's files held them after `forget`, and `rt/i/<sid>\\0loop-ticket-4711` confirmed it."""
    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:

        async def body() -> str:
            async with Runtime(store, providers=[MockProvider()]) as runtime:
                sid = str((await runtime.create("agent"))["session_id"])
                answer = await runtime.prompt(
                    sid, "hello", loop_id=LOOP, parent_loop_id=PARENT, parallel_group=GROUP
                )
                assert answer["loop_id"] == LOOP
                return sid

        sid = run(body)
        store.forget(sid)
        assert store.log.verify().ok
        assert {text: kinds_holding(store, sid, text) for text in (LOOP, PARENT, GROUP)} == {
            LOOP: set(),
            PARENT: set(),
            GROUP: set(),
        }
        assert not loop_indexed(store, sid, LOOP)
        with pytest.raises(ForgottenError):
            store.keyed_digest(sid, LOOP)  # the key a guess would need is gone with the data key
    stored = every_byte(path)
    assert [text for text in (LOOP, PARENT, GROUP) if text.encode() in stored] == []


def test_records_and_answers_show_the_callers_loop_ids_while_the_key_lives(
    tmp_path: Path,
) -> None:
    """The events and the loop index hold keyed digests; the answer, its retry and the record
    show the caller's ids, a tool call's loop names its prompt's loop by the caller's id, and
    the next prompt continues that loop by default. After `forget` the record shows none."""
    scripted = ScriptedProvider([calls(("noop", {})), FINAL_ANSWER, FINAL_ANSWER])
    tools = [{"name": "noop", "fn": lambda: "done"}]
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:

        async def body() -> tuple[str, list[dict[str, Any]]]:
            async with Runtime(store, providers=[scripted], default_provider="scripted") as runtime:
                sid = str((await runtime.create("agent"))["session_id"])
                first = await runtime.prompt(
                    sid, "go", request_id="r1", tools=tools, loop_id=LOOP, parallel_group=GROUP
                )
                again = await runtime.prompt(
                    sid, "go", request_id="r1", tools=tools, loop_id=LOOP, parallel_group=GROUP
                )
                assert first["loop_id"] == again["loop_id"] == LOOP
                await runtime.prompt(sid, "next", request_id="r2", loop_id="loop-2")
                loops = (await runtime.record(sid)).loops
                assert_rebuild_changes_nothing(store)
                assert (await runtime.record(sid)).loops == loops
                return sid, loops

        sid, loops = run(body)
        tool_loop = loops[1]["loop_id"]
        assert [shown(loop) for loop in loops] == [
            (LOOP, None, GROUP),
            (tool_loop, LOOP, None),  # the tool call's loop is the runtime's own id
            ("loop-2", LOOP, None),
        ]
        first, second = started(store, sid)
        assert first.loop_id == store.keyed_digest(sid, LOOP)
        assert first.parallel_group == store.keyed_digest(sid, GROUP)
        assert second.parent_loop_id == first.loop_id  # keyed once: the same digest again
        assert first.sealed_loop_id is not None and first.sealed_loop_id.startswith(SEALED_TEXT)
        assert first.loop_id is not None and first.loop_id.startswith(KEYED_TEXT)
        assert loop_indexed(store, sid, first.loop_id) and not loop_indexed(store, sid, LOOP)
        assert kinds_holding(store, sid, LOOP) == set()
        store.forget(sid)

        async def after() -> list[tuple[Any, ...]]:
            async with Runtime(store, providers=[scripted], default_provider="scripted") as runtime:
                return [shown(loop) for loop in (await runtime.record(sid)).loops]

        assert run(after) == [(None, None, None), (tool_loop, None, None), (None, None, None)]


def test_a_sub_agent_finds_its_encrypted_parents_loop_by_the_callers_id(tmp_path: Path) -> None:
    """The parent's loop index holds the digest of `plan-1`, which the projection cannot compute:
    the runtime records it in the child's `parent_spawn_ref`, so the parent's loop lists the
    child (after a rebuild too); the child's first loop continues `plan-1`."""
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:

        async def body() -> tuple[str, Any]:
            async with Runtime(store, providers=[MockProvider()]) as runtime:
                parent = str((await runtime.create("planner"))["session_id"])
                await runtime.prompt(parent, "plan", loop_id="plan-1")
                ref = {"session_id": parent, "loop_id": "plan-1", "tool_call_id": "call-7"}
                child = str((await runtime.create("worker", parent_spawn_ref=ref))["session_id"])
                await runtime.prompt(child, "work", loop_id="work-1")
                assert_rebuild_changes_nothing(store)
                found = (await runtime.record(parent)).get_loop("plan-1")
                assert found is not None
                assert found["child_loop_refs"] == [{"session_id": child, "tool_call_id": "call-7"}]
                child_record = await runtime.record(child)
                assert shown(child_record.loops[0]) == ("work-1", "plan-1", None)
                return parent, child_record.parent_spawn_ref

        parent, ref = run(body)
        assert ref[rt.KEYED_LOOP_ID] == store.keyed_digest(parent, "plan-1")
        assert ref["loop_id"] == "plan-1"  # the child's lineage, as the caller gave it


def test_loop_ids_stored_before_digests_still_show_continue_and_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop id an encrypted session stored in the clear (with its request id keyed, as after
    18cd19e) is still shown, continued by the next prompt, found by a sub-agent's reference and
    folded the same by a rebuild."""
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:

        async def prompt(sid: str | None, loop_id: str) -> str:
            async with Runtime(store, providers=[MockProvider()]) as runtime:
                if sid is None:
                    sid = str((await runtime.create("agent"))["session_id"])
                await runtime.prompt(sid, "hello", loop_id=loop_id)
                return sid

        with monkeypatch.context() as old:
            old.setitem(KEYED, ev.PromptStarted, ("request_id",))  # what was written before
            sid = run(lambda: prompt(None, "old-loop"))
        run(lambda: prompt(sid, "new-loop"))
        old_event, new_event = started(store, sid)
        assert old_event.loop_id == "old-loop" and old_event.sealed_loop_id is None
        assert new_event.parent_loop_id == store.keyed_digest(sid, "old-loop")
        assert loop_indexed(store, sid, "old-loop")

        async def body() -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
            async with Runtime(store, providers=[MockProvider()]) as runtime:
                ref = {"session_id": sid, "loop_id": "old-loop"}
                child = str((await runtime.create("worker", parent_spawn_ref=ref))["session_id"])
                record = await runtime.record(sid)
                found = record.get_loop("old-loop")
                assert found is not None
                assert record.loop_chain_to("new-loop") == ["old-loop", "new-loop"]
                return [shown(loop) for loop in record.loops], [{"session_id": child}]

        loops, children = run(body)
        assert loops == [("old-loop", None, None), ("new-loop", "old-loop", None)]
        with store.log.view() as view:
            linked = rt.load_loop(view, sid, "old-loop")
        assert linked is not None
        assert [{"session_id": ref["session_id"]} for ref in linked.child_loop_refs] == children
        assert_rebuild_changes_nothing(store)
