"""`agents.toml`: the agents a bridge serves, their providers, default provider, system prompt and
tools, and the runtime's limits. Loading it builds the provider objects and imports the tools;
nothing here starts a runtime or touches a store.

```toml
[bridge]                      # all optional
ttl_s = 3600                  # session lifetime
idle_s = 600                  # idle limit
reap_interval_s = 30          # how often the reaper runs
max_sessions = 100
max_steps = 10                # model calls per prompt when the agent has tools

[[agents]]
id = "multi-provider-agent"
description = "Answers questions"
default_provider = "openai"
system_prompt = "You are concise."

[agents.providers.openai]
kind = "openai"               # openai | anthropic | mock
base_url = "http://127.0.0.1:8000/v1"
api_key_env = "OPENAI_API_KEY"        # or secrets_file = "secrets.env"
defaults = { model = "gpt-4o", temperature = 0.3 }

[[agents.tools]]
name = "word_count"
function = "mypackage.tools:word_count"   # called with the arguments as keywords
description = "Count the words of a text"
parameters = { type = "object", properties = { text = { type = "string" } } }
```
"""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eventlog import InvalidArgumentError
from eventlog.errors import ConfigurationError
from sessions.runtime import (
    AnthropicProvider,
    HttpSettings,
    MockProvider,
    OpenAIProvider,
    Provider,
    Tool,
    wire_params,
)

KINDS = ("openai", "anthropic", "mock")
_BRIDGE_KEYS = {"ttl_s", "idle_s", "reap_interval_s", "max_sessions", "max_steps"}
_AGENT_KEYS = {"id", "description", "default_provider", "system_prompt", "providers", "tools"}
_PROVIDER_KEYS = {
    "kind",
    "base_url",
    "api_key_env",
    "secrets_file",
    "defaults",
    "stream",
    "reply",
    "connect_timeout_s",
    "read_timeout_s",
    "total_timeout_s",
    "retries",
}


@dataclass(frozen=True)
class Agent:
    """One agent of the bridge: its providers by the id callers use, and its tools."""

    id: str
    providers: dict[str, Provider]
    default_provider: str
    description: str = ""
    system_prompt: str | None = None
    tools: list[Tool] = field(default_factory=list)

    def runtime_name(self, provider_id: str) -> str:
        """The name the provider is registered under in the runtime (unique across agents)."""
        return f"{self.id}:{provider_id}"


@dataclass(frozen=True)
class BridgeConfig:
    agents: dict[str, Agent]
    ttl_s: float = 3_600.0
    idle_s: float = 600.0
    reap_interval_s: float = 30.0
    max_sessions: int | None = None
    max_steps: int = 10


def load_agents(path: str | Path) -> BridgeConfig:
    """Read and check `agents.toml`; `ConfigurationError` names the file and the key at fault."""
    source = Path(path)
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"{source.name}: cannot read it: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{source.name}: not valid TOML: {exc}") from None
    where = source.name
    unknown = set(data) - {"bridge", "agents"}
    if unknown:
        raise ConfigurationError(f"{where}: unknown tables {sorted(unknown)}")
    bridge = _table(data.get("bridge", {}), f"{where}: [bridge]")
    _known(bridge, _BRIDGE_KEYS, f"{where}: [bridge]")
    items = data.get("agents")
    if not isinstance(items, list) or not items:
        raise ConfigurationError(f"{where}: declare at least one [[agents]]")
    agents: dict[str, Agent] = {}
    for index, item in enumerate(items):
        agent = _agent(_table(item, f"{where}: agents[{index}]"), f"{where}: agents[{index}]",
                       source.parent)  # fmt: skip
        if agent.id in agents:
            raise ConfigurationError(f"{where}: two agents have the id {agent.id!r}")
        agents[agent.id] = agent
    return BridgeConfig(agents=agents, **bridge)


def _table(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where} must be a table, got {type(value).__name__}")
    return value


def _known(table: Mapping[str, Any], keys: set[str], where: str) -> None:
    unknown = set(table) - keys
    if unknown:
        raise ConfigurationError(f"{where}: unknown keys {sorted(unknown)}")


def _text(table: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str | None:
    value = table.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{where}.{key} must be a non-empty string, got {value!r:.80}")
    return value


def _agent(table: dict[str, Any], where: str, base: Path) -> Agent:
    _known(table, _AGENT_KEYS, where)
    agent_id = _text(table, "id", where, required=True)
    assert agent_id is not None
    where = f"{where} ({agent_id})"
    system_prompt = _text(table, "system_prompt", where)
    specs = _table(table.get("providers", {}), f"{where}.providers")
    if not specs:
        raise ConfigurationError(f"{where}: declare at least one [agents.providers.NAME]")
    providers = {
        name: _provider(
            agent_id,
            name,
            _table(spec, f"{where}.providers.{name}"),
            f"{where}.providers.{name}",
            system_prompt,
            base,
        )
        for name, spec in specs.items()
    }
    default = _text(table, "default_provider", where) or next(iter(providers))
    if default not in providers:
        raise ConfigurationError(
            f"{where}.default_provider {default!r} is not one of its providers "
            f"({', '.join(providers)})"
        )
    tools = table.get("tools", [])
    if not isinstance(tools, list):
        raise ConfigurationError(f"{where}.tools must be an array of tables")
    return Agent(
        id=agent_id,
        providers=providers,
        default_provider=default,
        description=_text(table, "description", where) or "",
        system_prompt=system_prompt,
        tools=[
            _tool(_table(t, f"{where}.tools[{i}]"), f"{where}.tools[{i}]")
            for i, t in enumerate(tools)
        ],
    )


def _provider(
    agent_id: str,
    name: str,
    spec: dict[str, Any],
    where: str,
    system_prompt: str | None,
    base: Path,
) -> Provider:
    _known(spec, _PROVIDER_KEYS, where)
    kind = spec.get("kind", name)
    if kind not in KINDS:
        raise ConfigurationError(f"{where}.kind must be one of {', '.join(KINDS)}, got {kind!r}")
    try:
        defaults = wire_params(spec.get("defaults"), f"{where}.defaults")
    except InvalidArgumentError as exc:
        raise ConfigurationError(str(exc)) from None
    if system_prompt is not None:
        defaults.setdefault("system_prompt", system_prompt)
    runtime_name = f"{agent_id}:{name}"
    if kind == "mock":
        return MockProvider(runtime_name, defaults=defaults, reply=_text(spec, "reply", where))
    settings = HttpSettings(
        **{
            key: spec[key]
            for key in ("connect_timeout_s", "read_timeout_s", "total_timeout_s", "retries")
            if key in spec
        }
    )
    options: dict[str, Any] = {
        "defaults": defaults,
        "settings": settings,
        "stream": bool(spec.get("stream", True)),
    }
    for key in ("base_url", "api_key_env"):
        if key in spec:
            options[key] = _text(spec, key, where)
    secrets = _text(spec, "secrets_file", where)
    if secrets is not None:
        options["secrets_file"] = base / secrets
    if kind == "openai":
        return OpenAIProvider(runtime_name, **options)
    return AnthropicProvider(runtime_name, **options)


def _tool(spec: dict[str, Any], where: str) -> Tool:
    _known(spec, {"name", "function", "description", "parameters"}, where)
    target = _text(spec, "function", where, required=True)
    assert target is not None
    module_name, _, attribute = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"{where}.function {target!r} cannot be imported: {exc}") from None
    if not callable(fn):
        raise ConfigurationError(f"{where}.function {target!r} is not callable")
    parameters = spec.get("parameters", {"type": "object", "properties": {}})
    return Tool(
        name=_text(spec, "name", where) or attribute,
        fn=fn,
        parameters=_table(parameters, f"{where}.parameters"),
        description=_text(spec, "description", where) or (fn.__doc__ or "").strip(),
    )
