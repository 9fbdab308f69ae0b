"""Model providers: the protocol the runtime calls, the registry it looks them up in, and the
deterministic mock that is the embedded default.

A provider answers `await complete(messages, params)` with a `Completion`. The runtime records
what it returns; it never retries, reorders or rewrites a provider's answer. Nothing here touches
storage, and the mock touches no network.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from eventlog import InvalidArgumentError
from eventlog.errors import ConfigurationError
from sessions.runtime._params import check_params

Messages = list[dict[str, Any]]
"""A transcript's messages, as the runtime hands them to a provider."""
Params = Mapping[str, Any]
"""The runtime parameters merged from every layer (see `_params`)."""
ToolSpecs = Sequence[Mapping[str, Any]]
"""The tools a prompt offers: each with a name, a description and JSON-schema parameters."""


class ContextLengthError(Exception):
    """What a provider raises when the model refused the messages as longer than its context
    window: the runtime records the failure and prunes the context with the aggressive policy."""


@dataclass(frozen=True)
class Completion:
    """What a provider returns for one prompt.

    `usage` holds token counts by name: ``input_tokens``, ``output_tokens``, ``reasoning_tokens``,
    ``cache_read_tokens``, ``cache_write_tokens`` and, when the provider reports it,
    ``total_tokens``; missing counts are zero.
    """

    text: str
    stop_reason: str = "end_turn"
    tool_calls: Sequence[Mapping[str, Any]] = ()
    usage: Mapping[str, int] = field(default_factory=dict)
    model: str | None = None
    echoed: Sequence[Mapping[str, Any]] = ()
    """Blocks of the answer that the provider must be sent back, as they came, with this turn
    on the next request (Anthropic's `thinking` and `redacted_thinking` blocks and their
    signatures, which a tool loop with thinking enabled must return; a tool call's
    `extra_content` from an OpenAI-compatible server, where Gemini puts its thought signature):
    recorded in the reply's metadata under `ECHOED`, never shown as its text."""


ECHOED = "provider_blocks"
"""The metadata key of a reply's `Completion.echoed` blocks."""


@runtime_checkable
class Provider(Protocol):
    """A model behind the runtime. `defaults` are its lowest layer of runtime parameters."""

    name: str
    defaults: Mapping[str, Any]

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Completion:
        """Answer `messages` with `params`. A provider that can call tools also takes a
        keyword argument ``tools`` (a list of ``{name, description, parameters}``); the runtime
        passes it only when a prompt offers tools."""
        ...


class ProviderRegistry:
    """Providers by name. A session's provider is looked up once, when it is created."""

    def __init__(self, providers: Iterable[Provider] = ()) -> None:
        self._providers: dict[str, Provider] = {}
        for provider in providers:
            self.register(provider)

    def register(self, provider: Provider) -> None:
        if not isinstance(provider, Provider):
            raise ConfigurationError(
                "register: a provider needs `name`, `defaults` and an async `complete(messages, "
                f"params)`, got {type(provider).__name__}"
            )
        name = provider.name
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"register: a provider name must be a non-empty str: {name!r}")
        if name in self._providers:
            raise ConfigurationError(f"register: a provider named `{name}` is already registered")
        check_params(provider.defaults, f"provider `{name}` defaults")
        self._providers[name] = provider

    def get(self, name: str, where: str) -> Provider:
        found = self._providers.get(name)
        if found is None:
            known = ", ".join(sorted(self._providers)) or "none"
            raise ConfigurationError(
                f"{where}: provider `{name}` is not registered (registered: {known})"
            )
        return found

    def all(self) -> list[Provider]:
        return list(self._providers.values())

    def names(self) -> list[str]:
        return sorted(self._providers)

    def __contains__(self, name: object) -> bool:
        return name in self._providers


def _words(content: object) -> list[str]:
    if isinstance(content, str):
        return content.split()
    if isinstance(content, list):  # content blocks: count the text ones
        return [
            word
            for block in content
            if isinstance(block, Mapping) and isinstance(block.get("text"), str)
            for word in block["text"].split()
        ]
    return []


class MockProvider:
    """A deterministic provider with no network: the reply echoes the last user message, and
    usage counts words (input: every message sent, output: the reply).

    It honours `max_tokens` (the reply is cut to that many words, stop reason ``max_tokens``) and
    `stop_sequences` (the reply ends before the first one, stop reason ``stop_sequence``), so
    parameter merging can be seen in its answers. `reply` replaces the echo when given.
    """

    def __init__(
        self,
        name: str = "mock",
        *,
        defaults: Mapping[str, Any] | None = None,
        reply: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"MockProvider: name must be a non-empty str, got {name!r}")
        self.name = name
        self.defaults: Mapping[str, Any] = check_params(defaults, "MockProvider defaults")
        self._reply = reply
        self.calls = 0

    async def complete(
        self, messages: Messages, params: dict[str, Any], *, tools: ToolSpecs | None = None
    ) -> Completion:
        """The echo; `tools` are accepted and never called (the mock answers at once)."""
        self.calls += 1
        last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
        heard = " ".join(_words(last_user.get("content") if last_user else None))
        text = self._reply if self._reply is not None else f"mock reply to: {heard}"
        stop_reason = "end_turn"
        for stop in params.get("stop_sequences", ()):
            cut = text.find(stop)
            if cut >= 0:
                text, stop_reason = text[:cut], "stop_sequence"
        words = text.split()
        limit = params.get("max_tokens")
        if limit is not None and len(words) > limit:
            text, stop_reason = " ".join(words[:limit]), "max_tokens"
        usage = {
            "input_tokens": sum(len(_words(m.get("content"))) for m in messages),
            "output_tokens": len(text.split()),
        }
        return Completion(
            text=text, stop_reason=stop_reason, usage=usage, model=params.get("model", "mock-1")
        )
