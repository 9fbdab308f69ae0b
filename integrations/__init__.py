"""Drop-in backends for agent frameworks, one module per framework, each behind its own extra.

- `integrations.openai_agents`: a `Session` for the OpenAI Agents SDK (`[openai-agents]`).
- `integrations.adk`: a `BaseSessionService` for Google ADK (`[adk]`).
- `integrations.langgraph`: a `BaseCheckpointSaver` for LangGraph (`[langgraph]`).

Importing this package imports no framework; each module imports its framework when it is used.
"""

from integrations._common import async_store, require

__all__ = ["async_store", "require"]
