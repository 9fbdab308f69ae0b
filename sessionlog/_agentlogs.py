"""The `import-agent-log` command: agents' own logs into the store, with a summary table.

A thin wrapper over `replay.import_agent_log`: each PATH (a file, or a folder of logs) is imported
in turn; a damaged file is a `Failure` with `EXIT_BAD_INPUT` naming its file:line.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import replay
from replay.agentlogs import AgentLogImport, ImportedFile
from sessionlog._commands import (
    EXIT_BAD_INPUT,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    Failure,
    emit_json,
    opened,
)
from sessionlog._render import Progress, emit, safe, table


def import_agent_log(args: argparse.Namespace) -> int:
    if args.id is not None and len(args.paths) > 1:
        raise Failure("import-agent-log: --id names one session; give one PATH with it", EXIT_USAGE)
    missing = [path for path in args.paths if not os.path.exists(path)]
    if missing:  # checked first: a store is not created for nothing to import
        raise Failure(f"import-agent-log: no file or folder {missing[0]}", EXIT_NOT_FOUND)
    results: list[AgentLogImport] = []
    with opened(args, create=True) as store, Progress("import") as progress:
        for path in args.paths:
            try:
                results.append(
                    replay.import_agent_log(
                        store,
                        path,
                        format=args.format,
                        session_id=args.id,
                        progress=progress,
                        recursive=args.recursive,
                        skip_bad_lines=args.skip_bad_lines,
                    )
                )
            except replay.AgentLogError as exc:
                raise Failure(f"import-agent-log: {exc}", EXIT_BAD_INPUT) from exc
    files = [f for result in results for f in result.files]
    others = [name for result in results for name in result.not_agent_logs]
    if args.json:
        emit_json({"files": [_file_dict(f) for f in files], "not_agent_logs": others})
        return EXIT_OK
    for found in files:
        for line, why in found.skipped_lines:
            print(safe(f"skipped {found.path}:{line}: {why}"))
        if found.pending_tail_bytes:
            print(
                safe(
                    f"pending {found.path}: its last line ({found.pending_tail_bytes:,} bytes) "
                    "has no line break yet; the next import reads it once complete"
                )
            )
    emit(
        table(
            ("file", "format", "sessions", "messages", "tool calls", "unknown", "new"), _rows(files)
        )
    )
    if others:
        print(f"{len(others)} file(s) were not agent logs and were left alone")
    return EXIT_OK


def _rows(files: list[ImportedFile]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for found in files:
        counts = [s.counts for s in found.sessions]
        rows.append(
            (
                found.path,
                found.format + (" (detected)" if found.detected else ""),
                len(found.sessions),
                sum(s.messages for s in found.sessions),
                sum(c.get("tool_calls", 0) for c in counts),
                sum(c.get("unknown_records", 0) for c in counts),
                _new(found),
            )
        )
    return rows


def _new(found: ImportedFile) -> str:
    if found.updated:  # an earlier import of the log, grown since
        gained = sum(s.appended - s.replaced for s in found.sessions)
        return f"grew: +{gained:,} messages"
    if not found.sessions and found.pending_tail_bytes:
        return "not yet: its first line is being written"
    if not found.sessions:  # an empty file, or blank lines only
        return "not yet: nothing written in it"
    return "yes" if found.written else "already imported"


def _file_dict(found: ImportedFile) -> dict[str, Any]:
    return {
        "path": found.path,
        "format": found.format,
        "detected": found.detected,
        "records": found.records,
        "blake3": found.blake3,
        "written": found.written,
        "updated": found.updated,
        "skipped_lines": [list(item) for item in found.skipped_lines],
        "pending_tail_bytes": found.pending_tail_bytes,
        "sessions": [
            {
                "session_id": s.session_id,
                "parent_id": s.parent_id,
                "messages": s.messages,
                "roles": dict(s.roles),
                "counts": dict(s.counts),
                "appended": s.appended,
                "replaced": s.replaced,
            }
            for s in found.sessions
        ],
    }
