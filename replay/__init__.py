"""The edges of the engine: transcripts in, session bundles in and out, the whole log in and out.

Built only on the public API of `sessions` (and the log it exposes); nothing here reaches into the
projections or the storage.
"""

from replay._bundle import export_bundle
from replay._import import BundleConflictError, import_bundle
from replay._logio import LogExportResult, LogImportResult, export_log, import_log
from replay._messages_export import MESSAGE_FORMATS, export_messages
from replay._seed import SEED_TEXT_OPTIONS, SeedResult, seed_from_jsonl
from replay._validate import BundleError, BundleIssue, validate_bundle
from replay.agentlogs import (
    FORMATS,
    AgentLogConflictError,
    AgentLogError,
    AgentLogImport,
    agent_log_records,
    agent_log_summary,
    detect_format,
    import_agent_log,
)

__all__ = [
    "MESSAGE_FORMATS",
    "SEED_TEXT_OPTIONS",
    "FORMATS",
    "AgentLogConflictError",
    "AgentLogError",
    "AgentLogImport",
    "BundleConflictError",
    "BundleError",
    "BundleIssue",
    "LogExportResult",
    "LogImportResult",
    "SeedResult",
    "agent_log_records",
    "agent_log_summary",
    "detect_format",
    "export_bundle",
    "export_log",
    "export_messages",
    "import_agent_log",
    "import_bundle",
    "import_log",
    "seed_from_jsonl",
    "validate_bundle",
]
