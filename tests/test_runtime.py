"""The delegation runtime's verbs (seed 002): create, prompt, status, cancel, close, delegate,
expiry, capacity, providers and runtime parameters, on a real LMDB store in `tmp_path`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

from eventlog import CapacityError, InvalidArgumentError, LimitExceededError, UnknownSessionError
from eventlog import events as ev
from sessions import SessionStore
from sessions.runtime import (
    ConfigurationError,
    MockProvider,
    PromptCancelledError,
    ProviderError,
    Runtime,
    SessionBusyError,
    SessionFailedError,
    Tool,
)
from tests._runtime_providers import FailingProvider, SlowProvider, UsageProvider
from tests.conftest import assert_rebuild_changes_nothing


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())  # type: ignore[arg-type]


def events_of(store: SessionStore, sid: str) -> list[str]:
    return [envelope.type for envelope in store.log.read_stream(sid)]


def when(info: dict[str, Any], key: str = "created_at") -> datetime:
    return datetime.fromisoformat(info[key])


def test_create_prompt_status_close(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store) as runtime:
            info = await runtime.create("agent-1")
            sid = info["session_id"]
            assert info["status"] == "active" and info["agent_id"] == "agent-1"
            assert info["provider"] == "mock" and info["created_at"] is not None
            result = await runtime.prompt(sid, "list the files")
            assert result["text"] == "mock reply to: list the files"
            assert result["stop_reason"] == "end_turn"
            assert result["usage"]["input_tokens"] == 3 and result["usage"]["output_tokens"] == 6
            assert (await runtime.status(sid))["status"] == "idle"
            second = await runtime.prompt(sid, "and now?")
            assert second["request_id"] != result["request_id"]
            assert store.messages(sid) == [
                {"role": "user", "content": "list the files"},
                {
                    "role": "assistant",
                    "content": "mock reply to: list the files",
                    "usage": {"input_tokens": 3, "output_tokens": 6},
                    "model": "mock-1",
                },
                {"role": "user", "content": "and now?"},
                {
                    "role": "assistant",
                    "content": "mock reply to: and now?",
                    "usage": {"input_tokens": 11, "output_tokens": 5},
                    "model": "mock-1",
                },
            ]
            closed = await runtime.close(sid)
            assert closed == {
                "closed": True,
                "session_id": sid,
                "reason": "closed",
                "status": "idle",
            }
            with pytest.raises(UnknownSessionError, match="status: no session"):
                await runtime.status(sid)
            with pytest.raises(UnknownSessionError):
                await runtime.prompt(sid, "still there?")
        assert events_of(store, sid) == [
            "session_opened",
            "prompt_started",
            "prompt_completed",
            "prompt_started",
            "prompt_completed",
            "agent_session_closed",
        ]

    run(body)


def test_refused_create_writes_nothing(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store) as runtime:
            head = store.log.head
            with pytest.raises(ConfigurationError, match="provider `openai` is not registered"):
                await runtime.create("a", provider="openai")
            with pytest.raises(InvalidArgumentError, match="temperature must be from 0"):
                await runtime.create("a", runtime_params={"temperature": 2.5})
            with pytest.raises(InvalidArgumentError, match=r"'maxTokens' \('max_tokens'\?\)"):
                await runtime.create("a", runtime_params={"maxTokens": 5})
            with pytest.raises(InvalidArgumentError, match="scope"):
                await runtime.create("a", scope="forever")
            with pytest.raises(InvalidArgumentError, match="agent_id"):
                await runtime.create("")
            assert store.log.head == head

    run(body)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be an int > 0"),
        ({"top_p": 1.5}, "top_p must be from 0.0 to 1.0"),
        ({"top_k": -1}, "top_k must be an int > 0"),
        ({"temperature": float("nan")}, "must be a number"),
        ({"stop_sequences": "END"}, "must be a list of str"),
        ({"system_prompt": 7}, "must be a non-empty str"),
        ({"provider_specific": {1: 2}}, "dict with str keys"),
        ({"model": ""}, "must be a non-empty str"),
        ("temperature=1", "must be a dict"),
    ],
)
def test_runtime_params_are_validated(store: SessionStore, params: Any, message: str) -> None:
    async def body() -> None:
        async with Runtime(store) as runtime:
            sid = (await runtime.create("a"))["session_id"]
            head = store.log.head
            with pytest.raises(InvalidArgumentError, match=message):
                await runtime.prompt(sid, "hi", params)
            assert store.log.head == head

    run(body)


def test_too_many_stop_sequences_is_a_limit(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store) as runtime:
            with pytest.raises(LimitExceededError, match="stop_sequences_max"):
                await runtime.create("a", runtime_params={"stop_sequences": ["x"] * 17})

    run(body)


def test_params_merge_defaults_then_session_then_prompt(store: SessionStore) -> None:
    async def body() -> None:
        provider = UsageProvider(
            defaults={"model": "base", "temperature": 1.0, "provider_specific": {"a": 1, "b": 1}}
        )
        async with Runtime(store, providers=[provider], default_provider="usage") as runtime:
            sid = (
                await runtime.create(
                    "a",
                    runtime_params={"temperature": 0.5, "provider_specific": {"b": 2, "c": 2}},
                )
            )["session_id"]
            await runtime.prompt(
                sid,
                "go",
                {"max_tokens": 9, "temperature": None, "provider_specific": {"c": 3}},
            )
            record = await runtime.record(sid)
        want = {
            "model": "base",
            "temperature": 0.5,
            "max_tokens": 9,
            "provider_specific": {"a": 1, "b": 2, "c": 3},
        }
        assert provider.seen[0][1] == want
        assert record.loops[0]["config"] == want
        started = store.log.read_stream(sid)[1].data
        assert isinstance(started, ev.PromptStarted) and started.params == want

    run(body)


def test_mock_provider_honours_max_tokens_and_stop_sequences(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store) as runtime:
            sid = (await runtime.create("a", runtime_params={"max_tokens": 4}))["session_id"]
            cut = await runtime.prompt(sid, "one two three four")
            assert (cut["text"], cut["stop_reason"]) == ("mock reply to: one", "max_tokens")
            stopped = await runtime.prompt(sid, "alpha STOP beta", {"stop_sequences": ["STOP"]})
            assert (stopped["text"], stopped["stop_reason"]) == (
                "mock reply to: alpha ",
                "stop_sequence",
            )

    run(body)


def test_provider_is_fixed_at_create(store: SessionStore) -> None:
    async def body() -> None:
        usage = UsageProvider()
        registry = [MockProvider(), usage]
        async with Runtime(store, providers=registry) as runtime:
            sid = (await runtime.create("a", provider="usage"))["session_id"]
            assert (await runtime.status(sid))["provider"] == "usage"
            result = await runtime.prompt(sid, "abc")
            assert result["text"] == "len 3" and len(usage.seen) == 1
            assert store.snapshot(sid)["metadata"]["provider"] == "usage"  # type: ignore[index]
        async with Runtime(store, providers=[MockProvider()]) as other:
            with pytest.raises(ConfigurationError, match="provider `usage` is not registered"):
                await other.prompt(sid, "again")
            assert (await other.status(sid))["status"] == "idle"

    run(body)


def test_failing_provider_fails_the_session(store: SessionStore) -> None:
    async def body() -> None:
        failing = FailingProvider()
        async with Runtime(store, providers=[failing], default_provider="failing") as runtime:
            sid = (await runtime.create("a"))["session_id"]
            with pytest.raises(ProviderError, match="upstream 503") as caught:
                await runtime.prompt(sid, "hi")
            assert isinstance(caught.value.__cause__, RuntimeError)
            assert (await runtime.status(sid))["status"] == "failed"
            loop = (await runtime.record(sid)).loops[0]
            assert loop["status"] == "failed" and loop["error_kind"] == "provider"
            assert "upstream 503" in loop["error"]
            with pytest.raises(SessionFailedError, match="has failed"):
                await runtime.prompt(sid, "again")
            assert failing.calls == 1
            await runtime.close(sid)
        assert events_of(store, sid)[-2:] == ["prompt_failed", "agent_session_closed"]

    run(body)


def test_a_busy_session_refuses_a_second_prompt(store: SessionStore) -> None:
    async def body() -> None:
        slow = SlowProvider()
        async with Runtime(store, providers=[slow], default_provider="slow") as runtime:
            sid = (await runtime.create("a"))["session_id"]
            first = asyncio.create_task(runtime.prompt(sid, "one", request_id="r-1"))
            await slow.entered.wait()
            assert (await runtime.status(sid))["status"] == "busy"
            assert (await runtime.status(sid))["request_id"] == "r-1"
            head = store.log.head
            with pytest.raises(SessionBusyError, match="busy with request `r-1`"):
                await runtime.prompt(sid, "two")
            assert store.log.head == head
            slow.release.set()
            assert (await first)["text"] == "slow answer"
            assert (await runtime.status(sid))["status"] == "idle"

    run(body)


def test_two_concurrent_prompts_exactly_one_runs(store: SessionStore) -> None:
    async def body() -> None:
        slow = SlowProvider(delay_s=0.05)
        async with Runtime(store, providers=[slow], default_provider="slow") as runtime:
            sid = (await runtime.create("a"))["session_id"]
            outcomes = await asyncio.gather(
                runtime.prompt(sid, "one"), runtime.prompt(sid, "two"), return_exceptions=True
            )
            done = [o for o in outcomes if isinstance(o, dict)]
            refused = [o for o in outcomes if isinstance(o, SessionBusyError)]
            assert len(done) == 1 and len(refused) == 1 and slow.calls == 1
            assert events_of(store, sid).count("prompt_started") == 1

    run(body)


def test_the_store_decides_busy_even_without_the_runtime(store: SessionStore) -> None:
    """Two runtimes on one store do not see each other's flights: the write transaction does."""
    from sessions.runtime import _jobs

    async def body() -> None:
        async with Runtime(store) as runtime:
            sid = (await runtime.create("a"))["session_id"]
        message = ev.Message(role="user", content="x")
        no_defaults: Callable[[str], dict[str, Any]] = lambda name: {}  # noqa: E731
        loop = ("l-1", None, None)
        _jobs.start_prompt(store, sid, "r-1", message, no_defaults, {}, loop, [])
        with pytest.raises(SessionBusyError, match="r-1"):
            _jobs.start_prompt(store, sid, "r-2", message, no_defaults, {}, ("l-2", None, None), [])
        assert events_of(store, sid).count("prompt_started") == 1

    run(body)


def test_cancel_a_slow_prompt(store: SessionStore) -> None:
    async def body() -> None:
        slow = SlowProvider()
        async with Runtime(store, providers=[slow], default_provider="slow") as runtime:
            sid = (await runtime.create("a"))["session_id"]
            task = asyncio.create_task(runtime.prompt(sid, "long job", request_id="r-9"))
            await slow.entered.wait()
            assert await runtime.cancel(sid, "r-other") is False
            assert await runtime.cancel(sid, "r-9") is True
            with pytest.raises(PromptCancelledError, match="r-9"):
                await task
            assert slow.cancelled == 1
            assert (await runtime.status(sid))["status"] == "idle"
            loop = (await runtime.record(sid)).loops[0]
            assert loop["status"] == "cancelled" and loop["stop_reason"] == "cancelled"
            assert await runtime.cancel(sid, "r-9") is False  # finished: nothing to cancel
            with pytest.raises(UnknownSessionError):
                await runtime.cancel("nope", "r-9")
            slow.release.set()
            assert (await runtime.prompt(sid, "next"))["text"] == "slow answer"
        assert events_of(store, sid)[1:4] == [
            "prompt_started",
            "prompt_cancelled",
            "prompt_started",
        ]

    run(body)


def test_a_cancelled_caller_cancels_its_prompt(store: SessionStore) -> None:
    async def body() -> None:
        slow = SlowProvider()
        async with Runtime(store, providers=[slow], default_provider="slow") as runtime:
            sid = (await runtime.create("a"))["session_id"]
            task = asyncio.create_task(runtime.prompt(sid, "long job"))
            await slow.entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert slow.cancelled == 1
            assert (await runtime.status(sid))["status"] == "idle"
            assert (await runtime.record(sid)).loops[0]["status"] == "cancelled"

    run(body)


def test_close_cancels_a_running_prompt_and_calls_the_hooks(store: SessionStore) -> None:
    closed: list[tuple[str, str]] = []
    finished: list[Any] = []

    async def body() -> None:
        slow = SlowProvider()
        async with Runtime(
            store,
            providers=[slow],
            default_provider="slow",
            on_session_close=lambda sid, reason: closed.append((sid, reason)),
            after_task=finished.append,
        ) as runtime:
            sid = (await runtime.create("a"))["session_id"]
            task = asyncio.create_task(runtime.prompt(sid, "long"))
            await slow.entered.wait()
            assert (await runtime.close(sid))["status"] == "idle"  # cancelled first
            with pytest.raises(PromptCancelledError):
                await task
            assert closed == [(sid, "closed")]
            assert finished[0].session_id == sid and finished[0].loops[0]["status"] == "cancelled"
            with pytest.raises(UnknownSessionError):
                await runtime.close(sid)
        assert events_of(store, sid)[-2:] == ["prompt_cancelled", "agent_session_closed"]

    run(body)


def test_delegate_creates_prompts_and_closes(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store) as runtime:
            result = await runtime.delegate("helper", "summarize this", runtime_params={"top_k": 5})
            sid = result["session_id"]
            assert result["text"] == "mock reply to: summarize this"
            with pytest.raises(UnknownSessionError):
                await runtime.status(sid)
            record = await runtime.record(sid)
            assert record.formation["kind"] == "first_loop" and not record.open
            assert record.loops[0]["config"] == {"top_k": 5}
        assert events_of(store, sid)[-1] == "agent_session_closed"
        assert store.log.read_stream(sid)[-1].data == ev.AgentSessionClosed(
            reason="delegated", status={"reason": "delegated", "status": "idle"}
        )

    run(body)


def test_delegate_closes_the_session_when_the_prompt_fails(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store, providers=[FailingProvider()], default_provider="failing") as rt:
            with pytest.raises(ProviderError):
                await rt.delegate("helper", "x")
        opened = [e for e in store.log.read() if e.type == "session_opened"]
        assert len(opened) == 1
        assert events_of(store, opened[0].stream)[-1] == "agent_session_closed"

    run(body)


def test_reap_closes_expired_and_idle_sessions(store: SessionStore) -> None:
    closed: list[tuple[str, str]] = []

    async def body() -> None:
        slow = SlowProvider()
        async with Runtime(
            store,
            providers=[MockProvider(), slow],
            on_session_close=lambda sid, reason: closed.append((sid, reason)),
        ) as runtime:
            quiet = await runtime.create("a")
            busy = await runtime.create("b", provider="slow")
            task = asyncio.create_task(runtime.prompt(busy["session_id"], "long"))
            await slow.entered.wait()
            start = when(quiet)
            assert await runtime.reap(start + timedelta(minutes=9)) == []
            # Ten minutes on, the quiet session is idle; the busy one is not, whatever its age.
            assert await runtime.reap(start + timedelta(minutes=10, seconds=1)) == [
                {"session_id": quiet["session_id"], "reason": "idle"}
            ]
            assert (await runtime.status(busy["session_id"]))["status"] == "busy"
            reaped = await runtime.reap(when(busy) + timedelta(hours=1))
            assert reaped == [{"session_id": busy["session_id"], "reason": "expired"}]
            with pytest.raises(PromptCancelledError):
                await task
            with pytest.raises(InvalidArgumentError, match="timezone-aware"):
                await runtime.reap(datetime(2030, 1, 1))
        assert closed == [(quiet["session_id"], "idle"), (busy["session_id"], "expired")]

    run(body)


def test_reap_uses_the_configured_ttl_and_idle(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store, ttl_s=60, idle_s=30) as runtime:
            info = await runtime.create("a")
            await runtime.prompt(info["session_id"], "hi")
            last = when(await runtime.status(info["session_id"]), "last_activity_at")
            assert await runtime.reap(last + timedelta(seconds=29)) == []
            assert (await runtime.reap(when(info) + timedelta(seconds=60)))[0][
                "reason"
            ] == "expired"

    run(body)


def test_capacity_refuses_new_sessions(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store, max_sessions=2) as runtime:
            first = await runtime.create("a")
            await runtime.create("b", scope="ephemeral")
            head = store.log.head
            with pytest.raises(CapacityError, match="max_sessions = 2"):
                await runtime.create("c")
            assert store.log.head == head
            await runtime.close(first["session_id"])
            assert (await runtime.create("c"))["status"] == "active"

    run(body)


def test_ephemeral_sessions_live_in_memory_only(store: SessionStore) -> None:
    async def body() -> str:
        async with Runtime(store) as runtime:
            info = await runtime.create("a", scope="ephemeral")
            sid = info["session_id"]
            assert (await runtime.prompt(sid, "hi"))["text"] == "mock reply to: hi"
            assert (await runtime.status(sid))["scope"] == "ephemeral"
            assert not store.exists(sid) and store.log.head == 0
            assert runtime.ephemeral_store.exists(sid)
            return str(sid)

    sid = run(body)

    async def after_restart() -> None:
        async with Runtime(store) as runtime:
            with pytest.raises(UnknownSessionError):
                await runtime.status(sid)

    run(after_restart)


def test_configuration_errors(store: SessionStore) -> None:
    with pytest.raises(ConfigurationError, match="default_provider: provider `x`"):
        Runtime(store, default_provider="x")
    with pytest.raises(ConfigurationError, match="already registered"):
        Runtime(store, providers=[MockProvider(), MockProvider()])
    with pytest.raises(ConfigurationError, match="needs `name`, `defaults`"):
        Runtime(store, providers=[object()])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="must be callable"):
        Runtime(store, on_session_close="print")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="ttl_s"):
        Runtime(store, ttl_s=0)
    with pytest.raises(InvalidArgumentError, match="runtime is not started"):
        asyncio.run(Runtime(store).prompt("s", "hi"))


def test_a_session_opened_elsewhere_is_adopted_and_prompted(store: SessionStore) -> None:
    """A seeded or imported session is no runtime session until adopted; then prompts continue
    its transcript, with the adopted session-level parameters, and a rebuild agrees."""

    sid = store.open_session("seeded", system_prompt="be brief")
    store.inject_many(
        sid, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    )

    async def body() -> None:
        async with Runtime(store) as runtime:
            with pytest.raises(UnknownSessionError):
                await runtime.prompt(sid, "before adoption")
            with pytest.raises(UnknownSessionError):
                await runtime.adopt("no-such-session")
            with pytest.raises(ConfigurationError):
                await runtime.adopt(sid, provider="unregistered")
            with pytest.raises(InvalidArgumentError):
                await runtime.adopt(sid, runtime_params={"temperature": 9})
            assert events_of(store, sid)[-1] == "messages_injected"  # refusals wrote nothing
            info = await runtime.adopt(sid, agent_id="helper", runtime_params={"temperature": 0.5})
            assert info["status"] == "active" and info["provider"] == "mock"
            head = store.log.head
            assert (await runtime.adopt(sid))["provider"] == "mock"  # again: nothing new
            assert store.log.head == head
            result = await runtime.prompt(sid, "go on")
            assert result["text"] == "mock reply to: go on"
            started = [e for e in store.log.read_stream(sid) if e.type == "prompt_started"]
            assert started[-1].data.params["temperature"] == 0.5  # type: ignore[attr-defined]
            assert (await runtime.status(sid))["status"] == "idle"
            contents = [m["content"] for m in store.snapshot(sid)["transcript"]]  # type: ignore[index]
            assert contents == ["hi", "yo", "go on", "mock reply to: go on"]

    run(body)
    assert_rebuild_changes_nothing(store)


class _LoopingProvider:
    """From its second call on, asks for the same tool call three times over: a doom loop."""

    name = "looping"
    defaults: ClassVar[dict[str, Any]] = {}

    async def complete(
        self, messages: list[dict[str, Any]], params: dict[str, Any], *, tools: Any = None
    ) -> Any:
        from sessions.runtime import Completion

        repeats = 1 if len(messages) < 3 else 3
        calls = [{"id": f"c{i}", "name": "ls", "arguments": {"path": "."}} for i in range(repeats)]
        return Completion(text="", stop_reason="tool_use", tool_calls=calls)


class _TooLongOnceProvider:
    name = "too-long-once"
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Any:
        from sessions.runtime import Completion, ContextLengthError

        self.calls += 1
        if self.calls == 1:
            raise ContextLengthError("prompt is too long: 9,000 tokens > 8,000")
        return Completion(text="fits now")


def test_the_runtime_runs_the_context_policy_after_each_turn(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store, providers=[MockProvider(), _LoopingProvider()]) as runtime:
            sid = (await runtime.create("a", provider="looping"))["session_id"]
            ls = Tool("ls", lambda path: ["a.txt"])
            for turn in range(2):  # each asks once for one call, once for three: max_steps
                await runtime.prompt(sid, f"turn {turn}", tools=[ls], max_steps=2)
                warned = [
                    m
                    for m in store.snapshot(sid)["transcript"]  # type: ignore[index]
                    if "doom_loop" in (m.get("metadata") or {})
                ]
                assert len(warned) == turn, turn  # none after one call, one after three
            assert "doom_loop_detected" in events_of(store, sid)

    run(body)


def test_a_context_length_error_prunes_aggressively_and_the_session_goes_on(
    tmp_path: Path,
) -> None:
    from sessions import ContextPolicy

    policy = ContextPolicy(window_tokens=8_000)
    with SessionStore.open(tmp_path / "s", context_policy=policy) as store:
        sid = store.open_session("big")
        store.inject_many(
            sid,
            [
                {"role": "user", "content": "read the log"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "name": "cat"}]},
                {"role": "tool", "tool_call_id": "t1", "content": "x" * 20_000},
                *[{"role": "assistant", "content": f"note {i}"} for i in range(3)],
            ],
        )
        provider = _TooLongOnceProvider()

        async def body() -> None:
            async with Runtime(store, providers=[MockProvider(), provider]) as runtime:
                await runtime.adopt(sid, provider="too-long-once")
                with pytest.raises(ProviderError, match="too long"):
                    await runtime.prompt(sid, "summarize it")
                assert (await runtime.status(sid))["status"] == "idle"  # not failed
                assert "context_pruned" in events_of(store, sid)
                assert (await runtime.prompt(sid, "again"))["text"] == "fits now"

        run(body)
        failed = [e for e in store.log.read_stream(sid) if e.type == "prompt_failed"]
        assert failed[0].data.kind == "context_length"  # type: ignore[attr-defined]
        contents = [m["content"] for m in store.context(sid)]
        assert "x" * 20_000 not in contents  # pruned in the view
        assert "x" * 20_000 in [m["content"] for m in store.messages(sid)]  # kept in history
