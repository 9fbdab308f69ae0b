"""Seed 002's bridge as an MCP server: agents from `agents.toml`, the runtime behind them, and the
tools `bridge_health`, `agents_discover`, `sessions_create`, `sessions_prompt`, `sessions_status`,
`sessions_cancel`, `sessions_close` and `tasks_delegate`, over stdio or streamable HTTP.

`Bridge` and `load_agents` need nothing beyond the engine; serving needs the `mcp` extra (the
official MCP SDK), imported only when a server is built.
"""

from service.mcp._bridge import Bridge, BridgeError, runtime_providers
from service.mcp._config import Agent, BridgeConfig, load_agents
from service.mcp._server import build_server, http_app, running_bridge, serve_http, serve_stdio

__all__ = [
    "Agent",
    "Bridge",
    "BridgeConfig",
    "BridgeError",
    "build_server",
    "http_app",
    "load_agents",
    "running_bridge",
    "runtime_providers",
    "serve_http",
    "serve_stdio",
]
