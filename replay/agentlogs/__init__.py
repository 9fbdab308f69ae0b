"""Agents' own logs into sessions: Claude Code, Codex, pi, Gemini CLI, OpenAI-style trajectories.

One module per format reads its records into sessions; `import_agent_log` picks the format (from
the content when asked to), and commits each file atomically and idempotently.
"""

from replay.agentlogs._common import KIND, AgentLogError, NotAnAgentLogError
from replay.agentlogs._verb import (
    FORMATS,
    AgentLogImport,
    ImportedFile,
    ImportedSession,
    agent_log_records,
    agent_log_summary,
    detect_format,
    import_agent_log,
)
from replay.agentlogs._write import AgentLogConflictError

__all__ = [
    "FORMATS",
    "KIND",
    "AgentLogConflictError",
    "AgentLogError",
    "AgentLogImport",
    "ImportedFile",
    "ImportedSession",
    "NotAnAgentLogError",
    "agent_log_records",
    "agent_log_summary",
    "detect_format",
    "import_agent_log",
]
