"""The bridge as an MCP server (the official `mcp` SDK, the `mcp` extra): seed 002's eight tools
(`_tools.py`), served over stdio or streamable HTTP. Over HTTP every request needs
``Authorization: Bearer``: a bearer session of the store, or a static API key (an admin); a
principal sees only the sessions it created, as in the REST service (`service/_access.py`).

The runtime lives as long as the transport: `serve_stdio` and `serve_http` start it (with its
periodic reaper) before the first request and stop it after the last.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from service.mcp._bridge import Bridge, runtime_providers
from service.mcp._config import BridgeConfig
from sessions import SessionStore
from sessions.runtime import Runtime

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from mcp.server.mcpserver import MCPServer


def build_server(bridge: Bridge, *, local: bool = False) -> MCPServer:
    """An MCP server whose tools call `bridge` (which must stay started while it serves).

    Each tool acts as the principal that `BearerAuth` (`http_app`) put in its HTTP request and
    sees only what that principal may; a call without one is refused. `local` serves one local
    user that holds the store (stdio): every call acts as `LOCAL`, which sees every session."""
    from service.mcp._tools import tools_server

    return tools_server(bridge, local=local)


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
        await build_server(bridge, local=True).run_stdio_async()


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
