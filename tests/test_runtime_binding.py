"""Seed 002's own way of choosing a provider: ``create(agent_id, metadata={"provider": ...,
"runtimeParams": {...}})`` binds the session and sets its default parameters; the merge order
is provider defaults < session < prompt, as the provider receives them."""

from __future__ import annotations

import asyncio

import pytest

from eventlog import InvalidArgumentError
from sessions import SessionStore
from sessions.runtime import ConfigurationError, MockProvider, Runtime
from tests._runtime_providers import UsageProvider


def providers() -> tuple[MockProvider, UsageProvider]:
    defaults = {"model": "base", "temperature": 1.0, "provider_specific": {"a": 1, "b": 1}}
    return MockProvider(), UsageProvider("anthropic", defaults=defaults)


def test_metadata_binds_provider_and_session_params(store: SessionStore) -> None:
    mock, bound = providers()

    async def body() -> None:
        async with Runtime(store, providers=[mock, bound]) as runtime:
            created = await runtime.create(
                "multi-provider-agent",
                metadata={
                    "provider": "anthropic",
                    "runtimeParams": {
                        "model": "claude-sonnet",
                        "temperature": 0.7,
                        "maxTokens": 50,
                        "providerSpecific": {"b": 2},
                    },
                    "team": "blue",
                },
            )
            sid = created["session_id"]
            assert created["provider"] == "anthropic" and created["status"] == "active"
            await runtime.prompt(sid, "first")
            await runtime.prompt(sid, "second", {"temperature": 0.2, "provider_specific": {"c": 3}})
            state = store.snapshot(sid)
            assert state is not None
            assert state["metadata"]["provider"] == "anthropic"
            assert state["metadata"]["team"] == "blue"
            assert "runtimeParams" not in state["metadata"]

    asyncio.run(body())
    assert mock.calls == 0  # the default provider was never used
    first, second = (params for _, params in bound.seen)
    assert first == {
        "model": "claude-sonnet",
        "temperature": 0.7,
        "max_tokens": 50,
        "provider_specific": {"a": 1, "b": 2},
    }
    assert second["temperature"] == 0.2 and second["max_tokens"] == 50
    assert second["provider_specific"] == {"a": 1, "b": 2, "c": 3}


def test_unregistered_provider_is_refused_and_nothing_written(store: SessionStore) -> None:
    async def body() -> None:
        async with Runtime(store, providers=providers()) as runtime:
            with pytest.raises(ConfigurationError, match="`nope` is not registered"):
                await runtime.create("agent", metadata={"provider": "nope"})
            with pytest.raises(ConfigurationError, match="disagree"):
                await runtime.create("agent", provider="mock", metadata={"provider": "anthropic"})
            with pytest.raises(
                InvalidArgumentError,
                match=r"metadata.runtimeParams: runtime_params.temperature must be from 0.0 to 2.0",
            ):
                await runtime.create("agent", metadata={"runtimeParams": {"temperature": 9}})
            with pytest.raises(InvalidArgumentError, match="unknown runtime parameter 'colour'"):
                await runtime.create("agent", metadata={"runtimeParams": {"colour": "red"}})

    before = store.log.head
    asyncio.run(body())
    assert store.log.head == before


def test_delegate_with_metadata_provider(store: SessionStore) -> None:
    mock, bound = providers()

    async def body() -> None:
        async with Runtime(store, providers=[mock, bound]) as runtime:
            result = await runtime.delegate(
                "agent",
                "summarize",
                metadata={"provider": "anthropic", "runtimeParams": {"topK": 3}},
                runtime_params={"max_tokens": 9},
            )
            assert result["text"] == "len 9"
            assert (await runtime.record(result["session_id"])).provider == "anthropic"

    asyncio.run(body())
    ((_, params),) = bound.seen
    assert params["top_k"] == 3 and params["max_tokens"] == 9 and params["model"] == "base"


def test_keyword_params_override_metadata_params(store: SessionStore) -> None:
    mock, bound = providers()

    async def body() -> None:
        async with Runtime(store, providers=[mock, bound]) as runtime:
            sid = (
                await runtime.create(
                    "agent",
                    provider="anthropic",
                    runtime_params={"temperature": 0.4},
                    metadata={"provider": "anthropic", "runtimeParams": {"temperature": 0.9}},
                )
            )["session_id"]
            await runtime.prompt(sid, "hi")

    asyncio.run(body())
    assert bound.seen[0][1]["temperature"] == 0.4
