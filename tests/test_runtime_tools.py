"""The runtime's tool loop: model, tool calls (in parallel, each a child loop), results back to
the model, until a final answer or `max_steps`; every step an event, and a transcript the APIs
accept (no call without its result) whatever ends the loop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from eventlog import InvalidArgumentError, LimitExceededError
from sessions import SessionStore
from sessions.runtime import (
    Completion,
    ConfigurationError,
    HttpSettings,
    OpenAIProvider,
    PromptCancelledError,
    Runtime,
    Tool,
)
from sessions.runtime._anthropic import AnthropicProvider, to_anthropic
from sessions.runtime._openai import to_openai
from tests._model_stubs import Reply, StubServer, anthropic_stream, openai_stream
from tests._runtime_providers import ScriptedProvider, UsageProvider, calls

FINAL = Completion(text="all done", usage={"input_tokens": 30, "output_tokens": 3})


def assert_answered(messages: list[dict[str, Any]]) -> None:
    """Every tool call has its result, after it and before the next assistant message, and both
    APIs' converters take the transcript."""
    open_ids: set[str] = set()
    for message in messages:
        if message["role"] == "assistant":
            assert not open_ids, f"calls {open_ids} have no result"
            open_ids = {call["id"] for call in message.get("tool_calls") or ()}
        elif message["role"] == "tool":
            assert message["tool_call_id"] in open_ids
            open_ids.discard(message["tool_call_id"])
        elif message["role"] == "user" and not message.get("synthetic"):
            assert not open_ids, f"calls {open_ids} have no result"
    assert not open_ids, f"calls {open_ids} have no result"
    to_openai(messages, None, "check")
    to_anthropic(messages, "check")


def types_of(store: SessionStore, sid: str) -> list[str]:
    return [envelope.type for envelope in store.log.read_stream(sid)]


async def read_file(path: str) -> str:
    await asyncio.sleep(0)
    return f"contents of {path}: TODO fix"


def grep(pattern: str, limit: int = 10) -> dict[str, Any]:
    return {"matches": [f"a.txt:1:{pattern}"], "limit": limit}


TOOLS = [
    Tool("read_file", read_file, {"type": "object", "properties": {"path": {"type": "string"}}},
         "Read a file"),
    Tool("grep", grep, {"type": "object", "properties": {"pattern": {"type": "string"}}}),
]  # fmt: skip


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_three_step_task_through_each_api(store: SessionStore, api: str) -> None:
    step1 = [{"id": "call_1", "name": "read_file", "arguments": {"path": "a.txt"}}]
    step2 = [{"id": "call_2", "name": "grep", "arguments": {"pattern": "TODO", "limit": 2}}]
    if api == "openai":
        script = [
            openai_stream([], tool_calls=step1, finish="tool_calls"),
            openai_stream(["Now grep."], tool_calls=step2, finish="tool_calls"),
            openai_stream(["Found ", "one TODO."]),
        ]
    else:
        script = [
            anthropic_stream([], tool_calls=step1, stop="tool_use"),
            anthropic_stream(["Now grep."], tool_calls=step2, stop="tool_use"),
            anthropic_stream(["Found ", "one TODO."]),
        ]

    async def body() -> tuple[dict[str, Any], Any, list[Any]]:
        async with StubServer() as stub:
            stub.script(*(Reply(events=events) for events in script))
            options: dict[str, Any] = {"base_url": stub.url, "api_key": "k",
                                       "settings": HttpSettings(backoff_s=0.0),
                                       "defaults": {"model": "m"}}  # fmt: skip
            provider = (
                OpenAIProvider(**options) if api == "openai" else AnthropicProvider(**options)
            )
            async with Runtime(store, providers=[provider], default_provider=api) as runtime:
                sid = (await runtime.create("agent"))["session_id"]
                result = await runtime.prompt(sid, "find the TODOs", tools=TOOLS)
                record = await runtime.record(sid)
        return result, record, stub.requests

    result, record, requests = asyncio.run(body())
    assert result["text"] == "Found one TODO." and result["steps"] == 3
    assert result["stop_reason"] == "end_turn"
    per_call = (11, 7) if api == "openai" else (13, 5)
    assert result["usage"]["input_tokens"] == 3 * per_call[0]
    assert result["usage"]["output_tokens"] == 3 * per_call[1]
    sid = result["session_id"]
    assert types_of(store, sid) == [
        "session_opened",
        "prompt_started",
        "step_completed",
        "tool_call_started",
        "tool_call_finished",
        "step_completed",
        "tool_call_started",
        "tool_call_finished",
        "prompt_completed",
    ]
    messages = store.messages(sid)
    assert [m["role"] for m in messages] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant"
    ]  # fmt: skip
    assert messages[2]["content"] == "contents of a.txt: TODO fix"
    assert messages[4]["content"] == '{"matches": ["a.txt:1:TODO"], "limit": 2}'
    assert_answered(messages)
    root, *children = record.loops
    assert root["status"] == "completed" and root["usage"]["input_tokens"] == 3 * per_call[0]
    assert [child["parent_loop_id"] for child in children] == [root["loop_id"]] * 2
    assert [child["config"]["tool"] for child in children] == ["read_file", "grep"]
    assert all(child["status"] == "completed" for child in children)
    assert record.children_of(root["loop_id"]) == children
    last = requests[2].json
    if api == "openai":
        assert [m["role"] for m in last["messages"]] == [
            "user", "assistant", "tool", "assistant", "tool"
        ]  # fmt: skip
        assert last["tools"][0]["function"]["name"] == "read_file"
    else:
        assert [m["role"] for m in last["messages"]] == [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
        ]
        assert last["messages"][2]["content"][0]["tool_use_id"] == "call_1"
        assert last["tools"][1]["name"] == "grep"


def test_parallel_calls_run_together_and_are_siblings(store: SessionStore) -> None:
    arrived = 0
    all_in = asyncio.Event()

    async def meet(n: int) -> str:
        nonlocal arrived
        arrived += 1
        if arrived == 3:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 10)  # only returns if the three run at once
        return f"met {n}"

    provider = ScriptedProvider(
        [calls(("meet", {"n": 1}), ("meet", {"n": 2}), ("meet", {"n": 3})), FINAL]
    )
    tool = Tool("meet", meet, {"type": "object", "properties": {"n": {"type": "integer"}}})

    async def body() -> tuple[dict[str, Any], Any]:
        async with Runtime(store, providers=[provider], default_provider="scripted") as runtime:
            sid = (await runtime.create("agent"))["session_id"]
            result = await runtime.prompt(sid, "meet up", tools=[tool])
            return result, await runtime.record(sid)

    result, record = asyncio.run(body())
    assert result["text"] == "all done" and result["steps"] == 2
    root, *children = record.loops
    assert len(children) == 3
    assert all(child["parent_loop_id"] == root["loop_id"] for child in children)
    group = children[0]["parallel_group"]
    assert group is not None and all(c["parallel_group"] == group for c in children)
    assert record.parallel_siblings(children[1]["loop_id"]) == children
    messages = store.messages(result["session_id"])
    assert sorted(m["content"] for m in messages if m["role"] == "tool") == [
        "met 1", "met 2", "met 3"
    ]  # fmt: skip
    assert_answered(messages)
    (second_call, tools) = provider.seen[1]
    assert tools == [tool.spec()]
    assert [m["role"] for m in second_call] == ["user", "assistant", "tool", "tool", "tool"]


def test_max_steps_answers_the_last_calls_and_stops(store: SessionStore) -> None:
    provider = ScriptedProvider([calls(("grep", {"pattern": "x"}))])
    counter = {"n": 0}

    def count(pattern: str) -> int:
        counter["n"] += 1
        return counter["n"]

    async def body() -> dict[str, Any]:
        async with Runtime(store, providers=[provider], default_provider="scripted",
                           maintain_context=False) as runtime:  # fmt: skip
            sid = (await runtime.create("agent"))["session_id"]
            return await runtime.prompt(sid, "loop", tools=[Tool("grep", count)], max_steps=3)

    result = asyncio.run(body())
    assert result["stop_reason"] == "max_steps" and result["steps"] == 3
    assert counter["n"] == 2  # the third step's call was answered, not run
    messages = store.messages(result["session_id"])
    assert "not run" in messages[-2]["content"] and messages[-1]["synthetic"] is True
    assert_answered(messages)


def test_tool_errors_and_unknown_tools_reach_the_model(store: SessionStore) -> None:
    def broken() -> str:
        raise ValueError("disk on fire")

    provider = ScriptedProvider([calls(("broken", {}), ("missing", {"a": 1})), FINAL])

    async def body() -> dict[str, Any]:
        async with Runtime(store, providers=[provider], default_provider="scripted") as runtime:
            sid = (await runtime.create("agent"))["session_id"]
            result = await runtime.prompt(sid, "try", tools=[Tool("broken", broken)])
            record = await runtime.record(sid)
            kinds = sorted(loop["error_kind"] for loop in record.loops[1:])
            assert kinds == ["tool_error", "unknown_tool"]
            return result

    result = asyncio.run(body())
    assert result["text"] == "all done"
    _, turns = to_anthropic(provider.seen[1][0], "check")
    assert [block.get("is_error") for block in turns[-1]["content"]] == [True, True]
    results = [m["content"] for m in provider.seen[1][0] if m["role"] == "tool"]
    assert results == [
        "error: ValueError: disk on fire",
        "error: LookupError: no tool named 'missing'",
    ]


def test_caller_run_tools_go_through_on_tool_call(store: SessionStore) -> None:
    provider = ScriptedProvider([calls(("ask_user", {"question": "which file?"})), FINAL])
    asked: list[dict[str, Any]] = []

    async def answer(call: dict[str, Any]) -> str:
        asked.append(call)
        return "b.txt"

    async def body() -> dict[str, Any]:
        async with Runtime(store, providers=[provider], default_provider="scripted") as runtime:
            sid = (await runtime.create("agent"))["session_id"]
            with pytest.raises(ConfigurationError, match="on_tool_call"):
                await runtime.prompt(sid, "go", tools=[Tool("ask_user")])
            return await runtime.prompt(sid, "go", tools=[Tool("ask_user")], on_tool_call=answer)

    asyncio.run(body())
    assert asked == [{"id": "c1", "name": "ask_user", "arguments": {"question": "which file?"}}]
    assert provider.seen[1][0][-1]["content"] == "b.txt"


def test_cancel_while_a_tool_runs_answers_the_open_call(store: SessionStore) -> None:
    entered = asyncio.Event()
    cancelled: list[bool] = []

    async def forever() -> str:
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    provider = ScriptedProvider([calls(("forever", {}), ("quick", {})), FINAL])

    async def body() -> str:
        async with Runtime(store, providers=[provider], default_provider="scripted") as runtime:
            sid = (await runtime.create("agent"))["session_id"]
            tools = [Tool("forever", forever), Tool("quick", lambda: "ok")]
            task = asyncio.ensure_future(runtime.prompt(sid, "go", tools=tools, request_id="r1"))
            await entered.wait()
            assert await runtime.cancel(sid, "r1") is True
            with pytest.raises(PromptCancelledError):
                await task
            assert (await runtime.status(sid))["status"] == "idle"
            record = await runtime.record(sid)
            by_tool = {loop["config"].get("tool"): loop for loop in record.loops[1:]}
            assert by_tool["forever"]["error_kind"] == "cancelled"
            assert by_tool["quick"]["status"] == "completed"
            again = await runtime.prompt(sid, "again")  # the session goes on
            assert again["text"] == "all done"
            return str(sid)

    sid = asyncio.run(body())
    assert cancelled == [True]
    assert_answered(store.messages(sid))


@pytest.mark.parametrize("mode", ["steer", "stop"])
def test_doom_loop_steers_or_stops(store: SessionStore, mode: str) -> None:
    provider = ScriptedProvider([calls(("grep", {"pattern": "same"}))])

    async def body() -> dict[str, Any]:
        async with Runtime(store, providers=[provider], default_provider="scripted",
                           doom_loop=mode) as runtime:  # fmt: skip
            sid = (await runtime.create("agent"))["session_id"]
            return await runtime.prompt(sid, "loop", tools=[Tool("grep", grep)], max_steps=6)

    result = asyncio.run(body())
    assert_answered(store.messages(result["session_id"]))
    if mode == "stop":
        assert result["stop_reason"] == "doom_loop" and result["steps"] == 3
    else:
        assert result["stop_reason"] == "max_steps" and result["steps"] == 6
        warned = [m for m in provider.seen[3][0] if m.get("synthetic") and m["role"] == "user"]
        assert warned and "called 3 times in a row" in warned[0]["content"]


def test_files_are_attached_and_sent(store: SessionStore, tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("# plan\nship it")

    async def body() -> Any:
        async with StubServer() as stub:
            stub.script(Reply(events=openai_stream(["read it"])))
            provider = OpenAIProvider(base_url=stub.url, api_key="k", defaults={"model": "m"})
            async with Runtime(store, providers=[provider], default_provider="openai") as runtime:
                sid = (await runtime.create("agent"))["session_id"]
                with pytest.raises(LimitExceededError, match="files_per_message_max"):
                    await runtime.prompt(sid, "x", files=[notes] * 11)
                with pytest.raises(InvalidArgumentError, match="no such file"):
                    await runtime.prompt(sid, "x", files=[tmp_path / "nope.txt"])
                await runtime.prompt(sid, "summarize", files=[notes])
                return sid, stub.requests

    sid, requests = asyncio.run(body())
    (request,) = requests
    parts = request.json["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "summarize"}
    assert parts[1]["text"] == '<file name="notes.md">\n# plan\nship it\n</file>'
    (prompt, _) = store.messages(sid)
    assert prompt["files"][0]["name"] == "notes.md" and prompt["files"][0]["size_bytes"] == 14


def test_bad_tools_are_refused_before_anything_is_written(store: SessionStore) -> None:
    async def body() -> None:
        providers = [UsageProvider(), ScriptedProvider([FINAL])]
        async with Runtime(store, providers=providers, default_provider="scripted") as runtime:
            sid = (await runtime.create("agent"))["session_id"]
            other = (await runtime.create("agent", provider="usage"))["session_id"]
            before = store.log.head
            with pytest.raises(ConfigurationError, match="takes no tools"):
                await runtime.prompt(other, "x", tools=[Tool("t", grep)])
            with pytest.raises(InvalidArgumentError, match="tool name"):
                await runtime.prompt(sid, "x", tools=[Tool("bad name", grep)])
            with pytest.raises(InvalidArgumentError, match="two tools"):
                await runtime.prompt(sid, "x", tools=[Tool("t", grep), Tool("t", grep)])
            with pytest.raises(InvalidArgumentError, match="JSON Schema of an object"):
                await runtime.prompt(sid, "x", tools=[Tool("t", grep, {"type": "array"})])
            with pytest.raises(InvalidArgumentError, match="max_steps"):
                await runtime.prompt(sid, "x", tools=[Tool("t", grep)], max_steps=0)
            assert store.log.head == before

    asyncio.run(body())


def test_step_hooks_and_filters_see_each_step(store: SessionStore) -> None:
    from sessions.runtime import reject

    provider = ScriptedProvider([calls(("read_file", {"path": "secret.env"})), FINAL])
    seen: list[tuple[str, dict[str, Any]]] = []

    def no_todo(text: str) -> Any:
        from sessions.runtime import passed

        return reject("mentions a TODO") if "TODO" in text else passed()

    async def body() -> dict[str, Any]:
        async with Runtime(
            store,
            providers=[provider],
            default_provider="scripted",
            input_filters=[no_todo],
            before_step=lambda info: seen.append(("before", info)),
            after_step=lambda info: seen.append(("after", info)),
        ) as runtime:
            sid = (await runtime.create("agent"))["session_id"]
            return await runtime.prompt(sid, "read it", tools=TOOLS)

    result = asyncio.run(body())
    assert [(when, info["step"]) for when, info in seen] == [
        ("before", 1), ("after", 1), ("before", 2), ("after", 2)
    ]  # fmt: skip
    assert seen[1][1]["tool_calls"] == ["read_file"]
    withheld = "[result withheld by input filter no_todo: mentions a TODO]"
    assert seen[1][1]["results"] == [withheld]
    assert provider.seen[1][0][-1]["content"] == withheld  # the model never saw the result
    assert seen[3][1]["stop_reason"] == "end_turn" and result["steps"] == 2
