"""The HTTP providers against stub servers on loopback that speak each API's wire format: plain
and streamed answers, tool calls, every error class, retries, timeouts, cancellation mid-stream,
the merged runtime parameters as the server received them, and API keys that never reach the
store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from replay import export_bundle
from sessions import SessionStore
from sessions.runtime import (
    AnthropicProvider,
    ConfigurationError,
    ContextLengthError,
    HttpSettings,
    OpenAIProvider,
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderTimeoutError,
    Runtime,
)
from tests._model_stubs import (
    Reply,
    StubServer,
    anthropic_stream,
    anthropic_whole,
    openai_stream,
    openai_whole,
)

KEY = "sk-test-0123456789abcdefSECRET"
FAST = HttpSettings(backoff_s=0.01, connect_timeout_s=2.0, read_timeout_s=5.0)
CALLS = [
    {"id": "call_a", "name": "read_file", "arguments": {"path": "a.txt"}},
    {"id": "call_b", "name": "grep", "arguments": {"pattern": "TODO", "limit": 3}},
]


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())  # type: ignore[arg-type]


def openai(stub: StubServer, **kwargs: Any) -> OpenAIProvider:
    options: dict[str, Any] = {
        "base_url": stub.url,
        "api_key": KEY,
        "settings": FAST,
        "defaults": {"model": "gpt-stub"},
    }
    return OpenAIProvider(**{**options, **kwargs})


def anthropic(stub: StubServer, **kwargs: Any) -> AnthropicProvider:
    options: dict[str, Any] = {
        "base_url": stub.url,
        "api_key": KEY,
        "settings": FAST,
        "defaults": {"model": "claude-stub"},
    }
    return AnthropicProvider(**{**options, **kwargs})


USER = [{"role": "user", "content": "hello"}]


# Chat Completions


def test_openai_plain_answer_and_request_shape() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            stub.script(Reply(body=openai_whole("hi there", usage=(9, 2))))
            provider = openai(stub, stream=False)
            done = await provider.complete(USER, {"model": "gpt-x", "temperature": 0.3})
            await provider.aclose()
        assert done.text == "hi there" and done.stop_reason == "end_turn"
        assert done.usage == {"input_tokens": 9, "output_tokens": 2, "total_tokens": 11}
        assert done.model == "gpt-stub"
        (request,) = stub.requests
        assert request.path == "/v1/chat/completions"
        assert request.headers["authorization"] == f"Bearer {KEY}"
        assert request.json == {
            "model": "gpt-x",
            "messages": [{"role": "user", "content": "hello"}],
            "stream": False,
            "temperature": 0.3,
        }

    run(body)


def test_openai_stream_assembles_text_usage_and_parallel_tool_calls() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            events = openai_stream(["I will ", "look."], tool_calls=CALLS, finish="tool_calls")
            stub.script(Reply(events=events))
            provider = openai(stub)
            done = await provider.complete(USER, {"model": "gpt-x"})
            await provider.aclose()
        assert done.text == "I will look."
        assert done.stop_reason == "tool_use"
        assert [dict(call) for call in done.tool_calls] == CALLS
        assert done.usage["input_tokens"] == 11 and done.usage["output_tokens"] == 7
        sent = stub.requests[0].json
        assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}

    run(body)


def test_openai_transcript_with_tools_and_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("line one")
    (tmp_path / "dot.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    files = [{"path": str(tmp_path / "notes.txt")}, {"path": str(tmp_path / "dot.png")}]
    messages = [
        {"role": "user", "content": "read it", "files": files},
        {"role": "assistant", "content": "", "tool_calls": [CALLS[0]]},
        {"role": "tool", "tool_call_id": "call_a", "content": "contents of a"},
    ]
    provider = OpenAIProvider(base_url="http://127.0.0.1:9/v1", api_key=KEY)
    tools = [{"name": "read_file", "description": "Read a file", "parameters": {"type": "object"}}]
    sent = provider.request_body(
        messages,
        {"model": "m", "system_prompt": "be brief", "stop_sequences": ["END"], "top_k": 5,
         "max_tokens": 9, "provider_specific": {"seed": 7}},
        tools,
    )  # fmt: skip
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    parts = sent["messages"][1]["content"]
    assert parts[0] == {"type": "text", "text": "read it"}
    assert parts[1]["text"] == '<file name="notes.txt">\nline one\n</file>'
    assert parts[2]["image_url"]["url"].startswith("data:image/png;base64,")
    assert sent["messages"][2]["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": '{"path":"a.txt"}',
    }
    assert sent["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_a",
        "content": "contents of a",
    }
    assert sent["stop"] == ["END"] and sent["max_tokens"] == 9 and sent["seed"] == 7
    assert "top_k" not in sent  # not part of Chat Completions
    assert sent["tools"][0]["function"]["name"] == "read_file"


# Anthropic Messages


def test_anthropic_stream_text_tool_use_and_usage() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            events = anthropic_stream(["Let me ", "check."], tool_calls=CALLS, stop="tool_use")
            stub.script(Reply(events=events))
            provider = anthropic(stub)
            done = await provider.complete(USER, {"model": "claude-x", "top_k": 4})
            await provider.aclose()
        assert done.text == "Let me check." and done.stop_reason == "tool_use"
        assert [dict(call) for call in done.tool_calls] == CALLS
        assert done.usage == {"input_tokens": 13, "output_tokens": 5}
        request = stub.requests[0]
        assert request.path == "/v1/messages"
        assert request.headers["x-api-key"] == KEY
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert request.json["top_k"] == 4 and request.json["max_tokens"] == 4096

    run(body)


def test_anthropic_plain_answer() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            stub.script(Reply(body=anthropic_whole("plain", stop="max_tokens", usage=(3, 1))))
            provider = anthropic(stub, stream=False)
            done = await provider.complete(USER, {"model": "claude-x", "max_tokens": 1})
            await provider.aclose()
        assert (done.text, done.stop_reason) == ("plain", "max_tokens")
        assert done.usage == {"input_tokens": 3, "output_tokens": 1}
        assert "stream" not in stub.requests[0].json

    run(body)


def test_anthropic_transcript_shape() -> None:
    messages = [
        {"role": "system", "content": "from the transcript"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "ok", "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "call_a", "content": "A"},
        {"role": "tool", "tool_call_id": "call_b", "content": "B"},
        {"role": "user", "content": "and?", "synthetic": True},
    ]
    provider = AnthropicProvider(base_url="http://127.0.0.1:9/v1", api_key=KEY)
    sent = provider.request_body(messages, {"model": "m", "system_prompt": "override"}, ())
    assert sent["system"] == "from the transcript\n\noverride"
    roles = [turn["role"] for turn in sent["messages"]]
    assert roles == ["user", "assistant", "user"]  # results and the next user turn merged
    assert sent["messages"][1]["content"][1] == {
        "type": "tool_use", "id": "call_a", "name": "read_file", "input": {"path": "a.txt"}
    }  # fmt: skip
    last = sent["messages"][2]["content"]
    assert [block["type"] for block in last] == ["tool_result", "tool_result", "text"]
    assert last[1] == {"type": "tool_result", "tool_use_id": "call_b", "content": "B"}


# Errors, retries, timeouts, cancellation


@pytest.mark.parametrize("status", [429, 503])
def test_retries_honour_retry_after(status: int) -> None:
    async def body() -> None:
        async with StubServer() as stub:
            busy = Reply(status=status, body={"error": {"message": "slow down"}},
                         headers={"retry-after": "0"})  # fmt: skip
            stub.script(busy, busy, Reply(body=openai_whole("finally")))
            provider = openai(stub, stream=False)
            done = await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert done.text == "finally" and len(stub.requests) == 3

    run(body)


def test_retries_give_up_with_the_status() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            for _ in range(4):
                stub.script(Reply(status=502, body={"error": {"message": "bad gateway"}}))
            provider = openai(stub, settings=HttpSettings(backoff_s=0.0, retries=2))
            with pytest.raises(ProviderHTTPError) as caught:
                await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert caught.value.status == 502 and "bad gateway" in str(caught.value)
        assert len(stub.requests) == 3

    run(body)


def test_retry_after_too_long_is_not_waited_for() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            stub.script(Reply(status=429, body={}, headers={"retry-after": "3600"}))
            provider = openai(stub)
            with pytest.raises(ProviderHTTPError) as caught:
                await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert caught.value.status == 429 and len(stub.requests) == 1

    run(body)


def test_client_errors_are_not_retried() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            stub.script(Reply(status=401, body={"error": {"message": "bad key"}}))
            provider = anthropic(stub)
            with pytest.raises(ProviderHTTPError) as caught:
                await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert caught.value.status == 401 and len(stub.requests) == 1

    run(body)


@pytest.mark.parametrize("which", ["openai", "anthropic"])
def test_context_length_refusal(which: str) -> None:
    refusals = {
        "openai": {"error": {"code": "context_length_exceeded",
                             "message": "This model's maximum context length is 8 tokens"}},
        "anthropic": {"type": "error", "error": {"type": "invalid_request_error",
                                                 "message": "prompt is too long: 9 > 8"}},
    }  # fmt: skip

    async def body() -> None:
        async with StubServer() as stub:
            stub.script(Reply(status=400, body=refusals[which]))
            provider = openai(stub) if which == "openai" else anthropic(stub)
            with pytest.raises(ContextLengthError):
                await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert len(stub.requests) == 1

    run(body)


def test_read_timeout_is_retried_then_raised() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            stub.script(Reply(hang=True), Reply(hang=True))
            settings = HttpSettings(read_timeout_s=0.2, retries=1, backoff_s=0.0)
            provider = openai(stub, settings=settings)
            with pytest.raises(ProviderTimeoutError):
                await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert len(stub.requests) == 2

    run(body)


def test_a_stream_dropped_midway_is_retried() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            events = openai_stream(["one ", "two"])
            stub.script(Reply(events=events, drop_after=2), Reply(events=events))
            provider = openai(stub)
            done = await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert done.text == "one two" and len(stub.requests) == 2

    run(body)


def test_a_stream_that_keeps_dropping_fails() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            events = anthropic_stream(["x"])
            for _ in range(2):
                stub.script(Reply(events=events, drop_after=3))
            provider = anthropic(stub, settings=HttpSettings(retries=1, backoff_s=0.0))
            with pytest.raises(ProviderConnectionError):
                await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert len(stub.requests) == 2

    run(body)


def test_mid_stream_error_event() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            events = anthropic_stream(["x"])[:3]
            refusal = {"type": "invalid_request_error", "message": "boom"}
            events.append(("error", {"type": "error", "error": refusal}))
            stub.script(Reply(events=events))
            provider = anthropic(stub)
            with pytest.raises(ProviderHTTPError, match="boom"):
                await provider.complete(USER, {"model": "m"})
            # An internal error mid-answer (the API's 500) is retried, as a 500 status is.
            failed = [*anthropic_stream(["x"])[:3], ("error", {"type": "error",
                      "error": {"type": "api_error", "message": "internal"}})]  # fmt: skip
            stub.script(Reply(events=failed), Reply(events=anthropic_stream(["whole"])))
            assert (await provider.complete(USER, {"model": "m"})).text == "whole"
            await provider.aclose()

    run(body)


def test_connection_refused() -> None:
    async def body() -> None:
        provider = OpenAIProvider(
            base_url="http://127.0.0.1:9/v1",
            api_key=KEY,
            settings=HttpSettings(retries=1, backoff_s=0.0),
            defaults={"model": "m"},
        )
        with pytest.raises(ProviderConnectionError):
            await provider.complete(USER, {"model": "m"})
        await provider.aclose()

    run(body)


def test_cancel_mid_stream_closes_the_connection(store: SessionStore) -> None:
    async def body() -> None:
        async with StubServer() as stub:
            events = openai_stream([f"w{i} " for i in range(50)])
            stub.script(Reply(events=events, event_delay_s=0.2))
            async with Runtime(store, providers=[openai(stub)], default_provider="openai") as rt:
                sid = (await rt.create("agent"))["session_id"]
                task = asyncio.ensure_future(rt.prompt(sid, "talk", request_id="r1"))
                await stub.streaming.wait()
                assert await rt.cancel(sid, "r1") is True
                await asyncio.wait_for(stub.disconnected.wait(), 5)
                with pytest.raises(Exception) as caught:
                    await task
                assert type(caught.value).__name__ == "PromptCancelledError"
                assert (await rt.status(sid))["status"] == "idle"
        assert stub.disconnects == 1

    run(body)


# Through the runtime


def test_runtime_merges_parameters_as_the_server_sees_them(store: SessionStore) -> None:
    async def body() -> None:
        async with StubServer() as stub:
            stub.script(Reply(events=openai_stream(["first"])), Reply(events=openai_stream(["2"])))
            provider = openai(
                stub,
                defaults={"model": "gpt-base", "temperature": 0.1, "top_p": 0.9,
                          "provider_specific": {"seed": 1, "user": "base"}},
            )  # fmt: skip
            async with Runtime(store, providers=[provider], default_provider="openai") as rt:
                sid = (
                    await rt.create(
                        "agent",
                        runtime_params={"temperature": 0.5, "provider_specific": {"user": "s"}},
                    )
                )["session_id"]
                first = await rt.prompt(sid, "one", {"max_tokens": 7, "system_prompt": "sys"})
                await rt.prompt(sid, "two", {"provider_specific": {"logprobs": True}})
        assert first["text"] == "first" and first["usage"]["input_tokens"] == 11
        one, two = (request.json for request in stub.requests)
        assert one["model"] == "gpt-base" and one["temperature"] == 0.5 and one["top_p"] == 0.9
        assert one["max_tokens"] == 7 and (one["seed"], one["user"]) == (1, "s")
        assert one["messages"] == [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "one"},
        ]
        assert "max_tokens" not in two and two["logprobs"] is True and two["user"] == "s"
        assert [m["content"] for m in two["messages"]] == ["one", "first", "two"]

    run(body)


def test_context_refusal_through_the_runtime_keeps_the_session(store: SessionStore) -> None:
    async def body() -> None:
        async with StubServer() as stub:
            refusal = {"error": {"code": "context_length_exceeded", "message": "too long"}}
            stub.script(Reply(status=400, body=refusal), Reply(events=openai_stream(["ok"])))
            async with Runtime(store, providers=[openai(stub)], default_provider="openai") as rt:
                sid = (await rt.create("agent"))["session_id"]
                with pytest.raises(ProviderError, match="ContextLengthError"):
                    await rt.prompt(sid, "huge")
                assert (await rt.status(sid))["status"] == "idle"
                assert (await rt.prompt(sid, "again"))["text"] == "ok"
                loops = (await rt.record(sid)).loops
        assert loops[0]["error_kind"] == "context_length"

    run(body)


def test_api_keys_never_reach_the_store_or_a_bundle(tmp_path: Path) -> None:
    """The stub echoes the headers it got in its error bodies; every byte the store keeps, every
    error raised and the bundle export are scanned for the key."""

    def echo(request: Any) -> Reply:
        return Reply(status=400, body={"error": {"message": f"headers: {request.headers}"}})

    errors: list[str] = []

    async def body(store: SessionStore) -> str:
        async with StubServer(default=echo) as stub:
            stub.script(Reply(events=openai_stream(["fine"])))
            providers = [openai(stub), anthropic(stub)]
            async with Runtime(store, providers=providers, default_provider="openai") as rt:
                sid = (await rt.create("agent"))["session_id"]
                await rt.prompt(sid, "first")
                for name in ("openai", "anthropic"):
                    other = (await rt.create("agent", provider=name))["session_id"]
                    try:
                        await rt.prompt(other, "fails")
                    except ProviderError as exc:
                        errors.append(str(exc))
                    errors.extend(json.dumps(loop) for loop in (await rt.record(other)).loops)
                errors.append(repr(providers))
                return str(sid)

    path = tmp_path / "store"
    with SessionStore.open(path) as store:
        sid = run(lambda: body(store))
        bundle = json.dumps(export_bundle(store, sid, "local"))
    assert len(errors) == 5 and all("[redacted]" in e for e in errors[0::2][:2])
    assert all(KEY not in text for text in [*errors, bundle])
    stored = [item for item in path.rglob("*") if item.is_file()]
    assert stored
    for item in stored:
        assert KEY.encode() not in item.read_bytes(), item.name


def test_keys_from_environment_and_secrets_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STUB_KEY", "from-env")
    provider = OpenAIProvider(base_url="http://127.0.0.1:9/v1", api_key_env="STUB_KEY")
    assert provider._headers["authorization"] == "Bearer from-env"
    secrets = tmp_path / "secrets.env"
    secrets.write_text("# keys\nOTHER=x\nFILE_KEY=from-file\n")
    provider = AnthropicProvider(
        base_url="http://127.0.0.1:9/v1", api_key_env="FILE_KEY", secrets_file=secrets
    )
    assert provider._headers["x-api-key"] == "from-file"
    assert "from-file" not in repr(provider)
    with pytest.raises(ConfigurationError, match=r"\$MISSING_KEY") as caught:
        AnthropicProvider(api_key_env="MISSING_KEY", secrets_file=secrets)
    assert "from-file" not in str(caught.value)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    keyless = OpenAIProvider(base_url="http://127.0.0.1:9/v1")  # a local server needs none
    assert "authorization" not in keyless._headers


def test_a_missing_model_is_a_configuration_error() -> None:
    provider = OpenAIProvider(base_url="http://127.0.0.1:9/v1", api_key=KEY)
    with pytest.raises(ConfigurationError, match="no `model`"):
        provider.request_body(USER, {}, ())


@pytest.mark.parametrize("which", ["openai", "anthropic"])
def test_whole_answers_with_parallel_tool_calls(which: str) -> None:
    async def body() -> Any:
        async with StubServer() as stub:
            if which == "openai":
                stub.script(Reply(body=openai_whole(tool_calls=CALLS, finish="tool_calls")))
                provider: Any = openai(stub, stream=False)
            else:
                stub.script(Reply(body=anthropic_whole("checking", tool_calls=CALLS,
                                                       stop="tool_use")))  # fmt: skip
                provider = anthropic(stub, stream=False)
            done = await provider.complete(USER, {"model": "m"}, tools=[{"name": "grep"}])
            await provider.aclose()
            return done, stub.requests[0].json

    done, sent = run(body)
    assert done.stop_reason == "tool_use"
    assert [dict(call) for call in done.tool_calls] == CALLS
    assert len(sent["tools"]) == 1


def test_one_provider_serves_one_event_loop_after_another() -> None:
    """A client belongs to the loop it first ran on; the next `asyncio.run` gets its own."""
    provider = OpenAIProvider(api_key=KEY, settings=FAST, stream=False)

    async def body(text: str) -> str:
        async with StubServer() as stub:
            stub.script(Reply(body=openai_whole(text)))
            provider.url = stub.url + "/chat/completions"
            done = await provider.complete(USER, {"model": "m"})
            await provider.aclose()  # closes this loop's client only
            return done.text

    assert run(lambda: body("one")) == "one"
    assert run(lambda: body("two")) == "two"


def test_anthropic_files_in_its_own_form(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("line one")
    (tmp_path / "dot.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    (tmp_path / "paper.pdf").write_bytes(b"%PDF-1.4 fake")
    files = [{"path": str(tmp_path / name)} for name in ("notes.txt", "dot.png", "paper.pdf")]
    provider = AnthropicProvider(base_url="http://127.0.0.1:9/v1", api_key=KEY)
    sent = provider.request_body(
        [{"role": "user", "content": "read", "files": files}], {"model": "m"}, ()
    )
    text, notes, image, paper = sent["messages"][0]["content"]
    assert text == {"type": "text", "text": "read"}
    assert notes["type"] == "document" and notes["source"] == {
        "type": "text", "media_type": "text/plain", "data": "line one"
    }  # fmt: skip
    assert image["type"] == "image" and image["source"]["media_type"] == "image/png"
    assert paper["type"] == "document" and paper["source"]["media_type"] == "application/pdf"
    assert paper["title"] == "paper.pdf"


# Answers that go wrong inside a 200


def _sse(data: Any, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return ((f"event: {event}\n" if event else "") + f"data: {text}\n\n").encode()


def _chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[None, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return None, {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}


def test_keys_in_errors_inside_a_stream_never_reach_an_error_or_the_store(tmp_path: Path) -> None:
    """An error event of a 200 stream and a data line that is not JSON, both echoing the key
    (the second cut by the provider's quote in the middle of the key), through the runtime."""
    echo = f"Invalid credentials: Bearer {KEY}"
    cut = "x" * 160 + KEY  # the not-JSON quote keeps 200 characters: 15 of the key
    errors: list[Exception] = []

    async def body(store: SessionStore) -> None:
        async with StubServer() as stub:
            stub.script(
                Reply(events=[(None, {"error": {"code": "invalid_api_key", "message": echo}})]),
                Reply(events=[("message_start", f"upstream said: x-api-key={cut}")]),
                Reply(events=[(None, {"error": {"code": "invalid_api_key", "message": echo}})]),
            )
            providers = [openai(stub), anthropic(stub)]
            async with Runtime(store, providers=providers, default_provider="openai") as rt:
                for name in ("openai", "anthropic"):
                    sid = (await rt.create("agent", provider=name))["session_id"]
                    with pytest.raises(ProviderError) as caught:
                        await rt.prompt(sid, "hello")
                    errors.append(caught.value)
                    assert KEY not in json.dumps((await rt.record(sid)).loops)
            direct = openai(stub)
            with pytest.raises(ProviderHTTPError) as raised:
                await direct.complete(USER, {"model": "m"})
            await direct.aclose()
            errors.append(raised.value)
        assert len(stub.requests) == 3  # not retried

    path = tmp_path / "store"
    with SessionStore.open(path) as store:
        run(lambda: body(store))
    oa, an, direct = errors
    assert type(direct) is ProviderHTTPError and direct.status is None
    assert "invalid_api_key Invalid credentials: Bearer [redacted]" in str(direct)
    assert "ProviderHTTPError" in str(oa) and "[redacted]" in str(oa)
    assert "not JSON" in str(an) and str(an).endswith("x[redacted]'")
    for error in errors:
        assert KEY[:10] not in str(error)
    stored = [item for item in path.rglob("*") if item.is_file()]
    assert stored
    for item in stored:
        assert KEY[:10].encode() not in item.read_bytes(), item.name


def _cut_anthropic_stream() -> list[tuple[str | None, Any]]:
    events = anthropic_stream([], tool_calls=CALLS[:1], stop="max_tokens")
    block = {"type": "tool_use", "id": "call_cut", "name": "grep", "input": {}}
    delta = {"type": "input_json_delta", "partial_json": '{"pattern": "a long te'}
    cut = [
        ("content_block_start", {"type": "content_block_start", "index": 1,
                                 "content_block": block}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
    ]  # fmt: skip
    return events[:-2] + cut + events[-2:]


def _cut_openai_stream() -> list[tuple[str | None, Any]]:
    first = {"index": 0, "id": "call_a", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}  # fmt: skip
    second = {"index": 1, "id": "call_cut", "type": "function",
              "function": {"name": "grep", "arguments": '{"pattern": "a long te'}}  # fmt: skip
    return [
        _chunk({"tool_calls": [first]}),
        _chunk({"tool_calls": [second]}),
        _chunk({}, "length"),
        (None, "[DONE]"),
    ]


@pytest.mark.parametrize("which", ["openai", "anthropic", "openai-whole"])
def test_max_tokens_inside_tool_arguments_drops_only_the_cut_call(which: str) -> None:
    whole = openai_whole(tool_calls=CALLS, finish="length")
    whole["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"] = '{"pattern": "TO'
    replies = {
        "openai": Reply(events=_cut_openai_stream()),
        "anthropic": Reply(events=_cut_anthropic_stream()),
        "openai-whole": Reply(body=whole),
    }

    async def body() -> Any:
        async with StubServer() as stub:
            stub.script(replies[which])
            if which == "anthropic":
                provider: Any = anthropic(stub)
            else:
                provider = openai(stub, stream=which == "openai")
            done = await provider.complete(USER, {"model": "m"}, tools=[{"name": "grep"}])
            await provider.aclose()
            return done

    done = run(body)
    assert done.stop_reason == "max_tokens"
    assert [dict(call) for call in done.tool_calls] == CALLS[:1]


def test_max_tokens_inside_tool_arguments_keeps_the_session(store: SessionStore) -> None:
    from sessions.runtime import Tool

    async def body() -> None:
        async with StubServer() as stub:
            cut = [
                _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                        "function": {"name": "write",
                                                     "arguments": '{"text": "a long te'}}]}),
                _chunk({}, "length"),
                (None, "[DONE]"),
            ]  # fmt: skip
            stub.script(Reply(events=cut), Reply(events=openai_stream(["shorter"])))
            tool = Tool(name="write", fn=lambda text="": "ok", parameters={"type": "object"})
            async with Runtime(store, providers=[openai(stub)], default_provider="openai") as rt:
                sid = (await rt.create("agent"))["session_id"]
                first = await rt.prompt(sid, "write a long text", tools=[tool])
                assert first["stop_reason"] == "max_tokens" and first["tool_calls"] == []
                assert (await rt.status(sid))["status"] == "idle"
                assert (await rt.prompt(sid, "shorter please"))["text"] == "shorter"

    run(body)


def test_a_stream_cut_in_the_middle_of_an_event_is_retried() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            whole = _sse(_chunk({"content": "hello world"})[1])
            cut = Reply(raw=[_sse(_chunk({"content": "he"})[1]), whole[: len(whole) // 2]])
            stub.script(cut, Reply(events=openai_stream(["recovered"])))
            provider = openai(stub)
            done = await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert done.text == "recovered" and len(stub.requests) == 2

    run(body)


def test_stream_lines_end_in_crlf_cr_or_lf_across_chunks() -> None:
    """The stream's lines are split by the runtime's own bounded reader: CRLF split between two
    chunks is one line end, a lone CR ends a line, and a multi-byte character cut between
    chunks is whole again."""
    text = json.dumps(_chunk({"content": "café "})[1], ensure_ascii=False)
    first = f"data: {text}\r\n\r\n".encode()
    second = _sse(_chunk({"content": "au lait"})[1]).replace(b"\n", b"\r")
    finish = _sse(_chunk({}, "stop")[1]) + _sse("[DONE]")
    cut = first.index(b"\xc3") + 1
    pieces: list[bytes | float] = [first[:cut], 0.05, first[cut:-3], 0.05, first[-3:-2]]
    pieces += [0.05, first[-2:], second, finish]

    async def body() -> None:
        async with StubServer() as stub:
            stub.script(Reply(raw=pieces))
            provider = openai(stub)
            done = await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert done.text == "café au lait" and done.stop_reason == "end_turn"
        assert len(stub.requests) == 1

    run(body)


@pytest.mark.parametrize("which", ["openai", "anthropic"])
def test_a_json_answer_to_a_stream_request_is_read_whole(which: str) -> None:
    """A gateway that ignores `stream` answers with the whole completion as JSON, or with an
    error object (echoing the key) and status 200: neither is retried as a dropped stream."""
    if which == "openai":
        answer, error = openai_whole("the answer"), {"error": {"message": f"no model for {KEY}"}}
    else:
        answer = anthropic_whole("the answer")
        error = {"type": "error", "error": {"type": "not_found_error",
                                            "message": f"no model for {KEY}"}}  # fmt: skip

    async def body() -> None:
        async with StubServer() as stub:
            stub.script(Reply(body=answer), Reply(body=error))
            provider = openai(stub) if which == "openai" else anthropic(stub)
            done = await provider.complete(USER, {"model": "m"})
            with pytest.raises(ProviderHTTPError) as caught:
                await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert done.text == "the answer" and done.stop_reason == "end_turn"
        assert type(caught.value) is ProviderHTTPError
        assert "no model for [redacted]" in str(caught.value) and KEY not in str(caught.value)
        assert len(stub.requests) == 2
        assert all(request.json["stream"] is True for request in stub.requests)

    run(body)


def test_openai_tool_deltas_without_an_index() -> None:
    """Gemini's OpenAI endpoint: no `index`, and a continuation with an empty `id` (or, from
    some proxies, the same `id` again)."""
    events = [
        _chunk({"tool_calls": [{"id": "call_a", "type": "function",
                                "function": {"name": "read_file", "arguments": '{"path":'}}]}),
        _chunk({"tool_calls": [{"id": "", "type": "", "function": {"arguments": ' "a.txt"}'}}]}),
        _chunk({"tool_calls": [{"id": "call_b", "type": "function",
                                "function": {"name": "grep", "arguments": ""}}]}),
        _chunk({"tool_calls": [{"id": "call_b", "function": {"arguments": '{"pattern": "TODO", '}}]}),
        _chunk({"tool_calls": [{"id": "", "function": {"arguments": '"limit": 3}'}}]}),
        _chunk({}, "tool_calls"),
        (None, "[DONE]"),
    ]  # fmt: skip

    async def body() -> Any:
        async with StubServer() as stub:
            stub.script(Reply(events=events))
            provider = openai(stub)
            done = await provider.complete(USER, {"model": "m"}, tools=[{"name": "grep"}])
            await provider.aclose()
            return done

    done = run(body)
    assert done.stop_reason == "tool_use"
    assert [dict(call) for call in done.tool_calls] == CALLS


def test_total_timeout_ends_a_stream_of_keepalives() -> None:
    """A server that only sends comments never trips the read timeout; the call's deadline
    ends it, and nothing is retried past it."""

    async def body() -> float:
        async with StubServer() as stub:
            stub.script(Reply(raw=[b": keep-alive\n\n", 0.1] * 200))
            settings = HttpSettings(read_timeout_s=0.5, total_timeout_s=1.0, retries=3)
            provider = openai(stub, settings=settings)
            started = asyncio.get_running_loop().time()
            with pytest.raises(ProviderTimeoutError, match="total_timeout_s=1 s"):
                await provider.complete(USER, {"model": "m"})
            took = asyncio.get_running_loop().time() - started
            await provider.aclose()
        assert len(stub.requests) == 1
        return took

    assert 0.9 < run(body) < 5.0
    assert HttpSettings().total_timeout_s == 600.0
    with pytest.raises(ConfigurationError, match="total_timeout_s"):
        HttpSettings(total_timeout_s=0)


THOUGHT = {"type": "thinking", "thinking": "I should look it up.", "signature": "EqQBCkYIAxgCIkB"}
HIDDEN = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}


def _thinking_stream(call: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """An answer that thinks (a thinking block in pieces, its signature, a redacted one) and
    then calls `call`, as Anthropic streams it with extended thinking enabled."""
    events = anthropic_stream([], tool_calls=[call], stop="tool_use")
    for _, data in events:
        if isinstance(data, dict) and "index" in data:
            data["index"] += 2
    start = {"type": "thinking", "thinking": "", "signature": ""}
    half = len(THOUGHT["thinking"]) // 2
    deltas = [
        {"type": "thinking_delta", "thinking": THOUGHT["thinking"][:half]},
        {"type": "thinking_delta", "thinking": THOUGHT["thinking"][half:]},
        {"type": "signature_delta", "signature": THOUGHT["signature"]},
    ]
    thinking: list[tuple[str | None, Any]] = [
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
        *[("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d})
          for d in deltas],
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": HIDDEN}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
    ]  # fmt: skip
    return events[:2] + thinking + events[2:]


def test_anthropic_thinking_goes_back_with_its_turn(store: SessionStore) -> None:
    """With extended thinking, the API requires an assistant turn's thinking blocks (signatures
    included) to come back with it when the tool results are sent: they are recorded with the
    reply and sent first in its turn, never shown as its text."""
    from sessions.runtime import Tool

    call = {"id": "toolu_1", "name": "lookup", "arguments": {"q": "x"}}

    async def body() -> None:
        async with StubServer() as stub:
            stub.script(
                Reply(events=_thinking_stream(call)), Reply(events=anthropic_stream(["done"]))
            )
            tool = Tool(name="lookup", fn=lambda q: "found", parameters={"type": "object"})
            provider = anthropic(stub)
            async with Runtime(store, providers=[provider], default_provider="anthropic") as rt:
                sid = (await rt.create("agent"))["session_id"]
                assert (await rt.prompt(sid, "find x", tools=[tool]))["text"] == "done"
            turn = stub.requests[1].json["messages"][1]
        assert turn["role"] == "assistant"
        assert turn["content"] == [
            THOUGHT,
            HIDDEN,
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},
        ]
        (reply,) = [m for m in store.messages(sid) if m.get("tool_calls")]
        assert reply["content"] in ("", None)
        assert reply["metadata"]["provider_blocks"] == [THOUGHT, HIDDEN]

    run(body)


def test_anthropic_whole_answer_keeps_its_thinking() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            answer = anthropic_whole("42", stop="end_turn")
            answer["content"] = [THOUGHT, HIDDEN, *answer["content"]]
            stub.script(Reply(body=answer))
            provider = anthropic(stub)
            done = await provider.complete(USER, {"model": "claude-x", "stream": False})
            await provider.aclose()
        assert done.text == "42" and [dict(b) for b in done.echoed] == [THOUGHT, HIDDEN]

    run(body)


def test_an_error_body_that_never_ends_is_read_only_in_part() -> None:
    """An error answer is quoted in part: its body is read up to `ERROR_BODY_BYTES_MAX`, so a
    server that sends an endless error body neither holds the call until the deadline nor fills
    memory."""
    from sessions.runtime._http import ERROR_TEXT_MAX

    async def body() -> None:
        async with StubServer() as stub:
            chunk = b"overloaded " * 6_000
            endless = Reply(status=500, raw=[chunk] * 20)  # 1.3 MB, past what is read
            endless.raw.append(3600.0)  # type: ignore[union-attr]  # then nothing, for an hour
            stub.script(endless)
            settings = HttpSettings(retries=0, read_timeout_s=30, total_timeout_s=20)
            provider = anthropic(stub, settings=settings)
            with pytest.raises(ProviderHTTPError) as caught:
                await asyncio.wait_for(provider.complete(USER, {"model": "claude-x"}), 10)
            await provider.aclose()
        assert caught.value.status == 500 and "overloaded" in str(caught.value)
        assert len(str(caught.value)) <= ERROR_TEXT_MAX + 200

    run(body)


def test_tool_calls_sharing_an_id_are_made_unique(store: SessionStore) -> None:
    """A reply whose calls share an id (some models and gateways repeat one): a call repeated
    word for word runs once, another under the same id gets its own, so each result answers
    one call and the next request holds no two calls of one id."""
    from sessions.runtime import Tool

    same = {"id": "call_0", "name": "read_file", "arguments": {"path": "a.txt"}}
    other = {"id": "call_0", "name": "read_file", "arguments": {"path": "b.txt"}}
    ran: list[str] = []

    async def body() -> None:
        async with StubServer() as stub:
            stub.script(
                Reply(
                    events=openai_stream([], tool_calls=[same, same, other], finish="tool_calls")
                ),
                Reply(events=openai_stream(["done"])),
            )
            tool = Tool(name="read_file", fn=lambda path: ran.append(path) or path)
            async with Runtime(store, providers=[openai(stub)], default_provider="openai") as rt:
                sid = (await rt.create("agent"))["session_id"]
                assert (await rt.prompt(sid, "read", tools=[tool]))["text"] == "done"
            sent = stub.requests[1].json["messages"]
        calls = [c["id"] for m in sent for c in m.get("tool_calls") or []]
        answers = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
        assert calls == ["call_0", "call_0#2"] and sorted(answers) == sorted(calls)
        assert sorted(ran) == ["a.txt", "b.txt"]

    run(body)


def test_an_openai_server_error_inside_a_stream_is_retried() -> None:
    async def body() -> None:
        async with StubServer() as stub:
            failed = [*openai_stream(["par"])[:1], (None, {"error": {"type": "server_error",
                                                                   "message": "try again"}})]  # fmt: skip
            stub.script(Reply(events=failed), Reply(events=openai_stream(["whole"])))
            provider = openai(stub)
            done = await provider.complete(USER, {"model": "m"})
            await provider.aclose()
        assert done.text == "whole" and len(stub.requests) == 2

    run(body)


SIGNED = {"google": {"thought_signature": "CrICAdHtim8-signature-of-the-thought"}}
"""What Gemini's OpenAI-compatible endpoint puts on a tool call: `extra_content`, which the next
request must carry back on that call unchanged."""


def test_gemini_thought_signature_goes_back_on_its_tool_call(store: SessionStore) -> None:
    """A streamed tool call carrying `extra_content` (in its first delta, without an index, as
    Gemini streams it) comes back on that call in the next request, and again when the
    transcript is sent from the store later."""
    from sessions.runtime import Tool

    events = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"tool_calls": [{"id": "fc_1", "type": "function", "extra_content": SIGNED,
                                "function": {"name": "lookup", "arguments": '{"q":'}}]}),
        _chunk({"tool_calls": [{"id": "", "function": {"arguments": ' "x"}'}}]}),
        _chunk({"tool_calls": [{"id": "fc_2", "type": "function",
                                "function": {"name": "lookup", "arguments": '{"q": "y"}'}}]}),
        _chunk({}, "tool_calls"),
        (None, "[DONE]"),
    ]  # fmt: skip

    async def body() -> None:
        async with StubServer() as stub:
            stub.script(Reply(events=events), Reply(events=openai_stream(["done"])))
            tool = Tool(name="lookup", fn=lambda q: f"found {q}", parameters={"type": "object"})
            provider = openai(stub)
            async with Runtime(store, providers=[provider], default_provider="openai") as rt:
                sid = (await rt.create("agent"))["session_id"]
                assert (await rt.prompt(sid, "find x", tools=[tool]))["text"] == "done"
            turn = stub.requests[1].json["messages"][1]
        assert turn["role"] == "assistant"
        first, second = turn["tool_calls"]
        assert first["id"] == "fc_1" and first["extra_content"] == SIGNED
        assert first["function"] == {"name": "lookup", "arguments": '{"q":"x"}'}
        assert second["id"] == "fc_2" and "extra_content" not in second
        (reply,) = [m for m in store.messages(sid) if m.get("tool_calls")]
        assert [call.get("extra_content") for call in reply["tool_calls"]] == [None, None]
        assert reply["metadata"]["provider_blocks"] == [
            {"type": "tool_call_extra_content", "tool_call_id": "fc_1", "extra_content": SIGNED}
        ]
        again = provider.request_body(store.messages(sid), {"model": "m"}, ())
        assert again["messages"][1]["tool_calls"][0]["extra_content"] == SIGNED

    run(body)


def test_gemini_whole_answer_keeps_its_thought_signature() -> None:
    answer = openai_whole(tool_calls=[CALLS[0]], finish="tool_calls")
    answer["choices"][0]["message"]["tool_calls"][0]["extra_content"] = SIGNED

    async def body() -> Any:
        async with StubServer() as stub:
            stub.script(Reply(body=answer))
            provider = openai(stub, stream=False)
            done = await provider.complete(USER, {"model": "gemini-x"})
            await provider.aclose()
            return done

    done = run(body)
    assert [dict(call) for call in done.tool_calls] == [CALLS[0]]
    assert [dict(block) for block in done.echoed] == [
        {"type": "tool_call_extra_content", "tool_call_id": "call_a", "extra_content": SIGNED}
    ]
