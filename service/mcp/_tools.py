"""Seed 002's eight tools on an `MCPServer`, each calling the `Bridge` as the caller of its request.
This module imports the MCP SDK (the `mcp` extra) at its top, so that the SDK can resolve the
`Context` annotation it injects the request by; only `build_server` imports it. A `BridgeError`
comes back as an MCP tool error whose text is ``{"code": ..., "message": ...}``.

Must never let a tool run without knowing who called: over HTTP the caller is the principal
`BearerAuth` put in the request's scope; only a server built `local` (stdio) runs as `LOCAL`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from service._access import Caller
from service.mcp._bridge import LOCAL, Bridge, BridgeError
from sessions.asgi import PRINCIPAL

NAME = "sessionlog-bridge"
INSTRUCTIONS = (
    "Delegate work to agents: bridge_health, agents_discover, then sessions_create with an "
    "agentId (and optional metadata.provider), sessions_prompt with the sessionId, "
    "sessions_status for long tasks, sessions_close when done; tasks_delegate for one-shot work."
)
Obj = dict[str, Any]
Ctx = Context[Any, Any]
"""What the SDK injects into a tool by this annotation: the request the call came in."""


def caller_of(ctx: Ctx, *, local: bool) -> Caller:
    """Who made this tool call: `LOCAL` on a local transport, else the request's principal."""
    if local:
        return LOCAL
    # The SDK hands each tool the HTTP request it came in (None on stdio): its scope holds what
    # `BearerAuth` established, never anything the client sent in the call's arguments.
    scope = getattr(ctx.request_context.request, "scope", None)
    if not isinstance(scope, dict) or not scope.get(PRINCIPAL):
        raise BridgeError(
            "CONFIG",
            "this bridge serves a request without an authenticated principal: serve HTTP with "
            "`http_app` (bearer authentication) and stdio with `serve_stdio`",
        )
    return Caller.of(scope)


async def _answer(call: Callable[[], Awaitable[Obj]]) -> Obj:
    try:
        return await call()
    except BridgeError as exc:
        raise ToolError(json.dumps(exc.as_dict())) from None


def tools_server(bridge: Bridge, *, local: bool) -> MCPServer:
    """An MCP server whose tools call `bridge`; see `service.mcp.build_server`."""
    server: MCPServer = MCPServer(NAME, instructions=INSTRUCTIONS, log_level="WARNING")

    def who(ctx: Ctx) -> Caller:
        return caller_of(ctx, local=local)

    @server.tool(description="Is the bridge up? Its agents and open sessions.")
    async def bridge_health() -> Obj:
        return await _answer(bridge.health)

    @server.tool(description="The agents this bridge delegates to, with their providers.")
    async def agents_discover() -> Obj:
        return await _answer(bridge.discover)

    @server.tool(description="Open a session with an agent; metadata.provider picks the provider.")
    async def sessions_create(ctx: Ctx, agentId: str, metadata: Obj | None = None) -> Obj:
        return await _answer(lambda: bridge.create(who(ctx), agentId, metadata))

    @server.tool(
        description="Send a prompt to a session and wait for the answer. A retry with the same "
        "`requestId` calls no model again: it answers what the first call recorded."
    )
    async def sessions_prompt(
        ctx: Ctx,
        sessionId: str,
        prompt: str,
        runtimeParams: Obj | None = None,
        requestId: str | None = None,
    ) -> Obj:
        return await _answer(
            lambda: bridge.prompt(who(ctx), sessionId, prompt, runtimeParams, requestId)
        )

    @server.tool(description="A session's status: active, busy, idle or failed.")
    async def sessions_status(ctx: Ctx, sessionId: str) -> Obj:
        return await _answer(lambda: bridge.status(who(ctx), sessionId))

    @server.tool(
        description="Cancel the prompt `requestId` of a session (default: the running one)."
    )
    async def sessions_cancel(ctx: Ctx, sessionId: str, requestId: str | None = None) -> Obj:
        return await _answer(lambda: bridge.cancel(who(ctx), sessionId, requestId))

    @server.tool(description="Close a session; afterwards it is not found.")
    async def sessions_close(ctx: Ctx, sessionId: str) -> Obj:
        return await _answer(lambda: bridge.close(who(ctx), sessionId))

    @server.tool(description="One-shot: create a session, prompt it once, close it.")
    async def tasks_delegate(
        ctx: Ctx,
        agentId: str,
        prompt: str,
        metadata: Obj | None = None,
        runtimeParams: Obj | None = None,
    ) -> Obj:
        return await _answer(
            lambda: bridge.delegate(who(ctx), agentId, prompt, metadata, runtimeParams)
        )

    return server
