"""An agent's compactions as the engine's context checkpoints.

The engine's context view (`store.context`) starts at the latest checkpoint pair of a transcript:
a synthetic user boundary and the summary as an assistant message, both flagged `summary` (the
pair `maintain_context` records); `snapshot` keeps every message. A compaction the agent made
becomes such a pair where the agent's own next request began: before the messages it kept (pi
names the first), else where it was written. It builds messages into a `Built`; it never writes,
and no summarizer is called: the summary is the agent's.
"""

from __future__ import annotations

from typing import Any

from replay.agentlogs._common import Built, Message, Record, finish_records

BOUNDARY = "[context checkpoint: the earlier messages are summarized next]"
"""The boundary message's text (the engine's own says how many messages it stands for)."""


def checkpoint(
    built: Built, summary: str, line: int, record: Record, kept_from: int | None = None
) -> None:
    """A compaction written as one record (pi's `compaction`, Codex's `compacted`): its pair,
    put before the first of the session's messages read at or after line `kept_from` (the first
    entry the agent kept: its context went on with the kept messages after the summary), or
    after every message when it kept none (None). Never before an earlier pair, nor before a
    point a fork leaves at (the prefix a fork shares stays as it was): the messages kept before
    that stay outside the context."""
    built.counts["compactions"] += 1
    built.flush()
    at = len(built.kept)
    if kept_from is not None:
        floor = max([built.checkpoint_end, *built.fork_at_lines.values()])
        while at > floor and _first_line(built, at - 1) >= kept_from:
            at -= 1
    note: dict[str, Any] = {"imported": True}
    if kept_from is not None:
        note["kept"] = len(built.kept) - at
    if at == len(built.kept):  # where it was written: the records before it attach to it
        built.add(_boundary(note), line, record)
        built.add(_summary(summary), line, None)
        built.checkpoint_end = built.length
        return
    pair = [_boundary(note), _summary(summary)]
    pair[0]["metadata"]["source"] = {"lines": [line], "records": [built.raw(record)]}
    pair[1]["metadata"]["source"] = {"lines": [line], "records": []}
    for message in pair:
        finish_records(message)
    built.kept.insert(at, pair)
    built.open_calls = {
        call: index + len(pair) if index >= at else index
        for call, index in built.open_calls.items()
    }
    built.checkpoint_end = at + len(pair)


def boundary(built: Built, line: int, record: Record) -> None:
    """Claude Code's `compact_boundary` record: the boundary of a pair, where it was written;
    the compact summary written after it (`summary`) completes the pair."""
    built.counts["compactions"] += 1
    built.add(_boundary({"imported": True}), line, record)


def summary(built: Built, content: object, line: int, record: Record) -> None:
    """Claude Code's compact summary (a user record flagged `isCompactSummary`, what its next
    request began with): the summary of the pair its boundary opened, or, with no boundary
    right before it (a version that wrote none), of a pair of its own."""
    held = built.held
    if not (held is not None and held["role"] == "user" and held.get("summary")):
        built.counts["compactions"] += 1
        built.add(_boundary({"imported": True}), line, None)
    built.add(_summary(content), line, record)
    built.checkpoint_end = built.length


def _boundary(note: dict[str, Any]) -> Message:
    return {
        "role": "user",
        "content": BOUNDARY,
        "synthetic": True,
        "summary": True,
        "metadata": {"context_checkpoint": note},
    }


def _summary(content: object) -> Message:
    return {
        "role": "assistant",
        "content": content,
        "synthetic": True,
        "summary": True,
        "metadata": {},
    }


def _first_line(built: Built, index: int) -> int:
    found = built.kept.line_of(index)
    return 0 if found is None else found
