"""Test providers for the runtime: one that fails, one that is slow (for cancel), one that reports
every usage field, and one that records what it was called with."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from sessions.runtime import Completion


class FailingProvider:
    def __init__(self, name: str = "failing") -> None:
        self.name = name
        self.defaults: Mapping[str, Any] = {}
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Completion:
        self.calls += 1
        raise RuntimeError("upstream 503")


class SlowProvider:
    """Answers only when `release` is set (or after `delay_s`); `entered` is set once called."""

    def __init__(self, name: str = "slow", delay_s: float | None = None) -> None:
        self.name = name
        self.defaults: Mapping[str, Any] = {}
        self.delay_s = delay_s
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = 0
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Completion:
        self.calls += 1
        self.entered.set()
        try:
            if self.delay_s is not None:
                await asyncio.sleep(self.delay_s)
            else:
                await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return Completion(text="slow answer", usage={"input_tokens": 1, "output_tokens": 2})


class UsageProvider:
    """Reports every usage field, derived from the prompt so totals can be predicted."""

    def __init__(self, name: str = "usage", defaults: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.defaults: Mapping[str, Any] = dict(defaults or {})
        self.seen: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Completion:
        self.seen.append((messages, params))
        size = len(str(messages[-1]["content"]))
        return Completion(
            text=f"len {size}",
            stop_reason="end_turn",
            tool_calls=[{"id": f"call-{size}", "name": "noop", "arguments": {}}],
            usage={
                "input_tokens": size,
                "output_tokens": 2,
                "reasoning_tokens": 3,
                "cache_read_tokens": 4,
                "cache_write_tokens": 5,
                "total_tokens": size + 5,
            },
            model=params.get("model", "usage-1"),
        )


def expected_usage(prompt: str) -> dict[str, int]:
    """What `UsageProvider` reports for a prompt (the prompt is the last message it sees)."""
    size = len(prompt)
    return {
        "input_tokens": size,
        "output_tokens": 2,
        "reasoning_tokens": 3,
        "cache_read_tokens": 4,
        "cache_write_tokens": 5,
        "total_tokens": size + 5,
    }
