"""`integrations.openai_agents.SessionlogSession` through the OpenAI Agents SDK's own `Runner`,
with the SDK's scripted model, compared item for item with the SDK's `SQLiteSession`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    RunContextWrapper,
    Runner,
    SQLiteSession,
    function_tool,
    set_tracing_disabled,
)
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call

from eventlog import LogClosedError, OutcomeUnknownError
from eventlog import events as ev
from integrations.openai_agents import SessionlogSession, async_store
from sessions import ContextPolicy, InvalidArgumentError, SessionStore
from tests.conftest import open_store, store_target_of
from tests.test_aio_cancel import cancel_behind

set_tracing_disabled(True)  # no tracing exporter: the tests talk to no service
WORKER = Path(__file__).with_name("_openai_agents_worker.py")


def script() -> list[Any]:
    """Two user turns: the first calls a tool twice (two model steps), the second answers."""
    return [
        [function_call("weather", {"city": "Oslo"}, call_id="call-1")],
        [function_call("weather", {"city": "Bergen"}, call_id="call-2")],
        [assistant_message("Sunny in both.", item_id="m-1")],
        [assistant_message("You asked about Oslo and Bergen.", item_id="m-2")],
    ]


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def converse(session: Session) -> tuple[list[Any], ScriptedModel]:
    model = ScriptedModel(script())
    agent = Agent(name="forecaster", model=model, tools=[weather])
    first = await Runner.run(agent, "Weather in Oslo and Bergen?", session=session)
    assert first.final_output == "Sunny in both."
    second = await Runner.run(agent, "What did I ask?", session=session)
    assert second.final_output == "You asked about Oslo and Bergen."
    model.assert_complete()
    return await session.get_items(), model


def test_the_runner_stores_the_same_items_as_the_sdks_sqlite_session(tmp_path: Path) -> None:
    ours = SessionlogSession("chat", store=tmp_path / "store")
    theirs = SQLiteSession("chat", tmp_path / "sqlite.db")
    our_items, our_model = asyncio.run(converse(ours))
    their_items, their_model = asyncio.run(converse(theirs))
    assert our_items == their_items
    kinds = [item.get("type", item.get("role")) for item in our_items]
    assert kinds.count("function_call") == 2 and kinds.count("function_call_output") == 2
    # The second turn's model call saw the whole first turn, read back from the store.
    assert our_model.calls[-1].input == their_model.calls[-1].input
    assert len(our_model.calls[-1].input) == len(our_items) - 1
    ours.store.store.close()
    with SessionStore.open(tmp_path / "store") as reopened:  # durable: reopened, it is all there
        assert [e["item"] for e in reopened.messages("chat")] == their_items


def test_limit_pop_clear_and_settings(tmp_path: Path) -> None:
    async def main() -> None:
        session = SessionlogSession("s", store=tmp_path / "store")
        assert await session.get_items() == [] and await session.pop_item() is None
        items = [{"role": "user", "content": f"m{i}"} for i in range(5)]
        await session.add_items(items)  # type: ignore[arg-type]
        assert await session.get_items(2) == items[3:]
        assert await session.get_items(0) == []
        limited = SessionlogSession(
            "s", store=session.store, session_settings=SessionSettings(limit=3)
        )
        assert await limited.get_items() == items[2:]
        assert await limited.get_items(1) == items[4:]
        assert await session.pop_item() == items[4]
        assert await session.get_items() == items[:4]
        await session.clear_session()
        assert await session.get_items() == []
        await session.add_items([{"role": "user", "content": "again"}])
        assert await session.get_items() == [{"role": "user", "content": "again"}]

    asyncio.run(main())


def test_items_read_back_are_the_callers_to_change_and_chat_messages_read_as_items(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        session = SessionlogSession("s", store=tmp_path / "store")
        store = session.store.store
        call = {"type": "function_call", "call_id": "c-1", "name": "f", "arguments": "{}"}
        await session.add_items([call, {"role": "user", "content": [{"type": "input_text"}]}])
        store.inject("s", {"role": "assistant", "content": "written by other code"})
        chat = {"role": "assistant", "content": "written by other code"}
        for limit in (None, 3, 2):  # the whole history (cached), and the last few
            got = await session.get_items(limit)
            assert got[-1] == chat
            got[-1]["content"] = "changed"
            if limit != 2:
                assert got[0] == call and got[1]["content"] == [{"type": "input_text"}]
                got[0]["name"] = "changed"
                got[1]["content"][0]["type"] = "changed"
        again = await session.get_items()
        assert again == [call, {"role": "user", "content": [{"type": "input_text"}]}, chat]

    asyncio.run(main())


def test_add_items_is_atomic_and_a_retried_key_is_applied_once(tmp_path: Path) -> None:
    async def main() -> None:
        session = SessionlogSession("s", store=tmp_path / "store")
        await session.add_items([{"role": "user", "content": "a"}])
        bad = [{"role": "user", "content": "b"}, {"type": "x", "value": (1, 2)}]
        with pytest.raises(InvalidArgumentError, match=r"messages\[1\]"):
            await session.add_items(bad)  # type: ignore[list-item]
        assert len(await session.get_items()) == 1
        turn = [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
        await session.add_items(turn, idempotency_key="turn-2")  # type: ignore[arg-type]
        await session.add_items(turn, idempotency_key="turn-2")  # type: ignore[arg-type]
        assert len(await session.get_items()) == 3

    asyncio.run(main())


@pytest.mark.needs("POSTGRES")
def test_a_commit_of_unknown_outcome_is_retried_without_duplicating(tmp_path: Path) -> None:
    """On PostgreSQL a commit can end with its outcome unknown: add_items carries a key of its
    own, so its retry of a commit that did happen stores nothing twice."""
    store = open_store("postgres", store_target_of("postgres", tmp_path))
    assert store.log.outcome_may_be_unknown

    async def main() -> None:
        session = SessionlogSession("s", store=store)
        real = session.store._write  # every write of the face goes through it
        failures: list[str] = []

        async def committed_then_lost(*args: Any, **kwargs: Any) -> Any:
            written = await real(*args, **kwargs)  # the commit reaches the disk ...
            if not failures:
                failures.append("lost")  # ... but its acknowledgement is lost once
                raise OutcomeUnknownError("commit outcome unknown")
            return written

        session.store._write = committed_then_lost  # type: ignore[method-assign]
        try:
            await session.add_items([{"role": "user", "content": "once"}])
            await session.add_items([{"role": "user", "content": "twice"}])
        finally:
            del session.store._write
        assert failures == ["lost"]
        assert await session.get_items() == [
            {"role": "user", "content": "once"},
            {"role": "user", "content": "twice"},
        ]
        await session.store.aclose()

    asyncio.run(main())


def test_on_lmdb_add_items_stores_no_key_of_its_own(tmp_path: Path) -> None:
    """An LMDB commit has happened or wrote nothing, so add_items needs no retry key: none is
    stored unless the caller gives one, and the caller's key still makes its retry a no-op."""

    async def main() -> None:
        session = SessionlogSession("s", store=tmp_path / "store")
        assert not session.store.store.log.outcome_may_be_unknown
        await session.add_items([{"role": "user", "content": "a"}, {"type": "x", "n": 1}])
        await session.add_items([{"role": "user", "content": "b"}], idempotency_key="k")
        await session.add_items([{"role": "user", "content": "b"}], idempotency_key="k")
        keys = [
            envelope.data.idempotency_key
            for envelope in session.store.store.log.read(after=0, limit=100)
            if isinstance(envelope.data, ev.MessagesInjected)
        ]
        assert keys == [None, "k"]
        assert len(await session.get_items()) == 3
        await session.store.aclose()

    asyncio.run(main())


def test_fork_shares_the_prefix_and_diverges(tmp_path: Path) -> None:
    async def main() -> None:
        session = SessionlogSession("s", store=tmp_path / "store")
        items = [{"role": "user", "content": str(i)} for i in range(4)]
        await session.add_items(items)  # type: ignore[arg-type]
        child = await session.fork(at_item=2, session_id="s-branch")
        assert child.session_id == "s-branch"
        assert await child.get_items() == items[:2]
        await child.add_items([{"role": "user", "content": "branch"}])
        await session.add_items([{"role": "user", "content": "main"}])
        assert [i["content"] for i in await child.get_items()] == ["0", "1", "branch"]
        assert [i["content"] for i in await session.get_items()] == ["0", "1", "2", "3", "main"]
        whole = await session.fork()
        assert len(await whole.get_items()) == 5
        model = ScriptedModel([[assistant_message("from the fork")]])
        result = await Runner.run(Agent(name="a", model=model), "go on", session=child)
        assert result.final_output == "from the fork"
        assert model.calls[0].input[:3] == [*items[:2], {"role": "user", "content": "branch"}]

    asyncio.run(main())


def test_the_wrapper_routes_each_tenant_to_its_own_history(tmp_path: Path) -> None:
    def route(wrapper: RunContextWrapper[Any] | None, sid: str) -> str:
        assert wrapper is not None
        return f"{wrapper.context['tenant']}.{sid}"

    async def main() -> None:
        session = SessionlogSession("chat", store=tmp_path / "store", route=route)
        for tenant in ("acme", "globex"):
            model = ScriptedModel([[assistant_message(f"hello {tenant}")]])
            agent = Agent(name="a", model=model)
            await Runner.run(agent, f"I am {tenant}", session=session, context={"tenant": tenant})
        store = session.store.store
        assert store.messages("acme.chat")[0]["item"]["content"] == "I am acme"
        assert store.messages("globex.chat")[0]["item"]["content"] == "I am globex"
        assert not store.exists("chat")

    asyncio.run(main())


def test_sessions_on_one_store_share_one_worker(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "store")
    one = SessionlogSession("a", store=store)
    two = SessionlogSession("b", store=store)
    assert one.store is two.store is async_store(store)
    with pytest.raises(InvalidArgumentError, match="session_id"):
        SessionlogSession("", store=store)
    with pytest.raises(InvalidArgumentError, match="store"):
        SessionlogSession("a", store=42)  # type: ignore[arg-type]
    store.close()


@pytest.mark.slow
def test_a_run_killed_mid_tool_call_resumes_with_no_orphan_call(tmp_path: Path) -> None:
    marker = tmp_path / "in-tool"
    child = subprocess.Popen(
        [sys.executable, str(WORKER), str(tmp_path / "store"), str(marker)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, "the worker died before reaching its tool"
            assert time.monotonic() < deadline, "the worker never reached its tool"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL

    async def resume() -> list[Any]:
        session = SessionlogSession("conversation", store=tmp_path / "store")
        stored = await session.get_items()
        assert stored == [{"role": "user", "content": "Weather in Oslo?"}]
        model = ScriptedModel(
            [
                [function_call("weather", {"city": "Oslo"}, call_id="call-9")],
                [assistant_message("Sunny in Oslo.")],
            ]
        )
        agent = Agent(name="forecaster", model=model, tools=[weather])
        result = await Runner.run(agent, "Still there?", session=session)
        assert result.final_output == "Sunny in Oslo."
        items = await session.get_items()
        session.store.store.close()
        return items

    items = asyncio.run(resume())
    calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
    outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    assert calls == outputs == {"call-9"}  # every call has its output: no orphan
    with SessionStore.open(tmp_path / "store") as store:
        assert store.verify(projections=True).ok


def test_run_compaction_writes_a_summary_checkpoint_the_model_then_sees(tmp_path: Path) -> None:
    summarized: list[list[Any]] = []

    def summarizer(items: list[Any], **options: Any) -> str:
        summarized.append(items)
        return f"summary of {len(items)} items"

    policy = ContextPolicy(
        window_tokens=400,
        summarize_ratio=0.5,
        summarize_messages_min=4,
        keep_turns=1,
        summarizer=summarizer,
    )

    async def main() -> None:
        session = SessionlogSession("s", store=tmp_path / "store", compaction=policy)
        steps = [
            [assistant_message(f"answer {i} " + "z" * 300, item_id=f"a-{i}")] for i in range(4)
        ]
        model = ScriptedModel(steps)
        agent = Agent(name="a", model=model)
        for i in range(4):
            await Runner.run(agent, f"question {i} " + "q" * 300, session=session)
        assert summarized, "the runner's compaction hook never summarized"
        assert summarized[0][0] == {"role": "user", "content": "question 0 " + "q" * 300}
        seen = await session.get_items()
        assert seen[0]["role"] == "user" and "context checkpoint" in seen[0]["content"]
        assert seen[1] == {
            "role": "assistant",
            "content": f"summary of {len(summarized[-1])} items",
        }
        assert seen[-1]["id"] == "a-3"
        # the model's last call was given the checkpoint, not the whole history
        assert "context checkpoint" in str(model.calls[-1].input[0])
        store = session.store.store
        assert len(store.messages("s")) == 8 + 2 * len(summarized)  # every item kept
        assert await session.get_items(1) == [seen[-1]]

    asyncio.run(main())


def test_a_cancelled_add_items_raises_once_its_batch_is_stored(tmp_path: Path) -> None:
    """As the SDK's `SQLiteSession`: cancelled while its commit is queued, `add_items` raises
    `CancelledError` only once the batch is stored, so the caller can tell before it retries."""

    async def main() -> None:
        session = SessionlogSession("s", store=tmp_path / "store")
        await session.add_items([{"role": "user", "content": "hello"}])
        turn = [{"role": "assistant", "content": "hi"}, {"type": "x", "n": 1}]
        await cancel_behind(session.store, session.add_items(turn))  # type: ignore[arg-type]
        assert await session.get_items() == [{"role": "user", "content": "hello"}, *turn]
        await cancel_behind(session.store, session.pop_item())
        assert await session.get_items() == [{"role": "user", "content": "hello"}, turn[0]]
        await session.store.aclose()

    asyncio.run(main())


def compaction_policy(summarizer: Any, **options: Any) -> ContextPolicy:
    rules: dict[str, Any] = {
        "window_tokens": 400,
        "summarize_ratio": 0.5,
        "summarize_messages_min": 4,
        "keep_turns": 1,
        **options,
    }
    return ContextPolicy(summarizer=summarizer, **rules)


async def add_turns(session: SessionlogSession, count: int, *, first: int = 0) -> None:
    for i in range(first, first + count):
        await session.add_items(
            [
                {"role": "user", "content": f"q{i} " + "q" * 300},
                {"role": "assistant", "content": f"a{i} " + "z" * 300},
            ]
        )


def test_the_summarizer_runs_off_the_stores_worker(tmp_path: Path) -> None:
    """While one session's summarizer waits for its model, every read of the store goes on;
    the checkpoint then commits."""
    entered, release = threading.Event(), threading.Event()
    threads: list[str] = []

    def summarizer(items: list[Any], **options: Any) -> str:
        threads.append(threading.current_thread().name)
        entered.set()
        assert release.wait(30), "the test never let the summarizer go"
        return f"summary of {len(items)} items"

    async def main() -> None:
        path = tmp_path / "store"
        compacting = SessionlogSession("a", store=path, compaction=compaction_policy(summarizer))
        other = SessionlogSession("b", store=path)
        await other.add_items([{"role": "user", "content": "hi"}])
        await add_turns(compacting, 4)
        task = asyncio.create_task(compacting.run_compaction({"response_id": "r"}))
        try:
            assert await asyncio.to_thread(entered.wait, 30), "the summarizer was never called"
            # on the store's one worker, as before, this read waited for the summarizer
            read = await asyncio.wait_for(other.get_items(), 10)
            assert read == [{"role": "user", "content": "hi"}]
            assert len(await asyncio.wait_for(compacting.get_items(), 10)) == 8
        finally:
            release.set()
        await task
        seen = await compacting.get_items()
        assert seen[1] == {"role": "assistant", "content": "summary of 6 items"}
        assert not any(name.startswith("sessionlog-aio") for name in threads)
        await compacting.store.aclose()

    asyncio.run(main())


def test_a_summary_of_a_history_changed_meanwhile_is_made_again(tmp_path: Path) -> None:
    """The checkpoint commits only for the messages its summary was made of: a turn added while
    the summarizer ran moves what is summarized, and the summarizer is asked again."""
    entered, release = threading.Event(), threading.Event()
    asked: list[int] = []

    def summarizer(items: list[Any], **options: Any) -> str:
        asked.append(len(items))
        entered.set()
        assert release.wait(30), "the test never let the summarizer go"
        return f"summary of {len(items)} items"

    async def main() -> None:
        session = SessionlogSession("s", store=tmp_path / "store")
        session.compaction = SessionlogSession(
            "s", store=session.store, compaction=compaction_policy(summarizer)
        ).compaction
        await add_turns(session, 4)
        task = asyncio.create_task(session.run_compaction())
        try:
            assert await asyncio.to_thread(entered.wait, 30), "the summarizer was never called"
            await add_turns(session, 1, first=4)  # the turn kept moves on: more to summarize
        finally:
            release.set()
        await task
        assert asked == [6, 8]
        seen = await session.get_items()
        assert seen[1] == {"role": "assistant", "content": "summary of 8 items"}
        assert [item["content"][:2] for item in seen[2:]] == ["q4", "a4"]
        events = [type(e.data).__name__ for e in session.store.store.log.read(after=0, limit=99)]
        assert events.count("ContextCompacted") == 1
        assert "ContextCompactionFailed" not in events
        await session.store.aclose()

    asyncio.run(main())


def test_an_async_summarizer_is_awaited_in_the_loop(tmp_path: Path) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def summarizer(items: list[Any], **options: Any) -> str:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return f"async summary of {len(items)} items"

    async def main() -> None:
        session = SessionlogSession(
            "s", store=tmp_path / "store", compaction=compaction_policy(summarizer)
        )
        await add_turns(session, 4)
        await session.run_compaction({"response_id": "r"})
        assert loops == [asyncio.get_running_loop()]
        seen = await session.get_items()
        assert seen[1] == {"role": "assistant", "content": "async summary of 6 items"}
        assert len(seen) == 4  # the checkpoint pair and the last turn
        await session.store.aclose()

    asyncio.run(main())


def test_force_compacts_below_the_threshold(tmp_path: Path) -> None:
    asked: list[int] = []

    def summarizer(items: list[Any], **options: Any) -> str:
        asked.append(len(items))
        return "summary"

    async def main() -> None:
        policy = compaction_policy(summarizer, window_tokens=100_000, summarize_messages_min=6)
        session = SessionlogSession("s", store=tmp_path / "store", compaction=policy)
        for i in range(2):
            await session.add_items(
                [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
            )
        await session.run_compaction({"response_id": "r"})
        await session.run_compaction({"force": False})
        assert asked == [] and len(await session.get_items()) == 4
        await session.run_compaction({"response_id": "r", "force": True})
        assert asked == [2]
        seen = await session.get_items()
        assert seen[1] == {"role": "assistant", "content": "summary"} and len(seen) == 4
        assert seen[2:] == [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"},
        ]
        await session.store.aclose()

    asyncio.run(main())


def test_a_negative_limit_gives_the_whole_history_as_sqlite_session_does(tmp_path: Path) -> None:
    items = [{"role": "user", "content": f"m{i}"} for i in range(3)]

    async def main() -> None:
        theirs = SQLiteSession("s", tmp_path / "sqlite.db")
        path = tmp_path / "store"
        plain = SessionlogSession("a", store=path)
        compacting = SessionlogSession(
            "b", store=path, compaction=ContextPolicy(summarizer=lambda items, **o: "s")
        )
        settled = SessionlogSession("c", store=path, session_settings=SessionSettings(limit=-1))
        for session in (theirs, plain, compacting, settled):
            await session.add_items(items)  # type: ignore[arg-type]
        assert await theirs.get_items(-1) == items
        for ours in (plain, compacting, settled):
            assert await ours.get_items(-1) == items
            assert await ours.get_items(-5) == items
            assert await ours.get_items(0) == await theirs.get_items(0) == []
        assert await settled.get_items() == items
        assert await settled.get_items(1) == items[2:]
        await plain.store.aclose()

    asyncio.run(main())


def test_a_refused_first_batch_leaves_no_session(tmp_path: Path) -> None:
    """Opening a new session is part of its first batch's commit: refused, it writes nothing."""

    async def main() -> None:
        session = SessionlogSession("new", store=tmp_path / "store")
        store = session.store.store
        with pytest.raises(InvalidArgumentError, match=r"messages\[0\]"):
            await session.add_items([{"type": "function_call", "arguments": (1, 2)}])  # type: ignore[list-item]
        assert not store.exists("new")
        assert list(store.log.read(after=0, limit=10)) == []
        assert await session.get_items() == []
        await session.add_items([{"role": "user", "content": "a"}])
        assert await session.get_items() == [{"role": "user", "content": "a"}]
        kinds = [type(e.data).__name__ for e in store.log.read(after=0, limit=10)]
        assert kinds == ["SessionOpened", "MessagesInjected"]
        await session.store.aclose()

    asyncio.run(main())


def test_an_item_that_is_not_a_mapping_is_refused_by_its_index(tmp_path: Path) -> None:
    async def main() -> None:
        session = SessionlogSession("s", store=tmp_path / "store")
        for bad in (None, "text", 3, ["role", "user"]):
            with pytest.raises(InvalidArgumentError, match=r"items\[1\]") as refused:
                await session.add_items([{"role": "user", "content": "a"}, bad])  # type: ignore[list-item]
            assert refused.value.index == 1
        assert not session.store.store.exists("s")
        assert list(session.store.store.log.read(after=0, limit=10)) == []
        await session.store.aclose()

    asyncio.run(main())


def test_after_aclose_every_method_raises_log_closed(tmp_path: Path) -> None:
    async def main() -> None:
        session = SessionlogSession(
            "s", store=tmp_path / "store", compaction=compaction_policy(lambda i, **o: "s")
        )
        await session.add_items([{"role": "user", "content": "a"}])
        await session.store.aclose()
        calls = {
            "get_items": session.get_items,
            "get_items(limit)": lambda: session.get_items(1),
            "run_compaction": lambda: session.run_compaction({"force": True}),
            "add_items": lambda: session.add_items([{"role": "user", "content": "b"}]),
            "pop_item": session.pop_item,
            "clear_session": session.clear_session,
        }
        for name, call in calls.items():
            with pytest.raises(LogClosedError):
                await call()
                pytest.fail(f"{name} after aclose did not raise")

    asyncio.run(main())


def test_a_store_reached_through_a_symlink_is_the_same_store(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")

    async def main() -> None:
        one = SessionlogSession("s", store=tmp_path / "real" / "store")
        two = SessionlogSession("s", store=str(tmp_path / "link" / "store"))
        assert two.store is one.store
        await one.add_items([{"role": "user", "content": "a"}])
        assert await two.get_items() == [{"role": "user", "content": "a"}]
        await one.store.aclose()

    asyncio.run(main())
