"""The bridge as an MCP server (the official `mcp` SDK, the `mcp` extra): seed 002's eight tools,
served over stdio or streamable HTTP. A `BridgeError` comes back as an MCP tool error whose text
is ``{"code": ..., "message": ...}``. Over HTTP every request needs ``Authorization: Bearer``:
a bearer session of the store, or a static API key.

The runtime lives as long as the transport: `serve_stdio` and `serve_http` start it (with its
periodic reaper) before the first request and stop it after the last.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from service.mcp._bridge import Bridge, BridgeError, runtime_providers
from service.mcp._config import BridgeConfig
from sessions import SessionStore
from sessions.runtime import Runtime

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from mcp.server.mcpserver import MCPServer

NAME = "sessionlog-bridge"
INSTRUCTIONS = (
    "Delegate work to agents: bridge_health, agents_discover, then sessions_create with an "
    "agentId (and optional metadata.provider), sessions_prompt with the sessionId, "
    "sessions_status for long tasks, sessions_close when done; tasks_delegate for one-shot work."
)
Obj = dict[str, Any]


def _wrap(call: Callable[..., Awaitable[Obj]]) -> Callable[..., Awaitable[Obj]]:
    async def run(*args: Any) -> Obj:
        from mcp.server.mcpserver.exceptions import ToolError

        try:
            return await call(*args)
        except BridgeError as exc:
            raise ToolError(json.dumps(exc.as_dict())) from None

    return run


def build_server(bridge: Bridge) -> MCPServer:
    """An MCP server whose tools call `bridge` (which must stay started while it serves)."""
    from mcp.server.mcpserver import MCPServer

    server: MCPServer = MCPServer(NAME, instructions=INSTRUCTIONS, log_level="WARNING")

    @server.tool(description="Is the bridge up? Its agents and open sessions.")
    async def bridge_health() -> Obj:
        return await _wrap(bridge.health)()

    @server.tool(description="The agents this bridge delegates to, with their providers.")
    async def agents_discover() -> Obj:
        return await _wrap(bridge.discover)()

    @server.tool(description="Open a session with an agent; metadata.provider picks the provider.")
    async def sessions_create(agentId: str, metadata: Obj | None = None) -> Obj:
        return await _wrap(bridge.create)(agentId, metadata)

    @server.tool(description="Send a prompt to a session and wait for the answer.")
    async def sessions_prompt(
        sessionId: str,
        prompt: str,
        runtimeParams: Obj | None = None,
        requestId: str | None = None,
    ) -> Obj:
        return await _wrap(bridge.prompt)(sessionId, prompt, runtimeParams, requestId)

    @server.tool(description="A session's status: active, busy, idle or failed.")
    async def sessions_status(sessionId: str) -> Obj:
        return await _wrap(bridge.status)(sessionId)

    @server.tool(
        description="Cancel the prompt `requestId` of a session (default: the running one)."
    )
    async def sessions_cancel(sessionId: str, requestId: str | None = None) -> Obj:
        return await _wrap(bridge.cancel)(sessionId, requestId)

    @server.tool(description="Close a session; afterwards it is not found.")
    async def sessions_close(sessionId: str) -> Obj:
        return await _wrap(bridge.close)(sessionId)

    @server.tool(description="One-shot: create a session, prompt it once, close it.")
    async def tasks_delegate(
        agentId: str,
        prompt: str,
        metadata: Obj | None = None,
        runtimeParams: Obj | None = None,
    ) -> Obj:
        return await _wrap(bridge.delegate)(agentId, prompt, metadata, runtimeParams)

    return server


@asynccontextmanager
async def running_bridge(store: SessionStore, config: BridgeConfig) -> AsyncIterator[Bridge]:
    """A started runtime for `config`'s agents on `store`, and the bridge over it."""
    runtime = Runtime(
        store,
        providers=runtime_providers(config),
        default_provider=next(iter(config.agents.values())).runtime_name(
            next(iter(config.agents.values())).default_provider
        ),
        ttl_s=config.ttl_s,
        idle_s=config.idle_s,
        reap_interval_s=config.reap_interval_s,
        max_sessions=config.max_sessions,
    )
    async with runtime:
        yield Bridge(runtime, config)


async def serve_stdio(store: SessionStore, config: BridgeConfig) -> None:
    """Serve the bridge on stdin/stdout until the client goes away."""
    async with running_bridge(store, config) as bridge:
        await build_server(bridge).run_stdio_async()


def http_app(bridge: Bridge, api_keys: Mapping[str, str] | None = None) -> Any:
    """The streamable-HTTP ASGI app (endpoint ``/mcp``) behind bearer authentication."""
    from sessions.asgi import BearerAuth

    app = build_server(bridge).streamable_http_app(streamable_http_path="/mcp")
    return BearerAuth(app, bridge.runtime.store, api_keys=dict(api_keys or {}))


async def serve_http(
    store: SessionStore,
    config: BridgeConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8701,
    api_keys: Mapping[str, str] | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve the bridge over streamable HTTP at ``http://host:port/mcp`` until cancelled."""
    import uvicorn

    async with running_bridge(store, config) as bridge:
        uv = uvicorn.Config(http_app(bridge, api_keys), host=host, port=port, log_level="warning",
                            lifespan="on")  # fmt: skip
        await uvicorn.Server(uv).serve(sockets=None if sock is None else [sock])
