"""Seed 002's bridge over a `Runtime`: the eight tools with exactly the seed's argument and result
shapes (camelCase, times in epoch milliseconds), and every failure as a `BridgeError` with a code.

Codes: ``CONFIG`` (an unregistered provider, a provider that cannot take the agent's tools),
``AGENT_NOT_FOUND``, ``SESSION_NOT_FOUND`` (unknown, closed or expired: "Session not found"),
``SESSION_BUSY``, ``SESSION_FAILED``, ``CAPACITY`` (max sessions), ``INVALID_ARGUMENT``,
``INPUT_REJECTED``, ``CANCELLED``, ``PROVIDER_ERROR``, ``LEASE_LOST`` (the runtime lost its store's
lease and stopped writing), ``REQUEST_CONFLICT`` (a `requestId` the session already ran with
another prompt), ``RUNTIME_STOPPED`` (the runtime is shutting down and the request has no
outcome recorded). A `requestId` is idempotent per session, as an `Idempotency-Key` is over HTTP:
a retry answers the first run's outcome and calls no model. Nothing here knows MCP; `_server.py`
puts it on the wire.

Every tool that names a session takes the `Caller` and applies the REST service's access rules
(`service/_access.py`): a session the caller may not see is "Session not found", word for word as
an unknown one, and a new session is stamped with its creator. Must never trust a client's
metadata to name an owner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from eventlog import CapacityError, InvalidArgumentError, LeaseLostError, UnknownSessionError
from eventlog.errors import ConfigurationError
from service._access import Caller, check_visible, owned_metadata
from service.mcp._config import Agent, BridgeConfig
from sessions.runtime import (
    InputRejectedError,
    PromptCancelledError,
    ProviderError,
    RequestConflictError,
    Runtime,
    RuntimeStoppedError,
    SessionBusyError,
    SessionFailedError,
    wire_params,
)

T = TypeVar("T")

LOCAL = Caller("local", admin=True, all_sessions=True)
"""The one user of a bridge on stdio: whoever started the process holds the store itself, so it
sees every session and its metadata is recorded as given, as an API key's is over HTTP."""


class BridgeError(Exception):
    """A tool call the bridge refused or could not complete: `code` says which kind."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (UnknownSessionError, "SESSION_NOT_FOUND"),
    (ConfigurationError, "CONFIG"),
    (SessionBusyError, "SESSION_BUSY"),
    (RequestConflictError, "REQUEST_CONFLICT"),
    (SessionFailedError, "SESSION_FAILED"),
    (RuntimeStoppedError, "RUNTIME_STOPPED"),
    (CapacityError, "CAPACITY"),
    (InputRejectedError, "INPUT_REJECTED"),
    (PromptCancelledError, "CANCELLED"),
    (ProviderError, "PROVIDER_ERROR"),
    (InvalidArgumentError, "INVALID_ARGUMENT"),
    (LeaseLostError, "LEASE_LOST"),
)


async def _guarded(call: Awaitable[T]) -> T:
    """The runtime's errors as `BridgeError`s (ConfigurationError before InvalidArgumentError,
    its base)."""
    try:
        return await call
    except UnknownSessionError as exc:
        # The id alone, never the verb nor whether it was closed: a session the caller may not
        # see must read exactly as one that never was.
        raise BridgeError("SESSION_NOT_FOUND", f"Session not found: {exc.session_id}") from None
    except BridgeError:
        raise
    except Exception as exc:
        for kind, code in _CODES:
            if isinstance(exc, kind):
                raise BridgeError(code, str(exc)) from None
        raise


def _millis(stamp: object) -> int | None:
    if not isinstance(stamp, str):
        return None
    return int(datetime.fromisoformat(stamp).timestamp() * 1000)


def _usage(usage: Mapping[str, int]) -> dict[str, int]:
    return {
        "inputTokens": usage.get("input_tokens", 0),
        "outputTokens": usage.get("output_tokens", 0),
    }


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise BridgeError("INVALID_ARGUMENT", f"`{name}` must be a non-empty string")
    return value


def _object(value: object, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BridgeError("INVALID_ARGUMENT", f"`{name}` must be an object")
    return dict(value)


class Bridge:
    """The seed's tools over one started `Runtime` whose providers include every agent's
    (`runtime_providers(config)`)."""

    def __init__(self, runtime: Runtime, config: BridgeConfig) -> None:
        self.runtime = runtime
        self.config = config
        self._agent_of: dict[str, str] = {}

    def _agent(self, agent_id: object) -> Agent:
        found = self.config.agents.get(_text(agent_id, "agentId"))
        if found is None:
            known = ", ".join(sorted(self.config.agents))
            raise BridgeError("AGENT_NOT_FOUND", f"Agent not found: {agent_id} (known: {known})")
        return found

    async def health(self) -> dict[str, Any]:
        counts = await self.runtime.open_sessions()
        return {"status": "ok", "agents": len(self.config.agents), "sessions": counts}

    async def discover(self) -> dict[str, Any]:
        return {
            "agents": [
                {
                    "agentId": agent.id,
                    "description": agent.description,
                    "providers": list(agent.providers),
                    "defaultProvider": agent.default_provider,
                    "tools": [tool.name for tool in agent.tools],
                }
                for agent in self.config.agents.values()
            ]
        }

    def _binding(self, agent: Agent, metadata: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The runtime name of the session's provider, and the metadata to record."""
        chosen = metadata.pop("provider", None) or agent.default_provider
        if not isinstance(chosen, str) or chosen not in agent.providers:
            raise BridgeError(
                "CONFIG",
                f"provider {chosen!r} is not registered for agent {agent.id!r} "
                f"(registered: {', '.join(agent.providers)})",
            )
        return agent.runtime_name(chosen), {**metadata, "providerId": chosen}

    async def _visible(self, caller: Caller, session_id: object, verb: str) -> str:
        """`session_id`, if `caller` may see it; else "Session not found" as for an unknown id.
        Bridge sessions live in the runtime's persistent store, where their owner is recorded."""
        sid = _text(session_id, "sessionId")
        if not caller.all_sessions:
            store = self.runtime.store
            await _guarded(asyncio.to_thread(check_visible, store, caller, sid, verb))
        return sid

    async def create(
        self, caller: Caller, agent_id: object, metadata: object = None
    ) -> dict[str, Any]:
        agent = self._agent(agent_id)
        try:
            given = owned_metadata(caller, _object(metadata, "metadata")) or {}
        except InvalidArgumentError as exc:
            raise BridgeError("INVALID_ARGUMENT", str(exc)) from None
        provider, recorded = self._binding(agent, given)
        created = await _guarded(
            self.runtime.create(agent.id, provider=provider, metadata=recorded)
        )
        self._agent_of[created["session_id"]] = agent.id
        return {
            "sessionId": created["session_id"],
            "agentId": agent.id,
            "status": created["status"],
        }

    async def _session_agent(self, session_id: str) -> Agent:
        known = self._agent_of.get(session_id)
        if known is None:
            known = (await _guarded(self.runtime.status(session_id)))["agent_id"]
        found = self.config.agents.get(str(known))
        if found is None:
            raise BridgeError("CONFIG", f"session {session_id} belongs to no agent of this bridge")
        return found

    async def prompt(
        self,
        caller: Caller,
        session_id: object,
        prompt: object,
        runtime_params: object = None,
        request_id: object = None,
    ) -> dict[str, Any]:
        sid = await self._visible(caller, session_id, "prompt")
        agent = await self._session_agent(sid)
        params = _params(runtime_params)
        result = await _guarded(self._run(agent, sid, _text(prompt, "prompt"), params, request_id))
        return {
            "text": result["text"],
            "stopReason": result["stop_reason"],
            "requestId": result["request_id"],
            "usage": _usage(result["usage"]),
        }

    def _run(
        self, agent: Agent, sid: str, prompt: str, params: dict[str, Any], request_id: object
    ) -> Awaitable[dict[str, Any]]:
        if request_id is not None and not isinstance(request_id, str):
            raise BridgeError("INVALID_ARGUMENT", "`requestId` must be a string")
        options: dict[str, Any] = {"request_id": request_id}
        if agent.tools:
            options.update(tools=agent.tools, max_steps=self.config.max_steps)
        return self.runtime.prompt(sid, prompt, params, **options)

    async def status(self, caller: Caller, session_id: object) -> dict[str, Any]:
        sid = await self._visible(caller, session_id, "status")
        info = await _guarded(self.runtime.status(sid))
        return {
            "sessionId": info["session_id"],
            "agentId": info["agent_id"],
            "status": info["status"],
            "createdAt": _millis(info["created_at"]),
            "lastActivityAt": _millis(info["last_activity_at"]),
        }

    async def cancel(
        self, caller: Caller, session_id: object, request_id: object = None
    ) -> dict[str, Any]:
        sid = await self._visible(caller, session_id, "cancel")
        rid = request_id
        if rid is None:  # an extension of the seed: whatever is running
            rid = (await _guarded(self.runtime.status(sid)))["request_id"]
            if rid is None:
                return {"cancelled": False, "sessionId": sid, "requestId": None}
        cancelled = await _guarded(self.runtime.cancel(sid, _text(rid, "requestId")))
        return {"cancelled": cancelled, "sessionId": sid, "requestId": rid}

    async def close(self, caller: Caller, session_id: object) -> dict[str, Any]:
        sid = await self._visible(caller, session_id, "close")
        await _guarded(self.runtime.close(sid))
        self._agent_of.pop(sid, None)
        return {"closed": True, "sessionId": sid}

    async def delegate(
        self,
        caller: Caller,
        agent_id: object,
        prompt: object,
        metadata: object = None,
        runtime_params: object = None,
    ) -> dict[str, Any]:
        """Create, prompt once, close (also when the prompt failed)."""
        created = await self.create(caller, agent_id, metadata)
        sid = created["sessionId"]
        try:
            result = await self.prompt(caller, sid, prompt, runtime_params)
        finally:
            try:
                await self.close(caller, sid)
            except BridgeError as exc:
                if exc.code != "SESSION_NOT_FOUND":
                    raise
        return {"sessionId": sid, **result}


def _params(value: object) -> dict[str, Any]:
    try:
        return wire_params(value, "runtimeParams")
    except InvalidArgumentError as exc:
        raise BridgeError("INVALID_ARGUMENT", str(exc)) from None


def runtime_providers(config: BridgeConfig) -> list[Any]:
    """Every agent's providers, as the runtime registers them."""
    return [provider for agent in config.agents.values() for provider in agent.providers.values()]


BridgeCall = Callable[..., Awaitable[dict[str, Any]]]
