"""Drop-in backends for agent frameworks, one module per framework, each behind its own extra.

- `integrations.openai_agents`: a `Session` for the OpenAI Agents SDK (`[openai-agents]`).
- `integrations.adk`: a `BaseSessionService` for Google ADK (`[adk]`).

Importing this package imports no framework; each module imports its framework when it is used.
"""

from __future__ import annotations


def require(module: str, extra: str) -> None:
    """Raise a clear `ImportError` when the framework behind `extra` is not installed."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ImportError(
            f"this integration needs `{module}`: pip install 'sessionlog-engine[{extra}]'"
        )
