"""Test providers for the runtime: one that fails, one that is slow (for cancel), one that reports
every usage field, and one that records what it was called with."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
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
        prompt = str(messages[-1]["content"])
        size = len(prompt)
        return Completion(
            text=f"len {size}",
            stop_reason="end_turn",
            tool_calls=[{"id": f"call-{size}", "name": "noop", "arguments": {}}],
            usage=expected_usage(prompt),
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


class ScriptedProvider:
    """Answers with `script[i]` on its i-th call (a `Completion`, or a function of the messages
    returning one); past the end, the last entry again. Records every call's messages and
    tools."""

    def __init__(
        self,
        script: Sequence[Completion | Callable[[list[dict[str, Any]]], Completion]],
        name: str = "scripted",
    ) -> None:
        self.name = name
        self.defaults: Mapping[str, Any] = {}
        self.script = list(script)
        self.seen: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []

    async def complete(
        self,
        messages: list[dict[str, Any]],
        params: dict[str, Any],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Completion:
        self.seen.append((messages, None if tools is None else [dict(t) for t in tools]))
        entry = self.script[min(len(self.seen), len(self.script)) - 1]
        return entry if isinstance(entry, Completion) else entry(messages)


def calls(*pairs: tuple[str, dict[str, Any]], prefix: str = "c") -> Completion:
    """A completion asking for the tool calls `(name, arguments)`, ids `prefix`1, 2, ..."""
    return Completion(
        text="",
        stop_reason="tool_use",
        tool_calls=[
            {"id": f"{prefix}{i}", "name": name, "arguments": args}
            for i, (name, args) in enumerate(pairs, 1)
        ],
        usage={"input_tokens": 10, "output_tokens": 2},
    )


FINAL_ANSWER = Completion(text="all done", usage={"input_tokens": 30, "output_tokens": 3})
