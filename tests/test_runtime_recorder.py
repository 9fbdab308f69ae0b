"""The loop recorder (seed 003) and the runtime projection: loop records and their tree queries,
usage, session header fields, input filters, task callbacks, inactivity rotation, many sessions at
once, recovery of prompts left in flight, and rebuild-equals-incremental."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

import projections as pj
from eventlog import events as ev
from projections import _runtime as rt
from sessions import SessionStore
from sessions.runtime import (
    InputRejectedError,
    MockProvider,
    Runtime,
    Verdict,
    _jobs,
    reject,
    warn,
)
from tests._runtime_providers import UsageProvider, expected_usage
from tests.conftest import assert_rebuild_changes_nothing


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())  # type: ignore[arg-type]


def runtime_view(store: SessionStore) -> dict[str, Any]:
    """Status, loops and usage of every runtime session, as the projection holds them."""
    out: dict[str, Any] = {}
    with store.log.view() as view:
        for state in pj.iter_states(view):
            runtime = rt.load_runtime(view, state.session_id)
            if runtime is not None:
                out[state.session_id] = (runtime, rt.load_loops(view, state.session_id))
        out["$total"] = rt.total_usage(view)
        out["$open"] = (list(rt.open_runtime_ids(view)), rt.open_runtime_count(view))
        out["$busy"] = list(rt.busy_ids(view))
    return out


def assert_rebuild_equals_incremental(store: SessionStore) -> None:
    incremental = runtime_view(store)
    assert_rebuild_changes_nothing(store)
    assert runtime_view(store) == incremental


def test_usage_is_recorded_per_loop_and_summed(store: SessionStore) -> None:
    async def body() -> None:
        usage = UsageProvider()
        async with Runtime(store, providers=[usage], default_provider="usage") as runtime:
            sid = (await runtime.create("a"))["session_id"]
            first = await runtime.prompt(sid, "abcd")
            second = await runtime.prompt(sid, "xy", {"model": "big"})
            assert first["usage"] == expected_usage("abcd")
            assert first["tool_calls"] == []  # no tools were offered: kept out of the transcript
            (dropped,) = store.messages(sid)[1]["metadata"]["dropped_tool_calls"]
            assert dropped == {"id": "call-4", "name": "noop", "arguments": {}}
            record = await runtime.record(sid)
            assert [loop["usage"] for loop in record.loops] == [
                expected_usage("abcd"),
                expected_usage("xy"),
            ]
            want = {k: expected_usage("abcd")[k] + expected_usage("xy")[k] for k in first["usage"]}
            assert record.total_usage() == want
            assert (await runtime.status(sid))["usage"] == want
            assert await runtime.total_usage() == want
            assert second["usage"]["total_tokens"] == 7
            reply = store.messages(sid)[-1]
            assert reply["model"] == "big" and reply["usage"]["total_tokens"] == 7
        assert_rebuild_equals_incremental(store)

    run(body)


def test_loop_records_and_the_loop_tree(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store) as runtime:
            sid = (await runtime.create("a", runtime_params={"model": "m1"}))["session_id"]
            await runtime.prompt(sid, "root", loop_id="L1")
            await runtime.prompt(sid, "follow-up", loop_id="L2")  # continues L1 by default
            for name in ("A", "B"):  # two parallel branches off L2
                await runtime.prompt(
                    sid, name, loop_id=f"P{name}", parent_loop_id="L2", parallel_group="g"
                )
            await runtime.prompt(sid, "after A", loop_id="L3", parent_loop_id="PA")
            await runtime.prompt(sid, "fresh root", loop_id="R2", parent_loop_id="elsewhere")
            record = await runtime.record(sid)
        assert [loop["loop_id"] for loop in record.loops] == ["L1", "L2", "PA", "PB", "L3", "R2"]
        assert record.get_loop("L2")["parent_loop_id"] == "L1"  # type: ignore[index]
        assert record.get_loop("nope") is None
        assert record.loop_chain_to("L3") == ["L1", "L2", "PA", "L3"]
        assert record.loop_chain_to("PB") == ["L1", "L2", "PB"]
        assert record.loop_chain_to("nope") == []
        assert [loop["loop_id"] for loop in record.root_loops()] == ["L1", "R2"]
        assert [loop["loop_id"] for loop in record.children_of("L2")] == ["PA", "PB"]
        assert [loop["loop_id"] for loop in record.parallel_siblings("PA")] == ["PA", "PB"]
        assert record.parallel_siblings("L1") == []
        loop = record.get_loop("PA")
        assert loop is not None and loop["status"] == "completed"
        assert loop["config"] == {"model": "m1"} and loop["provider"] == "mock"
        assert loop["started_at"] <= loop["finished_at"]
        assert record.last_active_at == record.get_loop("R2")["started_at"]  # type: ignore[index]
        assert_rebuild_equals_incremental(store)

    run(body)


def test_header_formation_scope_and_spawned_children(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store) as runtime:
            parent = (await runtime.create("planner"))["session_id"]
            await runtime.prompt(parent, "plan", loop_id="plan-1")
            ref = {"session_id": parent, "loop_id": "plan-1", "tool_call_id": "call-7"}
            child = (await runtime.create("worker", parent_spawn_ref=ref))["session_id"]
            await runtime.prompt(child, "work", loop_id="work-1")
            parent_record = await runtime.record(parent)
            child_record = await runtime.record(child)
        assert parent_record.formation["kind"] == "explicit"
        assert parent_record.scope == "persistent" and parent_record.parent_spawn_ref is None
        assert parent_record.get_loop("plan-1")["child_loop_refs"] == [  # type: ignore[index]
            {"session_id": child, "tool_call_id": "call-7"}
        ]
        assert child_record.parent_spawn_ref == ref
        # The sub-agent's first loop continues the parent's loop, which is in another session.
        assert child_record.loops[0]["parent_loop_id"] == "plan-1"
        assert [loop["loop_id"] for loop in child_record.root_loops()] == ["work-1"]
        assert_rebuild_equals_incremental(store)

    run(body)


def test_input_filters_pass_warn_reject(store: SessionStore) -> None:
    def no_keys(prompt: str) -> Verdict:
        return reject("looks like a key") if "sk-" in prompt else Verdict()

    def shouting(prompt: str) -> Verdict:
        return warn("all caps") if prompt.isupper() else Verdict()

    def broken(prompt: str) -> Verdict:
        if prompt == "crash":
            raise ValueError("bad filter")
        return Verdict()

    async def body() -> None:
        mock = MockProvider()
        async with Runtime(
            store, providers=[mock], input_filters=[no_keys, shouting, broken]
        ) as runtime:
            sid = (await runtime.create("a"))["session_id"]
            with pytest.raises(InputRejectedError, match=r"`no_keys` rejected .*looks like a key"):
                await runtime.prompt(sid, "my key is sk-123", request_id="r-bad")
            with pytest.raises(InputRejectedError, match="the filter failed: ValueError"):
                await runtime.prompt(sid, "crash")
            assert mock.calls == 0
            await runtime.prompt(sid, "HELLO")
            record = await runtime.record(sid)
            assert (await runtime.status(sid))["status"] == "idle"
        assert record.rejected_inputs == 2
        assert record.loops[0]["warnings"] == [{"filter": "shouting", "reason": "all caps"}]
        rejected = store.log.read_stream(sid)[1].data
        assert rejected == ev.InputRejected(
            filter="no_keys", reason="looks like a key", request_id="r-bad"
        )
        assert "sk-123" not in str(store.log.read_stream(sid))  # the rejected text is not kept
        assert mock.calls == 1
        assert_rebuild_equals_incremental(store)

    run(body)


def test_before_task_fires_once_and_after_task_on_close(store: SessionStore) -> None:
    seen: list[tuple[str, Any]] = []

    async def after(record: Any) -> None:  # hooks may be coroutines
        seen.append(("after", len(record.loops)))

    def before(info: dict[str, Any]) -> None:
        seen.append(("before", info["session_id"]))

    def broken(*args: object) -> None:
        raise RuntimeError("hook bug")

    async def body() -> None:
        async with Runtime(
            store, before_task=before, after_task=after, on_session_close=broken
        ) as runtime:
            sid = (await runtime.create("a"))["session_id"]
            await runtime.prompt(sid, "one")
            await runtime.prompt(sid, "two")
            closed = await runtime.close(sid)  # a failing hook changes no outcome
        assert closed["closed"] is True
        assert seen == [("before", sid), ("after", 2)]

    run(body)


def test_inactivity_rotates_to_a_linked_session(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store) as runtime:
            info = await runtime.create("a", runtime_params={"temperature": 0.1}, metadata={"k": 1})
            sid = info["session_id"]
            await runtime.prompt(sid, "hi")
            last = datetime.fromisoformat((await runtime.status(sid))["last_activity_at"])
            assert await runtime.rotate_if_inactive(sid, 300, last + timedelta(seconds=299)) == sid
            fresh = await runtime.rotate_if_inactive(sid, 300, last + timedelta(seconds=300))
            assert fresh != sid
            record = await runtime.record(fresh)
            assert record.formation["kind"] == "inactivity_timeout"
            assert record.formation["previous_session_id"] == sid
            assert record.formation["threshold_secs"] == 300
            assert (await runtime.record(sid)).status == "closed"
            result = await runtime.prompt(fresh, "again")
            assert (await runtime.record(fresh)).loops[0]["config"] == {"temperature": 0.1}
            assert result["text"] == "mock reply to: again"
            assert store.snapshot(fresh)["metadata"]["k"] == 1  # type: ignore[index]

    run(body)


def test_many_sessions_prompted_concurrently(store: SessionStore) -> None:
    sessions, turns = 40, 3

    async def body() -> None:
        usage = UsageProvider()
        async with Runtime(store, providers=[usage], default_provider="usage") as runtime:
            created = await asyncio.gather(*(runtime.create(f"agent-{i}") for i in range(sessions)))
            ids = [info["session_id"] for info in created]

            async def drive(index: int, sid: str) -> list[dict[str, Any]]:
                return [await runtime.prompt(sid, f"s{index} t{turn}") for turn in range(turns)]

            results = await asyncio.gather(*(drive(i, sid) for i, sid in enumerate(ids)))
            group = store._group
            assert group.commits >= 1  # prompts shared durable commits
            total = await runtime.total_usage()
            statuses = [(await runtime.status(sid))["status"] for sid in ids]
        flat = [r for per in results for r in per]
        assert len(flat) == sessions * turns
        want = {
            name: sum(
                expected_usage(f"s{i} t{t}")[name] for i in range(sessions) for t in range(turns)
            )
            for name in flat[0]["usage"]
        }
        assert {name: sum(r["usage"][name] for r in flat) for name in want} == want
        assert total == want
        assert statuses == ["idle"] * sessions
        for index, sid in enumerate(ids):
            assert [m["content"] for m in store.messages(sid)][::2] == [
                f"s{index} t{turn}" for turn in range(turns)
            ]
        assert_rebuild_equals_incremental(store)

    run(body)


def test_a_prompt_left_in_flight_is_failed_on_the_next_start(store: SessionStore) -> None:
    async def setup() -> str:
        async with Runtime(store) as runtime:
            sid = (await runtime.create("a"))["session_id"]
            await runtime.prompt(sid, "done before")
            return str(sid)

    sid = run(setup)
    # What a process killed mid-prompt leaves: `prompt_started` committed, no outcome.
    message = ev.Message(role="user", content="in flight")
    _jobs.start_prompt(
        store, sid, "r-lost", message, lambda name: {}, {}, ("l-lost", None, None), []
    )
    with store.log.view() as view:
        assert list(rt.busy_ids(view)) == [sid]

    async def restart() -> None:
        async with Runtime(store) as runtime:
            assert runtime.recovered == [sid]
            assert (await runtime.status(sid))["status"] == "failed"
            lost = (await runtime.record(sid)).get_loop("l-lost")
            assert lost is not None and lost["status"] == "failed"
            assert lost["error_kind"] == "interrupted"
        async with Runtime(store) as again:
            assert again.recovered == []  # recovery writes once

    run(restart)
    assert [e.type for e in store.log.read_stream(sid)][-2:] == ["prompt_started", "prompt_failed"]
    assert_rebuild_equals_incremental(store)


def test_the_projection_ignores_events_that_do_not_fit(store: SessionStore) -> None:
    """A total fold: outcomes for requests not in flight, prompts to plain sessions, change
    nothing the runtime keeps."""
    plain = store.open_session("plain")
    store.log.append(
        plain,
        [ev.PromptStarted(request_id="r", prompt=ev.Message(role="user", content="x"))],
        expected_version=1,
    )

    async def body() -> str:
        async with Runtime(store) as runtime:
            sid = (await runtime.create("a"))["session_id"]
            await runtime.prompt(sid, "hi")
            return str(sid)

    sid = run(body)
    before = runtime_view(store)
    version = store.log.stream_version(sid)
    store.log.append(
        sid,
        [
            ev.PromptCompleted(request_id="stale", reply=ev.Message(role="assistant")),
            ev.PromptFailed(request_id="stale", error="x"),
            ev.PromptCancelled(request_id="stale"),
        ],
        expected_version=version,
    )
    after = runtime_view(store)
    assert after == before and "plain" not in after
    assert_rebuild_equals_incremental(store)
