"""pi coding-agent session logs (`~/.pi/agent/sessions/.../*.jsonl`) into a session.

The first line is the `session` header; `message` entries carry pi's messages (`user`,
`assistant` with `text`/`thinking`/`toolCall` blocks, `toolResult`, and pi's own roles), each
assistant message naming its own provider and model, so a switch mid-session stays per message.
`compaction` entries become context checkpoints, put before the messages they kept (pi's next
request was the summary and those messages). `model_change`, `thinking_level_change`,
labels, session info and extension entries are kept as attached metadata. The `id`/`parentId`
tree of later versions is followed (`replay.agentlogs._pi_tree`): the branch pi would resume (the
root to the last entry) is the session, each other branch a fork of the branch it leaves.
"""

from __future__ import annotations

from typing import Any

from replay.agentlogs._branches import Forking, read_as_tree
from replay.agentlogs._checkpoints import checkpoint
from replay.agentlogs._common import (
    Built,
    Message,
    Parsed,
    Record,
    Source,
    function_call,
    json_lines,
    shape_checked,
    text_or,
    token_counts,
)
from replay.agentlogs._content import content_of
from replay.agentlogs._pi_tree import MAIN, Branches, Entry

NAME = "pi"
_KNOWN = frozenset(
    (
        "session",
        "message",
        "compaction",
        "branch_summary",
        "model_change",
        "thinking_level_change",
        "custom",
        "custom_message",
        "label",
        "session_info",
    )
)


_FIELDS = frozenset(
    (
        "type",
        "id",
        "parentId",
        "timestamp",
        "version",
        "cwd",
        "provider",
        "modelId",
        "thinkingLevel",
        "parentSession",
        "message",
        "summary",
        "firstKeptEntryId",
        "firstKeptEntryIndex",
        "tokensBefore",
        "details",
        "fromHook",
        "fromId",
        "customType",
        "data",
        "content",
        "display",
        "targetId",
        "label",
        "name",
    )
)
"""The fields of pi's session entries (all entry types); others are counted as unknown."""
_USAGE = (
    ("input", "input_tokens"),
    ("output", "output_tokens"),
    ("cacheRead", "cache_read_tokens"),
    ("cacheWrite", "cache_write_tokens"),
)
"""An assistant message's `usage` counts, each with its name in the transcript's usage."""


def looks_like(record: Record) -> bool:
    """pi's header line: `type: session` with the session's id, timestamp and working folder."""
    return record.get("type") == "session" and "id" in record and "cwd" in record


@shape_checked
def parse(source: Source) -> Parsed:
    """The file's session: the active branch (root to the last entry) as its transcript, every
    other branch a fork of the branch it leaves. A file whose entries form one line is read
    once; a tree is read again, each entry into its branch's session, and must read the same
    bytes again, no more (else the branches found in the first reading do not fit the second)."""
    return read_as_tree(source, lambda tree, entries: _read(source, tree, entries))


def _read(source: Source, tree: Branches | None, entries: list[Entry]) -> Parsed:
    main = Built(MAIN, source)
    forking = None if tree is None else Forking(tree, main, source)
    sessions = {MAIN: main} if forking is None else forking.sessions
    source.held = lambda: sum(built.held_bytes() for built in sessions.values())
    about: dict[str, Any] = {}
    records = 0
    read: list[int] = []  # the line of each entry, header included (version 1 names an index)
    ids: dict[object, int] = {}  # the line of each id read so far (the last, as pi's index)
    for line, record in json_lines(source):
        records += 1
        kind = record.get("type")
        if kind != "session":
            entries.append(Entry.of(line, record))
        built = main  # a line outside the tree (the header, damage) belongs to the main session
        if forking is not None and line in forking.tree.owner:
            built = forking.session_of(line)
        if kind == "compaction" and isinstance(record.get("summary"), str):
            kept = _first_kept(record, read, ids, forking, built.key)
            checkpoint(built, record["summary"], line, record, kept)
        else:
            _entry(built, about, line, record, kind)
        read.append(line)
        if isinstance(record.get("id"), str):
            ids[record["id"]] = line
        if forking is not None:
            forking.read(line, built)
    forks = [] if forking is None else forking.forks()
    for built in sessions.values():
        built.title = built.title or built.first_prompt
        built.finish()
    main.counts["branches"] = len(forks)
    return Parsed(
        sessions=list(sessions.values()),
        tool_version=str(about["version"]) if "version" in about else None,
        source_session_id=about.get("id"),
        records=records,
        extra={"cwd": about.get("cwd"), "parent_session": about.get("parentSession")},
    )


def _entry(built: Built, about: dict[str, Any], line: int, record: Record, kind: object) -> None:
    built.check_fields(record, _FIELDS)
    message = record.get("message")
    if kind == "message" and isinstance(message, dict):
        _message(built, line, record, message)
    elif kind == "custom_message":
        added = built.add(_custom(built, record), line, record)
        added["metadata"]["custom_type"] = record.get("customType")
    else:
        _other(built, about, kind, record)
        built.attach(line, record, known=isinstance(kind, str) and kind in _KNOWN)


def _first_kept(
    record: Record, read: list[int], ids: dict[object, int], forking: Forking | None, key: str
) -> int | None:
    """The line of the first entry a compaction kept (`firstKeptEntryId`; version 1:
    `firstKeptEntryIndex` into the file's entries, header included), or None when it kept
    none: pi keeps the entries from there up to the compaction on the compaction's own branch,
    so an entry before it elsewhere (or none) keeps nothing. One on the prefix a fork shares
    with the branch it leaves is 0: the fork's own messages are kept from its first."""
    index, name = record.get("firstKeptEntryIndex"), record.get("firstKeptEntryId")
    if type(index) is int and 0 < index < len(read):
        line: int | None = read[index]
    else:
        line = ids.get(name) if isinstance(name, str) else None
    if line is None or forking is None:
        return line
    tree, own, limit = forking.tree, key, None
    while True:
        if tree.owner.get(line, MAIN) == key and (limit is None or line <= limit):
            return line if key == own else 0
        if key == MAIN:
            return None
        key, limit = tree.forks[key]
        if limit is None:  # a root of its own: no prefix
            return None


def _other(built: Built, about: dict[str, Any], kind: object, record: Record) -> None:
    if kind == "session":
        for key in ("id", "cwd", "version", "parentSession"):
            if record.get(key) is not None:
                about.setdefault(key, record[key])
    elif kind == "model_change":
        built.counts["model_changes"] += 1
    elif kind == "thinking_level_change":
        built.counts["thinking_level_changes"] += 1
    elif kind == "branch_summary":
        built.counts["branch_summaries"] += 1
    elif kind == "session_info" and isinstance(record.get("name"), str):
        built.title = record["name"]


def _custom(built: Built, record: Record) -> Message:
    content = content_of(built.counts, record.get("content"))
    return {"role": "user", "content": content, "synthetic": True}


def _message(built: Built, line: int, record: Record, message: Record) -> None:
    role = message.get("role")
    content = message.get("content")
    if role == "assistant":
        _assistant(built, line, record, message)
    elif role == "toolResult":
        call_id = message.get("toolCallId")
        answered = built.result(call_id)
        tool: Message = {
            "role": "tool",
            "tool_call_id": call_id if isinstance(call_id, str) else None,
            "content": content_of(built.counts, content),
        }
        if isinstance(message.get("toolName"), str):
            tool["name"] = message["toolName"]
        added = built.add(tool, line, record)
        if message.get("isError") is True:
            added["metadata"]["is_error"] = True
            built.counts["error_results"] += 1
        if not answered:
            added["metadata"]["orphan_result"] = True
    elif role in ("compactionSummary", "branchSummary") and isinstance(message.get("summary"), str):
        checkpoint(built, message["summary"], line, record)
    elif role == "bashExecution":
        command, output = message.get("command"), message.get("output")
        text = f"Ran `{command}`\n{output}" if isinstance(output, str) else f"Ran `{command}`"
        built.add({"role": "user", "content": text, "synthetic": True}, line, record)
    elif isinstance(role, str) and role:
        user: Message = {"role": "user" if role in ("user", "custom", "hookMessage") else role}
        user["content"] = content_of(built.counts, content)
        if role != "user":
            user["synthetic"] = True
        built.add(user, line, record)
    else:
        built.attach(line, record, known=False)


def _assistant(built: Built, line: int, record: Record, message: Record) -> None:
    target = built.add({"role": "assistant"}, line, record)
    provider, model = message.get("provider"), message.get("model")
    if isinstance(model, str) and model:
        target["model"] = f"{provider}/{model}" if isinstance(provider, str) else model
        if target["model"] not in built.models:
            built.models.append(target["model"])
    for key in ("provider", "api", "stopReason", "errorMessage"):
        if message.get(key) is not None:
            target["metadata"][key] = message[key]
    usage = message.get("usage")
    if isinstance(usage, dict):
        target["usage"] = token_counts(usage, _USAGE)
    texts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):  # a plain string is its text, not a list of characters
        content = [{"type": "text", "text": content}]
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking":
            target["metadata"].setdefault("reasoning", []).append(block)
        elif kind == "toolCall" and isinstance(block.get("id"), str):
            name = text_or(block.get("name"), "unknown")
            arguments = block.get("arguments", {})
            call = function_call(block["id"], name, arguments)
            target.setdefault("tool_calls", []).append(call)
            built.call(call)
            if name in ("write", "edit") and isinstance(arguments, dict):
                built.wrote(arguments.get("path"))
        else:
            target["metadata"].setdefault("other_blocks", []).append(block)
    if texts:
        target["content"] = "\n\n".join(texts)
