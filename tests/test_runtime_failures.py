"""How a prompt ends when something goes wrong in the agent loop: a transient provider failure
leaves the session usable, a fatal one fails it; a reply carrying tool calls nobody offered leaves
no call without a result; a reply the log cannot record fails the prompt instead of leaving the
session busy; a cancel landing between two awaits stops the loop, and `cancel` reports what was
recorded; no failure text holds an API key. HTTP providers talk to stub servers on loopback."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from eventlog import LimitExceededError
from eventlog import events as ev
from sessions import SessionStore
from sessions.runtime import (
    AnthropicProvider,
    Completion,
    HttpSettings,
    OpenAIProvider,
    PromptCancelledError,
    ProviderError,
    Runtime,
    SessionFailedError,
    Tool,
    _limits,
)
from tests._model_stubs import Reply, StubServer, anthropic_stream, openai_stream
from tests._runtime_providers import ScriptedProvider, calls

KEY = "sk-test-0123456789abcdefSECRET"
FAST = HttpSettings(backoff_s=0.01, connect_timeout_s=2.0, read_timeout_s=0.3, retries=2)
"""Two retries: each transient case below scripts three failed answers."""


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())  # type: ignore[arg-type]


def openai(stub: StubServer, **options: Any) -> OpenAIProvider:
    return OpenAIProvider(base_url=stub.url, api_key=KEY, defaults={"model": "gpt-stub"}, **options)


def anthropic(stub: StubServer, **options: Any) -> AnthropicProvider:
    return AnthropicProvider(
        base_url=stub.url, api_key=KEY, defaults={"model": "claude-stub"}, **options
    )


def failures(store: SessionStore, sid: str) -> list[ev.PromptFailed]:
    return [e.data for e in store.log.read_stream(sid) if isinstance(e.data, ev.PromptFailed)]


def overloaded() -> Reply:
    return Reply(status=529, body={"type": "error", "error": {"type": "overloaded_error"}})


TRANSIENT = {
    "429": lambda: Reply(status=429, body={"error": {"message": "slow"}}, headers={"retry-after": "0"}),
    "529": overloaded,
    "read_timeout": lambda: Reply(delay_s=2.0, body={}),
    "dropped_stream": lambda: Reply(events=openai_stream(["half"]), drop_after=2),
}  # fmt: skip


# Transient and fatal provider failures


@pytest.mark.parametrize("case", sorted(TRANSIENT))
def test_a_transient_failure_leaves_the_session_idle(store: SessionStore, case: str) -> None:
    """Retries spent on a failure that may pass: the loop failed (kind ``transient``), the
    session did not, and once the API is back the next prompt is answered."""

    async def body() -> tuple[str, dict[str, Any]]:
        async with StubServer() as stub:
            stub.script(
                *(TRANSIENT[case]() for _ in range(3)), Reply(events=openai_stream(["back"]))
            )
            provider = openai(stub, settings=FAST)
            async with Runtime(store, providers=[provider], default_provider="openai") as rt:
                sid = (await rt.create("agent"))["session_id"]
                with pytest.raises(ProviderError) as caught:
                    await rt.prompt(sid, "hello")
                assert len(stub.requests) == 3
                status = await rt.status(sid)
                assert (status["status"], status["request_id"]) == ("idle", None)
                assert "(transient)" in str(caught.value)
                assert (await rt.prompt(sid, "hello again"))["text"] == "back"
                loops = (await rt.record(sid)).loops
                return str(sid), loops[0]

    sid, first = run(body)
    assert (first["status"], first["error_kind"]) == ("failed", "transient")
    assert [f.kind for f in failures(store, sid)] == ["transient"]


@pytest.mark.parametrize("status", [401, 403, 400])
def test_auth_errors_and_bad_requests_still_fail_the_session(
    store: SessionStore, status: int
) -> None:
    async def body() -> str:
        async with StubServer() as stub:
            stub.script(Reply(status=status, body={"error": {"message": "no"}}))
            provider = openai(stub, settings=FAST)
            async with Runtime(store, providers=[provider], default_provider="openai") as rt:
                sid = (await rt.create("agent"))["session_id"]
                with pytest.raises(ProviderError, match=f"HTTP {status}"):
                    await rt.prompt(sid, "hello")
                assert (await rt.status(sid))["status"] == "failed"
                with pytest.raises(SessionFailedError):
                    await rt.prompt(sid, "again")
                return str(sid)

    assert [f.kind for f in failures(store, run(body))] == ["provider"]


# Tool calls when no tools were offered


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_tool_calls_without_tools_offered_leave_no_orphan_call(
    store: SessionStore, api: str
) -> None:
    """The calls stay out of the transcript (kept in the reply's metadata): the next request
    holds no call without its result, and no `tool_use` block in a request without tools."""
    call = {"id": "call_X", "name": "search", "arguments": {"q": "x"}}

    async def body() -> tuple[str, list[Any], dict[str, Any]]:
        async with StubServer() as stub:
            if api == "openai":
                stub.script(
                    Reply(events=openai_stream([], tool_calls=[call], finish="tool_calls")),
                    Reply(events=openai_stream(["ok"])),
                )
                provider: Any = openai(stub)
            else:
                stub.script(
                    Reply(events=anthropic_stream([], tool_calls=[call], stop="tool_use")),
                    Reply(events=anthropic_stream(["ok"])),
                )
                provider = anthropic(stub)
            async with Runtime(store, providers=[provider], default_provider=api) as rt:
                sid = (await rt.create("agent"))["session_id"]
                first = await rt.prompt(sid, "hello")  # no tools offered
                assert (await rt.prompt(sid, "next"))["text"] == "ok"
            return str(sid), stub.requests[-1].json["messages"], first

    sid, sent, first = run(body)
    assert "call_X" not in json.dumps(sent)
    assert first["tool_calls"] == []
    assert all(not m.get("tool_calls") for m in store.messages(sid))
    reply = next(m for m in store.messages(sid) if m["role"] == "assistant")
    assert reply["metadata"]["dropped_tool_calls"][0]["id"] == "call_X"


# A reply the log cannot record


def huge_reply() -> Reply:
    return Reply(events=openai_stream(["é" * 50_000] * 50))  # 5 MB: over event_bytes_max


def test_a_reply_too_large_to_record_fails_the_prompt_not_stuck_busy(store: SessionStore) -> None:
    async def body() -> str:
        async with StubServer() as stub:
            stub.script(huge_reply())
            async with Runtime(store, providers=[openai(stub)], default_provider="openai") as rt:
                sid = (await rt.create("agent"))["session_id"]
                with pytest.raises(ProviderError, match="reply_bytes_max") as caught:
                    await rt.prompt(sid, "hello", request_id="r1")
                assert isinstance(caught.value.__cause__, LimitExceededError)
                status = await rt.status(sid)
                assert (status["status"], status["request_id"]) == ("failed", None)
                assert await rt.cancel(sid, "r1") is False
                with pytest.raises(SessionFailedError):
                    await rt.prompt(sid, "again")
                return str(sid)

    sid = run(body)
    assert [f.kind for f in failures(store, sid)] == ["invalid_reply"]


def test_a_completion_the_log_refuses_is_recorded_as_failed(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the size check (raised here), the append itself fails: still `prompt_failed`."""
    monkeypatch.setattr(_limits, "reply_bytes_max", 10**9, raising=False)

    async def body() -> str:
        async with StubServer() as stub:
            stub.script(huge_reply(), Reply(events=openai_stream(["x"])))
            async with Runtime(store, providers=[openai(stub)], default_provider="openai") as rt:
                sid = (await rt.create("agent"))["session_id"]
                with pytest.raises(ProviderError, match="cannot be recorded") as caught:
                    await rt.prompt(sid, "hello")
                assert isinstance(caught.value.__cause__, LimitExceededError)
                status = await rt.status(sid)
                assert (status["status"], status["request_id"]) == ("failed", None)
                return str(sid)

    sid = run(body)
    assert [f.kind for f in failures(store, sid)] == ["invalid_reply"]


def endless_line(events: bool) -> Reply:
    """An event stream whose one line never ends: more than `sse_line_bytes_max` bytes without a
    newline, then silence for an hour. With `events`, the bytes come as many `data:` lines of
    one event that never ends instead, each line short."""
    piece = 1024 * 1024
    count = _limits.sse_line_bytes_max // piece + 2
    line = b"data: " + b"x" * (piece - 8) + b"\n" if events else b"x" * piece
    return Reply(raw=[b"data: ", *([line] * count), 3600.0])


@pytest.mark.parametrize("events", [False, True], ids=["one-line", "one-event"])
@pytest.mark.parametrize("which", ["openai", "anthropic"])
def test_an_endless_stream_line_fails_the_prompt_at_its_bound(
    store: SessionStore, which: str, events: bool
) -> None:
    """A server that streams one line (or one event's data) without end is cut off once it is
    past `sse_line_bytes_max`, not buffered until `total_timeout_s`: the prompt fails as an
    invalid reply, and the call is not retried as a dropped stream."""

    async def body() -> str:
        async with StubServer() as stub:
            stub.script(endless_line(events), Reply(events=openai_stream(["never asked"])))
            settings = HttpSettings(retries=2, read_timeout_s=30.0, total_timeout_s=60.0)
            provider = (openai if which == "openai" else anthropic)(stub, settings=settings)
            async with Runtime(store, providers=[provider], default_provider=which) as rt:
                sid = (await rt.create("agent"))["session_id"]
                with pytest.raises(ProviderError, match="sse_line_bytes_max") as caught:
                    await asyncio.wait_for(rt.prompt(sid, "hello"), 20)
                assert isinstance(caught.value.__cause__, LimitExceededError)
                assert caught.value.__cause__.limit == _limits.sse_line_bytes_max
            assert len(stub.requests) == 1
            return str(sid)

    sid = run(body)
    assert [f.kind for f in failures(store, sid)] == ["invalid_reply"]


# A cancel landing between two guarded awaits


def test_a_cancel_while_the_step_is_written_runs_no_tool(store: SessionStore) -> None:
    """The cancel lands just after the model asked for a tool, while its step is written: the
    tool never runs, its call is answered as cancelled, and `cancel` says so."""
    ran: list[str] = []
    pending: list[asyncio.Task[bool]] = []

    async def send_email(to: str) -> str:
        ran.append(to)
        return "sent"

    async def body() -> str:
        def answer(messages: list[dict[str, Any]]) -> Completion:
            loop = asyncio.get_running_loop()
            loop.call_soon(lambda: pending.append(loop.create_task(rt.cancel(sid, "r1"))))
            return calls(("send_email", {"to": "boss"}))

        provider = ScriptedProvider([answer, Completion(text="sent it")])
        async with Runtime(store, providers=[provider], default_provider="scripted") as rt:
            sid = (await rt.create("agent"))["session_id"]
            tool = Tool(name="send_email", fn=send_email)
            with pytest.raises(PromptCancelledError):
                await rt.prompt(sid, "email my boss", request_id="r1", tools=[tool])
            assert await pending[0] is True
            assert len(provider.seen) == 1
            assert (await rt.status(sid))["status"] == "idle"
            return str(sid)

    sid = run(body)
    assert ran == []
    types = [e.type for e in store.log.read_stream(sid)]
    assert "prompt_cancelled" in types and "prompt_completed" not in types
    (result,) = [m for m in store.messages(sid) if m["role"] == "tool"]
    assert result["tool_call_id"] == "c1" and result["metadata"]["tool_error"] == "cancelled"


def test_a_cancel_during_after_step_ends_the_loop(store: SessionStore) -> None:
    """The cancel lands while `after_step` (or the context policy) runs after a round of tool
    results: the model is not called again and the prompt is recorded cancelled."""
    pending: list[asyncio.Task[bool]] = []

    async def body() -> tuple[str, dict[str, Any]]:
        async def after_step(info: dict[str, Any]) -> None:
            if info["step"] == 1:
                pending.append(asyncio.ensure_future(rt.cancel(sid, "r1")))
                await asyncio.sleep(0.05)

        provider = ScriptedProvider([calls(("look", {})), Completion(text="after the cancel")])
        async with Runtime(
            store, providers=[provider], default_provider="scripted", after_step=after_step
        ) as rt:
            sid = (await rt.create("agent"))["session_id"]
            tool = Tool(name="look", fn=lambda: "seen")
            with pytest.raises(PromptCancelledError):
                await rt.prompt(sid, "go", request_id="r1", tools=[tool])
            assert await pending[0] is True
            assert len(provider.seen) == 1
            return str(sid), (await rt.record(sid)).loops[0]

    sid, loop = run(body)
    assert (loop["status"], loop["stop_reason"]) == ("cancelled", "cancelled")
    assert "after the cancel" not in json.dumps(store.messages(sid))


def test_cancel_returns_false_when_the_prompt_completed_first(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel lands after `prompt_completed` is written (while the context policy runs): the
    prompt is answered, and `cancel` reports that nothing was cancelled."""
    entered, release = threading.Event(), threading.Event()
    maintain = store.maintain_context

    def slow_maintain(sid: str, **options: Any) -> Any:
        entered.set()
        release.wait(10)
        return maintain(sid, **options)

    monkeypatch.setattr(store, "maintain_context", slow_maintain)

    async def body() -> str:
        async with Runtime(store) as rt:
            sid = (await rt.create("agent"))["session_id"]
            prompt = asyncio.ensure_future(rt.prompt(sid, "hello", request_id="r1"))
            await asyncio.to_thread(entered.wait, 10)
            cancel = asyncio.ensure_future(rt.cancel(sid, "r1"))
            await asyncio.sleep(0.05)
            release.set()
            assert (await prompt)["text"] == "mock reply to: hello"
            assert await cancel is False
            return str(sid)

    sid = run(body)
    types = [e.type for e in store.log.read_stream(sid)]
    assert "prompt_completed" in types and "prompt_cancelled" not in types


# API keys in failure text


class EchoingProvider(OpenAIProvider):
    """Reads an answer the way a careless provider might: its error carries the key."""

    async def read_answer(self, resp: Any, where: str) -> Completion:
        raise RuntimeError(f"{where}: upstream said: Authorization: Bearer {KEY}")


def test_no_failure_text_holds_the_api_key(tmp_path: Path) -> None:
    """Whatever a provider's error holds, the runtime records and raises it without the key: an
    error event in a stream echoing it, and a provider that does not scrub at all."""
    echo = f"Invalid credentials: Bearer {KEY}"
    texts: list[str] = []

    async def body(store: SessionStore) -> None:
        async with StubServer() as stub:
            stub.script(
                Reply(events=[(None, {"error": {"code": "invalid_api_key", "message": echo}})]),
                Reply(events=openai_stream(["never read"])),
            )
            echoing = EchoingProvider(
                "echoing", base_url=stub.url, api_key=KEY, defaults={"model": "m"}
            )
            providers = [openai(stub, settings=FAST), echoing]
            async with Runtime(store, providers=providers, default_provider="openai") as rt:
                for name in ("openai", "echoing"):
                    sid = (await rt.create("agent", provider=name))["session_id"]
                    with pytest.raises(ProviderError) as caught:
                        await rt.prompt(sid, "hello")
                    texts.append(str(caught.value))
                    texts.append(json.dumps((await rt.record(sid)).loops))

    path = tmp_path / "store"
    with SessionStore.open(path) as store:
        run(lambda: body(store))
    assert len(texts) == 4 and all("[redacted]" in text for text in texts)
    assert all(KEY not in text for text in texts)
    stored = [item for item in path.rglob("*") if item.is_file()]
    assert stored and all(KEY.encode() not in item.read_bytes() for item in stored)
