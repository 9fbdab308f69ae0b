"""Gemini CLI session files (`~/.gemini/tmp/<project>/chats/session-*.json`) into a session.

One JSON object: the session's id, project hash and times, and `messages[]` of `user` and
`gemini` messages (and the CLI's `info`/`error`/`warning` notes, kept as attached metadata).
A `gemini` message carries its text, `thoughts`, `tokens`, `model` and `toolCalls`, each call with
its result inline; each result becomes a `tool` message after the call. Positions in `source`
metadata are 1-based indexes into `messages[]` (a document has no lines to point at).
"""

from __future__ import annotations

from typing import Any

from replay.agentlogs._common import (
    Built,
    Message,
    Parsed,
    Record,
    Source,
    function_call,
    item_value,
    items,
    shape_checked,
    text_or,
    token_counts,
)
from replay.agentlogs._content import content_of

NAME = "gemini-cli"
_PART_KINDS = ("text", None)  # a Gemini `Part` holding text names no type: `{"text": ...}`
_NOTES = frozenset(("info", "error", "warning"))
_FIELDS = frozenset(
    ("id", "timestamp", "type", "content", "thoughts", "tokens", "model", "toolCalls")
)
"""The fields of a Gemini CLI message; others are counted as unknown."""
_WRITING_TOOLS = frozenset(("write_file", "replace", "edit"))
_SNIFF_ITEMS = 20  # messages looked at to recognise the format
_TOKENS = (
    ("input", "input_tokens"),
    ("output", "output_tokens"),
    ("cached", "cache_read_tokens"),
    ("thoughts", "reasoning_tokens"),
)
"""A message's `tokens` counts, each with its name in the transcript's usage."""


def looks_like_document(document: object) -> bool:
    """A Gemini CLI session: an object with `sessionId` and `messages` typed user/gemini."""
    if not isinstance(document, dict) or not isinstance(document.get("messages"), list):
        return False
    if "sessionId" not in document:
        return False
    first = [item_value(m) for m in document["messages"][:_SNIFF_ITEMS]]
    spoken = any(isinstance(m, dict) and m.get("type") in ("user", "gemini") for m in first)
    return spoken or not document["messages"]


@shape_checked
def parse_document(source: Source, document: dict[str, Any]) -> Parsed:
    built = Built("main", source)
    built.info["document"] = {k: v for k, v in document.items() if k != "messages"}
    records = 0
    for index, message in items(source, document["messages"]):
        records += 1
        kind = message.get("type") if isinstance(message, dict) else None
        if isinstance(message, dict):
            built.check_fields(message, _FIELDS)
        if kind == "user":
            content = content_of(built.counts, message.get("content"), _PART_KINDS)
            built.add({"role": "user", "content": content}, index, message)
        elif kind == "gemini":
            _gemini(built, index, message)
        else:
            built.attach(
                index,
                message if isinstance(message, dict) else {"value": message},
                known=isinstance(kind, str) and kind in _NOTES,
            )
    built.title = built.first_prompt
    built.finish()
    session_id = document.get("sessionId")
    return Parsed(
        sessions=[built],
        source_session_id=session_id if isinstance(session_id, str) else None,
        records=records,
        extra={"project_hash": document.get("projectHash")},
    )


def _gemini(built: Built, index: int, message: Record) -> None:
    content = content_of(built.counts, message.get("content"), _PART_KINDS)
    target = built.add({"role": "assistant", "content": content}, index, message)
    if isinstance(message.get("model"), str):
        target["model"] = message["model"]
        if message["model"] not in built.models:
            built.models.append(message["model"])
    tokens = message.get("tokens")
    if isinstance(tokens, dict):
        target["usage"] = token_counts(tokens, _TOKENS)
    if isinstance(message.get("thoughts"), list):
        target["metadata"]["reasoning"] = message["thoughts"]
    listed = message.get("toolCalls")
    calls = [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []
    for number, call in enumerate(calls):
        call_id = text_or(call.get("id"), f"call-{index}-{number}")
        name = text_or(call.get("name"), "unknown")
        made = function_call(call_id, name, call.get("args", {}))
        target.setdefault("tool_calls", []).append(made)
        built.call(made)
    answered = [c for c in enumerate(calls) if "result" in c[1] or "resultDisplay" in c[1]]
    results = [_result_text(call) for _, call in answered]  # unanswered: left dangling, flagged
    # Each result is kept once, in its tool message: cut out of the record while it is held.
    cuts = [built.cut_from_held(result) for result in results]
    for (number, call), result, cut in zip(answered, results, cuts, strict=True):
        made_id = target["tool_calls"][number]["id"]
        built.result(made_id)
        tool: Message = {"role": "tool", "tool_call_id": made_id, "content": result}
        tool_name = call.get("name")
        if isinstance(tool_name, str):
            tool["name"] = tool_name
        added = built.add(tool, index, None)
        if cut is not None:
            added["metadata"]["source"]["content_in"] = cut
        added["metadata"]["status"] = call.get("status")
        writes = isinstance(tool_name, str) and tool_name in _WRITING_TOOLS
        if writes and call.get("status") == "success" and isinstance(call.get("args"), dict):
            built.wrote(call["args"].get("file_path"))
        if call.get("status") == "error":
            added["metadata"]["is_error"] = True
            built.counts["error_results"] += 1


def _result_text(call: Record) -> object:
    """What the tool answered: the function responses' `output` (or `error`), else the text the
    CLI displayed."""
    texts: list[str] = []
    parts = call.get("result")
    for part in parts if isinstance(parts, list) else []:
        called = part.get("functionResponse") if isinstance(part, dict) else None
        response = called.get("response") if isinstance(called, dict) else None
        if isinstance(response, dict):
            value = response.get("output", response.get("error"))
            if isinstance(value, str):
                texts.append(value)
    if texts:
        return "\n\n".join(texts)
    shown = call.get("resultDisplay")
    return shown if isinstance(shown, str) else call.get("result")
