"""`integrations.adk.SessionlogSessionService` through Google ADK's own `Runner` running an
`LlmAgent` with a scripted model, beside ADK's `InMemorySessionService` on the same script, and
the behaviours ADK's own session-service tests check."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events import Event, EventActions
from google.adk.models import BaseLlm, LlmRequest, LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import BaseSessionService, InMemorySessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types
from pydantic import Field

import eventlog._transaction
import projections as pj
from integrations.adk import SessionlogSessionService, session_key
from sessions import InvalidArgumentError, LimitExceededError, LocalKeyProvider, SessionStore
from tests._held_worker import cancel_while_held, held_worker

APP, USER = "weather-app", "u-1"


class ScriptedLlm(BaseLlm):
    """A model that answers from a script: each call pops the next list of parts."""

    script: list[list[types.Part]] = Field(default_factory=list)
    requests: list[int] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(len(llm_request.contents))
        parts = self.script.pop(0)
        yield LlmResponse(content=types.Content(role="model", parts=parts))


def weather(city: str) -> dict[str, Any]:
    """The weather in a city."""
    return {"city": city, "sky": "sunny", "raw": "21C"}


def script() -> list[list[types.Part]]:
    call = types.FunctionCall(name="weather", args={"city": "Oslo"}, id="call-1")
    return [
        [types.Part(function_call=call)],
        [types.Part(text="Sunny in Oslo.")],
        [types.Part(text="You asked about Oslo.")],
    ]


async def converse(service: BaseSessionService) -> tuple[list[Event], ScriptedLlm]:
    model = ScriptedLlm(model="scripted", script=script(), requests=[])
    agent = LlmAgent(name="forecaster", model=model, tools=[weather], output_key="last_answer")
    runner = Runner(agent=agent, app_name=APP, session_service=service)
    session = await service.create_session(
        app_name=APP, user_id=USER, session_id="s-1", state={"app:units": "metric", "k": 1}
    )
    for text in ("Weather in Oslo?", "What did I ask?"):
        message = types.Content(role="user", parts=[types.Part(text=text)])
        async for _ in runner.run_async(user_id=USER, session_id=session.id, new_message=message):
            pass
    stored = await service.get_session(app_name=APP, user_id=USER, session_id="s-1")
    assert stored is not None
    assert stored.state["last_answer"] == "You asked about Oslo."
    assert stored.state["app:units"] == "metric"
    return stored.events, model


def _shape(events: list[Event]) -> list[tuple[str, Any]]:
    """What a run stored, without the ids and times each service mints."""
    return [
        (e.author, e.model_dump(mode="json", exclude={"id", "timestamp", "invocation_id"}))
        for e in events
    ]


def test_the_runner_stores_what_adks_own_service_stores(tmp_path: Path) -> None:
    ours, ours_model = asyncio.run(converse(SessionlogSessionService(tmp_path / "store")))
    theirs, their_model = asyncio.run(converse(InMemorySessionService()))
    assert _shape(ours) == _shape(theirs)
    assert len(ours) == 6  # two user messages, a call, its response, two answers
    assert ours_model.requests == their_model.requests  # the model saw the same history
    calls = [p.function_call for e in ours for p in e.content.parts if p.function_call]
    answers = [p.function_response for e in ours for p in e.content.parts if p.function_response]
    assert [c.id for c in calls] == [a.id for a in answers] == ["call-1"]


def test_events_come_back_equal_bytes_as_bytes(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        session = await service.create_session(app_name=APP, user_id=USER)
        blob = types.Blob(mime_type="image/png", data=b"\x89PNG\r\n\x00\xff")
        event = Event(
            invocation_id="inv-1",
            author="user",
            content=types.Content(role="user", parts=[types.Part(inline_data=blob)]),
            actions=EventActions(state_delta={"seen": True}),
        )
        await service.append_event(session, event)
        service.store.store.close()
        again = SessionlogSessionService(tmp_path / "store")
        got = await again.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None and got.events == [event]
        assert got.events[0].content.parts[0].inline_data.data == b"\x89PNG\r\n\x00\xff"
        again.store.store.close()

    asyncio.run(main())


def _event(text: str, *, at: float | None = None, **actions: Any) -> Event:
    event = Event(
        invocation_id="inv",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        actions=EventActions(**actions),
    )
    if at is not None:
        event.timestamp = at
    return event


def test_app_and_user_state_are_shared_and_temp_state_is_never_stored(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        one = await service.create_session(
            app_name=APP, user_id=USER, state={"app:a": 1, "user:b": 2, "temp:c": 3, "d": 4}
        )
        assert one.state == {"app:a": 1, "user:b": 2, "d": 4}
        two = await service.create_session(app_name=APP, user_id=USER)
        other = await service.create_session(app_name=APP, user_id="u-2")
        assert two.state == {"app:a": 1, "user:b": 2}
        assert other.state == {"app:a": 1}
        delta = {"app:a": 10, "user:b": 20, "temp:t": "scratch", "own": "x"}
        await service.append_event(one, _event("hi", state_delta=delta))
        assert one.state["temp:t"] == "scratch"  # the live copy keeps it for this invocation
        for sid, user in ((one.id, USER), (two.id, USER), (other.id, "u-2")):
            got = await service.get_session(app_name=APP, user_id=user, session_id=sid)
            assert got is not None
            assert "temp:t" not in got.state
            assert got.state["app:a"] == 10
            assert got.state.get("user:b") == (20 if user == USER else None)
        stored = await service.get_session(app_name=APP, user_id=USER, session_id=one.id)
        assert stored is not None and stored.state["own"] == "x"
        assert "temp:t" not in stored.events[0].actions.state_delta
        assert await service.get_user_state(app_name=APP, user_id=USER) == {"b": 20}

    asyncio.run(main())


def test_an_existing_id_is_refused_and_partial_events_are_skipped(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        session = await service.create_session(app_name=APP, user_id=USER, session_id="x")
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name=APP, user_id=USER, session_id="x")
        partial = _event("stream chunk")
        partial.partial = True
        assert await service.append_event(session, partial) is partial
        got = await service.get_session(app_name=APP, user_id=USER, session_id="x")
        assert got is not None and got.events == []
        # the same names under another user or app are other sessions
        await service.create_session(app_name=APP, user_id="u-2", session_id="x")
        await service.create_session(app_name="other/app", user_id=USER, session_id="x")

    asyncio.run(main())


def test_a_stale_writer_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        created = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        first = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        second = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert first is not None and second is not None
        await service.append_event(first, _event("one"))
        await service.append_event(first, _event("two"))  # its own copy stays current
        with pytest.raises(StaleSessionError):
            await service.append_event(second, _event("stale"))
        with pytest.raises(StaleSessionError):
            await service.append_event(created, _event("stale too"))
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and [e.content.parts[0].text for e in got.events] == ["one", "two"]

    asyncio.run(main())


def test_a_redelivered_event_is_stored_once(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        before = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        event = _event("once")
        await service.append_event(session, event)
        copy = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert copy is not None and before is not None
        await service.append_event(copy, event)
        # A retry from the copy the first try held (its answer lost, say to a cancellation):
        # the event is the session's newest, so it is recognised, not refused as stale.
        await service.append_event(before, event)
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and len(got.events) == 1
        await service.append_event(got, _event("next"))
        with pytest.raises(StaleSessionError):  # no longer the newest: a stale copy is refused
            await service.append_event(before, event)

    asyncio.run(main())


def test_events_at_one_time_or_out_of_order_are_each_stored(tmp_path: Path) -> None:
    """Only the newest event is compared with the one appended, and only when that one is not
    newer than it: events sharing a timestamp, or one stamped earlier, are distinct events."""

    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        for text, at in [("a", 100.0), ("b", 100.0), ("c", 50.0), ("d", 200.0)]:
            await service.append_event(session, _event(text, at=at))
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None
        assert [e.content.parts[0].text for e in got.events] == ["a", "b", "c", "d"]
        assert got.last_update_time == 200.0
        await service.append_event(got, got.events[-1])  # the newest again: a re-delivery
        again = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert again is not None and len(again.events) == 4

    asyncio.run(main())


def test_get_session_config_last_n_and_after_a_time(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        for i in range(150):
            await service.append_event(session, _event(f"e{i}", at=1_000.0 + i))

        async def texts(config: GetSessionConfig) -> list[str]:
            got = await service.get_session(
                app_name=APP, user_id=USER, session_id="s", config=config
            )
            assert got is not None
            return [e.content.parts[0].text for e in got.events]

        assert await texts(GetSessionConfig(num_recent_events=3)) == ["e147", "e148", "e149"]
        assert await texts(GetSessionConfig(num_recent_events=0)) == []
        assert await texts(GetSessionConfig(after_timestamp=1_145.0)) == [
            f"e{i}" for i in range(145, 150)
        ]
        assert len(await texts(GetSessionConfig(after_timestamp=1_010.0))) == 140
        assert await texts(GetSessionConfig(after_timestamp=1_100.0, num_recent_events=2)) == [
            "e148",
            "e149",
        ]
        assert await texts(GetSessionConfig(after_timestamp=5_000.0)) == []

    asyncio.run(main())


def test_changing_a_returned_event_changes_no_later_read(tmp_path: Path) -> None:
    """Reads are served from decoded events the store keeps; an `Event` holds the values of its
    free-form fields as it is given them, so each read must hand out its own."""

    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        for i in range(3):
            await service.append_event(
                session, _event(f"e{i}", at=1_000.0 + i, state_delta={"seen": [i]})
            )
        configs = [
            None,
            GetSessionConfig(num_recent_events=2),
            GetSessionConfig(after_timestamp=1_001.0),
        ]
        for config in configs * 3:  # read each more than once: later reads come from the cache
            got = await service.get_session(
                app_name=APP, user_id=USER, session_id="s", config=config
            )
            assert got is not None
            for event in got.events:
                assert event.actions.state_delta["seen"] == [int(event.content.parts[0].text[1:])]
                event.actions.state_delta["seen"].append("changed")
        forked = await service.fork_session(app_name=APP, user_id=USER, session_id="s")
        assert [e.actions.state_delta["seen"] for e in forked.events] == [[0], [1], [2]]

    asyncio.run(main())


def test_list_and_delete_sessions(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        for user in ("u-1", "u-2"):
            for i in range(3):
                session = await service.create_session(
                    app_name=APP, user_id=user, session_id=f"{user}/{i}", state={"n": i}
                )
                await service.append_event(session, _event("x", at=2_000.0 - i))
        await service.create_session(app_name="another", user_id="u-1")
        mine = (await service.list_sessions(app_name=APP, user_id="u-1")).sessions
        assert [s.id for s in mine] == ["u-1/2", "u-1/1", "u-1/0"]  # oldest update first
        assert all(s.events == [] and s.state["n"] == int(s.id[-1]) for s in mine)
        everyone = (await service.list_sessions(app_name=APP)).sessions
        assert sorted(s.id for s in everyone) == sorted(
            f"{u}/{i}" for u in ("u-1", "u-2") for i in range(3)
        )
        shared = {"app:tier": "gold", "user:lang": "nb"}
        await service.append_event(mine[0], _event("y", at=3_000.0, state_delta=shared))
        for listed in (await service.list_sessions(app_name=APP)).sessions:
            got = await service.get_session(
                app_name=APP, user_id=listed.user_id, session_id=listed.id
            )
            assert got is not None and listed.state == got.state  # app: and user: keys merged
            assert listed.last_update_time == got.last_update_time
        listed = (await service.list_sessions(app_name=APP, user_id="u-1")).sessions
        assert listed[-1].state["user:lang"] == "nb" and listed[0].state["app:tier"] == "gold"
        listed[0].state["n"] = "changed"  # each listed session holds a state of its own
        assert [s.state["n"] for s in listed[1:]] == [0, 2]
        await service.delete_session(app_name=APP, user_id="u-1", session_id="u-1/0")
        await service.delete_session(app_name=APP, user_id="u-1", session_id="never-was")
        assert await service.get_session(app_name=APP, user_id="u-1", session_id="u-1/0") is None
        mine = (await service.list_sessions(app_name=APP, user_id="u-1")).sessions
        assert [s.id for s in mine] == ["u-1/1", "u-1/2"]  # u-1/2 was updated last

    asyncio.run(main())


def test_fork_session_shares_the_prefix_and_diverges(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        session = await service.create_session(
            app_name=APP, user_id=USER, session_id="main", state={"k": "v"}
        )
        for i in range(4):
            await service.append_event(session, _event(f"e{i}"))
        child = await service.fork_session(
            app_name=APP, user_id=USER, session_id="main", new_session_id="branch", at_event=2
        )
        assert [e.content.parts[0].text for e in child.events] == ["e0", "e1"]
        assert child.state["k"] == "v"
        await service.append_event(child, _event("branch"))
        await service.append_event(session, _event("main"))
        got = await service.get_session(app_name=APP, user_id=USER, session_id="branch")
        assert got is not None and [e.content.parts[0].text for e in got.events] == [
            "e0",
            "e1",
            "branch",
        ]
        with pytest.raises(AlreadyExistsError):
            await service.fork_session(
                app_name=APP, user_id=USER, session_id="main", new_session_id="branch"
            )
        light = await service.fork_session(
            app_name=APP,
            user_id=USER,
            session_id="main",
            new_session_id="light",
            config=GetSessionConfig(num_recent_events=0),
        )
        assert light.events == [] and light.state["k"] == "v"
        await service.append_event(light, _event("light"))  # its marker is current: not stale
        got = await service.get_session(app_name=APP, user_id=USER, session_id="light")
        assert got is not None and [e.content.parts[0].text for e in got.events] == [
            "e0",
            "e1",
            "e2",
            "e3",
            "main",
            "light",
        ]
        tail = await service.fork_session(
            app_name=APP,
            user_id=USER,
            session_id="main",
            config=GetSessionConfig(num_recent_events=2),
        )
        assert [e.content.parts[0].text for e in tail.events] == ["e3", "main"]
        store: SessionStore = service.store.store
        assert store.ancestry(session_key(APP, USER, "branch"))["parent_id"] == session_key(  # type: ignore[index]
            APP, USER, "main"
        )

    asyncio.run(main())


def test_an_event_is_one_record_and_its_timestamp_is_the_update_time(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        store: SessionStore = service.store.store
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        head = store.log.head
        await service.append_event(session, _event("one", at=1_500.0))
        assert store.log.head == head + 1  # the event alone: no scratchpad record beside it
        assert session.last_update_time == 1_500.0
        await service.append_event(session, _event("two", at=1_600.0, state_delta={"k": 1}))
        assert store.log.head == head + 3  # a state change is stored with it
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and got.last_update_time == 1_600.0 and got.state["k"] == 1
        [listed] = (await service.list_sessions(app_name=APP, user_id=USER)).sessions
        assert listed.last_update_time == 1_600.0
        stale = got.model_copy()  # a copy without the storage marker: judged by the time
        stale._storage_update_marker = None
        stale.last_update_time = 1_599.0
        with pytest.raises(StaleSessionError):
            await service.append_event(stale, _event("late"))

    asyncio.run(main())


def test_an_update_time_kept_in_the_scratchpad_by_older_code_is_read(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        store: SessionStore = service.store.store
        await service.create_session(app_name=APP, user_id=USER, session_id="old")
        key = session_key(APP, USER, "old")
        with store.transaction():  # what older code stored: every event beside its scratchpad
            item = _event("before", at=1_000.0).model_dump(mode="python", exclude_none=True)
            del item["timestamp"]  # an item whose timestamp the projection cannot see
            store.inject(key, {"item": item})
            store.set_scratchpad(key, {"state": {"k": "v"}, "update_time": 1_000.0})
        got = await service.get_session(app_name=APP, user_id=USER, session_id="old")
        assert got is not None and got.last_update_time == 1_000.0 and got.state == {"k": "v"}
        await service.append_event(got, _event("after", at=2_000.0))
        again = await service.get_session(app_name=APP, user_id=USER, session_id="old")
        assert again is not None and again.last_update_time == 2_000.0
        assert again.state == {"k": "v"}

    asyncio.run(main())


def test_update_times_survive_a_rebuild_of_the_projection(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        for i in range(3):
            session = await service.create_session(app_name=APP, user_id=USER, session_id=f"s{i}")
            await service.append_event(session, _event("x", at=3_000.0 - i))
        await service.fork_session(app_name=APP, user_id=USER, session_id="s0", new_session_id="f")
        before = (await service.list_sessions(app_name=APP)).sessions
        pj.rebuild(service.store.store.log)
        after = (await service.list_sessions(app_name=APP)).sessions
        assert [(s.id, s.last_update_time) for s in after] == [
            (s.id, s.last_update_time) for s in before
        ]
        # the fork's update time is its parent's newest event's (ties go by id)
        assert [(s.id, s.last_update_time) for s in after] == [
            ("s2", 2_998.0),
            ("s1", 2_999.0),
            ("f", 3_000.0),
            ("s0", 3_000.0),
        ]

    asyncio.run(main())


def test_an_encrypted_session_keeps_its_update_time_in_the_scratchpad(tmp_path: Path) -> None:
    async def main() -> None:
        keys = LocalKeyProvider(bytes(range(32)))
        service = SessionlogSessionService(SessionStore.open(tmp_path / "store", keys=keys))
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        for at in (2_000.0, 1_000.0):  # the projection cannot read a sealed item's timestamp
            await service.append_event(session, _event("x", at=at))
            got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
            assert got is not None and got.last_update_time == at
        await service.store.aclose()

    asyncio.run(main())


def test_an_encrypted_event_stamped_at_its_append_time_still_moves_the_update_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The log's clock stopped at the second event's own timestamp: the session's last activity
    # then equals it, which must not pass for the projection having kept it.
    stopped = datetime.fromtimestamp(5_000.0, UTC)
    monkeypatch.setattr(eventlog._transaction, "check_time", lambda at: at or stopped)

    async def main() -> None:
        keys = LocalKeyProvider(bytes(range(32)))
        service = SessionlogSessionService(SessionStore.open(tmp_path / "store", keys=keys))
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        for at in (2_000.0, 5_000.0):
            await service.append_event(session, _event("x", at=at))
            got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
            assert got is not None and got.last_update_time == at
        await service.store.aclose()

    asyncio.run(main())


def test_concurrent_appends_through_one_session_are_taken_in_turn(tmp_path: Path) -> None:
    """Parallel branches of one invocation share its session and append at once: each append
    must see the marker the one before it left, while another copy is still refused."""

    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        other = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        events = [_event(f"e{i}") for i in range(10)]
        await asyncio.gather(*(service.append_event(session, e) for e in events))
        assert [e.id for e in session.events] == [e.id for e in events]
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and [e.id for e in got.events] == [e.id for e in events]
        assert other is not None
        stale = [
            service.append_event(other, _event("stale")),
            service.append_event(got, _event("x")),
        ]
        outcome = await asyncio.gather(*stale, return_exceptions=True)
        assert isinstance(outcome[0], StaleSessionError) and isinstance(outcome[1], Event)
        assert service._locks == {}  # none kept once its appends are done

    asyncio.run(main())


def test_state_values_adk_accepts_are_stored_as_its_sql_services_store_them(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        values = {
            "aware": datetime(2024, 1, 1, tzinfo=UTC),
            "naive": datetime(2024, 1, 1, 12, 0),
            "set": {1, 2},
            "tuple": (1, (2, 3)),
            "bytes": b"abc",
            "temp:anything": object(),  # never stored: may hold anything
        }
        want = {
            "aware": "2024-01-01T00:00:00Z",
            "naive": "2024-01-01T12:00:00",
            "set": [1, 2],
            "tuple": [1, [2, 3]],
            "bytes": "abc",
        }
        created = await service.create_session(
            app_name=APP, user_id=USER, session_id="c", state=values
        )
        assert created.state == want
        session = await service.create_session(app_name=APP, user_id=USER, session_id="a")
        delta = {**values, "app:when": values["naive"], "user:tags": values["set"]}
        await service.append_event(session, _event("x", state_delta=delta))
        got = await service.get_session(app_name=APP, user_id=USER, session_id="a")
        assert got is not None
        assert got.state == {**want, "app:when": want["naive"], "user:tags": [1, 2]}
        assert got.events[0].actions.state_delta == {
            **want,
            "app:when": want["naive"],
            "user:tags": [1, 2],
        }
        for bad in (object(), b"\xff", float("nan"), 2**80):  # no JSON form the store keeps
            with pytest.raises(InvalidArgumentError, match="'bad'"):
                await service.create_session(
                    app_name=APP, user_id=USER, session_id="never", state={"bad": bad}
                )
            with pytest.raises(InvalidArgumentError, match="'bad'"):
                await service.append_event(
                    got, _event("no", state_delta={"user:ok": 1, "bad": bad})
                )
        assert await service.get_session(app_name=APP, user_id=USER, session_id="never") is None
        again = await service.get_session(app_name=APP, user_id=USER, session_id="a")
        assert again is not None and len(again.events) == 1 and "user:ok" not in again.state

    asyncio.run(main())


def test_only_a_retry_of_the_same_event_is_taken_as_stored(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        first = _event("one", at=100.0, state_delta={"x": 1})
        await service.append_event(session, first)
        await service.append_event(session, first)  # the same event again: a retry
        assert len(session.events) == 1
        impostor = _event("two", at=100.0, state_delta={"x": 2})
        impostor.id = first.id
        with pytest.raises(AlreadyExistsError):
            await service.append_event(session, impostor)
        assert [e.content.parts[0].text for e in session.events] == ["one"]
        assert session.state["x"] == 1  # nothing of it applied to the caller's session
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and got.events == session.events and got.state["x"] == 1
        await service.append_event(session, _event("next"))  # the session's marker is current

    asyncio.run(main())


def test_a_fork_at_an_event_has_the_state_as_of_that_event(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        session = await service.create_session(
            app_name=APP, user_id=USER, session_id="p", state={"made": "at creation", "n": 0}
        )
        deltas = [{"n": 1, "app:a": 1}, {"n": 2, "late": True, "user:u": 2}, {"made": "later"}]
        for i, delta in enumerate(deltas):
            await service.append_event(session, _event(f"e{i}", state_delta=delta))

        async def fork(source: str, child: str, at: int | None) -> dict[str, Any]:
            forked = await service.fork_session(
                app_name=APP, user_id=USER, session_id=source, new_session_id=child, at_event=at
            )
            got = await service.get_session(app_name=APP, user_id=USER, session_id=child)
            assert got is not None and got.state == forked.state
            return forked.state

        shared = {"app:a": 1, "user:u": 2}  # not the session's: shared, as it is now
        assert await fork("p", "b0", 0) == {"made": "at creation", "n": 0, **shared}
        assert await fork("p", "b1", 1) == {"made": "at creation", "n": 1, **shared}
        assert await fork("p", "b2", 2) == {"made": "at creation", "n": 2, "late": True, **shared}
        assert await fork("p", "b9", 9) == await fork("p", "all", None) == session.state
        assert await fork("b2", "b2-1", 1) == {"made": "at creation", "n": 1, **shared}

    asyncio.run(main())


def test_long_and_non_ascii_names_each_fit_as_adks_database_service_takes_them(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        app, user = "customer_support_agent_prod_v2", "ab" * 32
        long_id = "旅" * 128
        session = await service.create_session(
            app_name=app, user_id=user, session_id=long_id, state={"k": 1, "app:a": 1, "user:u": 1}
        )
        await service.append_event(session, _event("x", state_delta={"k": 2}))
        short = await service.create_session(app_name=app, user_id=user, session_id="s")
        assert session_key(app, user, "s") == f"adk:{app}/{user}/s"  # short names stay readable
        got = await service.get_session(app_name=app, user_id=user, session_id=long_id)
        assert got is not None and got.state == {"k": 2, "app:a": 1, "user:u": 1}
        listed = (await service.list_sessions(app_name=app, user_id=user)).sessions
        assert sorted((s.id, s.user_id, s.state["k"]) for s in listed if s.id != "s") == [
            (long_id, user, 2)
        ]
        assert {s.id for s in (await service.list_sessions(app_name=app)).sessions} == {
            long_id,
            short.id,
        }
        fork = await service.fork_session(
            app_name=app, user_id=user, session_id=long_id, new_session_id="f", at_event=0
        )
        assert fork.state["k"] == 1
        forks = (await service.list_sessions(app_name=app, user_id=user)).sessions
        assert sorted(s.id for s in forks) == sorted([long_id, "s", "f"])
        await service.delete_session(app_name=app, user_id=user, session_id=long_id)
        assert await service.get_session(app_name=app, user_id=user, session_id=long_id) is None
        with pytest.raises(LimitExceededError, match=r"`session_id`.*129"):
            await service.create_session(app_name=app, user_id=user, session_id="x" * 129)

    asyncio.run(main())


def test_a_name_that_is_no_string_is_refused_naming_it(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        with pytest.raises(InvalidArgumentError, match=r"`app_name`.*NoneType"):
            await service.create_session(app_name=None, user_id=USER)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match=r"`user_id`.*int"):
            await service.create_session(app_name=APP, user_id=5)  # type: ignore[arg-type]
        none: Any = None  # ADK's own services answer a None session id with None
        assert await service.get_session(app_name=APP, user_id=USER, session_id=none) is None
        assert (await service.list_sessions(app_name=APP)).sessions == []

    asyncio.run(main())


def test_a_cancelled_append_is_applied_to_the_session_before_it_raises(tmp_path: Path) -> None:
    """Cancelled while its write waits, an append still commits; the caller's session holds the
    event and the new marker when the cancellation reaches it, so its next append goes in."""

    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        async with held_worker(service.store) as release:
            task = asyncio.ensure_future(service.append_event(session, _event("one")))
            await cancel_while_held(task, release)
        assert [e.content.parts[0].text for e in session.events] == ["one"]
        await service.append_event(session, _event("two"))  # not refused as stale
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and [e.content.parts[0].text for e in got.events] == ["one", "two"]

    asyncio.run(main())


def test_a_cancelled_create_raises_once_the_session_exists(tmp_path: Path) -> None:
    async def main() -> None:
        service = SessionlogSessionService(tmp_path / "store")
        async with held_worker(service.store) as release:
            task = asyncio.ensure_future(
                service.create_session(app_name=APP, user_id=USER, session_id="s")
            )
            await cancel_while_held(task, release)
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and got.events == []

    asyncio.run(main())
