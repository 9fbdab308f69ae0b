"""Codex CLI rollout logs (`~/.codex/sessions/.../rollout-*.jsonl`) into a session.

Each line is `{timestamp, type, payload}`. `response_item` payloads are the Responses API items
the model saw and made: `message`s become messages; the model's items of one turn (`reasoning`,
`message`, `function_call`, `custom_tool_call`, `local_shell_call`, `web_search_call`) become one
assistant message with its tool calls; `*_output` items become `tool` messages paired by
`call_id`. `compacted` records become context checkpoints. `session_meta`, `turn_context`,
`event_msg` (the UI's echo of the same turn) and snapshots are kept as attached metadata.
Rollouts written before the `payload` envelope (items at the top level) are read the same way.
"""

from __future__ import annotations

from typing import Any

import msgspec

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
    text_of,
)
from replay.agentlogs._content import content_of

NAME = "codex"
_ENVELOPES = frozenset(("session_meta", "response_item", "event_msg", "turn_context", "compacted"))
_FIELDS = frozenset(("timestamp", "type", "payload"))
"""The rollout envelope's fields (an older rollout's items are their own records: their fields
are the item's, and are counted against the envelope as unknown)."""
_CALLS = frozenset(("function_call", "custom_tool_call", "local_shell_call"))
_OUTPUTS = frozenset(("function_call_output", "custom_tool_call_output", "local_shell_call_output"))
_MODEL_SIDE = frozenset(("reasoning", "web_search_call", *_CALLS))
_TEXT_KINDS = ("input_text", "output_text", "text")
_INJECTED_PREFIXES = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions")
_PATCH_HEADERS = ("*** Add File:", "*** Update File:", "*** Move to:")
_decode = msgspec.json.Decoder().decode


def looks_like(record: Record) -> bool:
    """A rollout record in its envelope, or the first line of an older rollout (its session)."""
    kind = record.get("type")
    if isinstance(kind, str) and kind in _ENVELOPES and isinstance(record.get("payload"), dict):
        return True
    return "id" in record and "timestamp" in record and "instructions" in record


@shape_checked
def parse(source: Source) -> Parsed:
    built = Built("main", source)
    source.held = built.held_bytes
    about: dict[str, Any] = {}
    records = 0
    for line, record in json_lines(source):
        records += 1
        built.check_fields(record, _FIELDS)
        kind, payload = record.get("type"), record.get("payload")
        if not isinstance(payload, dict):  # an older rollout: the item is the record itself
            kind, payload = ("response_item" if "type" in record else "session_meta"), record
        if kind == "response_item":
            _item(built, line, record, payload)
        elif kind == "compacted" and isinstance(payload.get("message"), str):
            checkpoint(built, payload["message"], line, record)
        else:
            if kind == "session_meta":
                _session_meta(built, about, payload)
            elif kind == "turn_context" and isinstance(payload.get("model"), str):
                built.note_model(payload["model"])
            built.attach(line, record, known=isinstance(kind, str) and kind in _ENVELOPES)
    built.title = built.first_prompt
    built.finish()
    return Parsed(
        sessions=[built],
        tool_version=about.get("cli_version"),
        source_session_id=about.get("id"),
        records=records,
        extra={"cwd": about.get("cwd"), "originator": about.get("originator")},
    )


def _session_meta(built: Built, about: dict[str, Any], payload: Record) -> None:
    for key in ("id", "cli_version", "cwd", "originator"):
        if isinstance(payload.get(key), str):
            about.setdefault(key, payload[key])
    instructions = payload.get("instructions")
    if isinstance(instructions, str) and instructions and built.system_prompt is None:
        built.system_prompt = instructions


def _item(built: Built, line: int, record: Record, item: Record) -> None:
    kind = item.get("type") if isinstance(item.get("type"), str) else None  # None: unknown
    if kind == "message":
        _message(built, line, record, item)
    elif kind in _MODEL_SIDE:
        target = _assistant(built, line, record)
        if kind == "reasoning":
            target["metadata"].setdefault("reasoning", []).append(item)
        elif kind in _CALLS:
            _call(built, target, item)
        else:
            target["metadata"].setdefault("other_items", []).append(item)
    elif kind in _OUTPUTS:
        call_id = item.get("call_id")
        answered = built.result(call_id)
        content, details = _output(item.get("output"))
        content = content_of(built.counts, content, _TEXT_KINDS)  # a structured output's items
        tool: Message = {"role": "tool", "tool_call_id": call_id, "content": content}
        added = built.add(tool, line, record)
        if details is not None:
            added["metadata"]["output_metadata"] = details
        if not answered:
            added["metadata"]["orphan_result"] = True
    else:
        built.attach(line, record, known=False)


def _message(built: Built, line: int, record: Record, item: Record) -> None:
    role = item.get("role") if isinstance(item.get("role"), str) and item.get("role") else "user"
    content = item.get("content")
    text = text_of(content, _TEXT_KINDS)
    kept = content_of(built.counts, content, _TEXT_KINDS)
    if role == "assistant":
        target = _assistant(built, line, record)
        if text is not None:
            before = target.get("content")
            target["content"] = text if not before else f"{before}\n\n{text}"
        if isinstance(kept, list):  # a refusal, say: kept beside the turn's text
            other = [b for b in kept if not (isinstance(b, dict) and b.get("type") in _TEXT_KINDS)]
            target["metadata"].setdefault("other_blocks", []).extend(other)
        return
    message: Message = {"role": role, "content": kept}
    if role == "user" and text is not None and text.lstrip().startswith(_INJECTED_PREFIXES):
        message["synthetic"] = True  # context the CLI put in the user's place
    built.add(message, line, record)


def _assistant(built: Built, line: int, record: Record) -> Message:
    """The assistant message of the current model turn: the held one, or a new one."""
    held = built.held
    if held is not None and held["role"] == "assistant" and not held.get("summary"):
        return built.merge(line, record)
    message = built.add({"role": "assistant"}, line, record)
    if built.models:
        message["model"] = built.models[-1]
    return message


def _call(built: Built, target: Message, item: Record) -> None:
    call_id = item.get("call_id") or item.get("id")
    if not isinstance(call_id, str):
        call_id = f"call-{built.counts['tool_calls']}"
    name = item.get("name") if isinstance(item.get("name"), str) else item.get("type", "tool")
    if item.get("type") == "custom_tool_call" and isinstance(item.get("input"), str):
        for line in item["input"].splitlines():
            if line.startswith(_PATCH_HEADERS):
                built.wrote(line.split(":", 1)[1].strip())
    if item.get("type") == "custom_tool_call":
        call: dict[str, Any] = {
            "id": call_id,
            "type": "custom",
            "custom": {"name": name, "input": item.get("input", "")},
        }
    elif item.get("type") == "local_shell_call":
        call = function_call(call_id, "local_shell", item.get("action", {}))
    else:
        call = function_call(call_id, str(name), item.get("arguments", "{}"))
    target.setdefault("tool_calls", []).append(call)
    built.call(call)


def _output(output: object) -> tuple[object, object]:
    """A tool output as text, and the metadata Codex wraps some outputs with: shell and
    apply_patch outputs are a JSON string `{output, metadata}`; others are plain text."""
    if isinstance(output, dict) and "content" in output:  # the structured form
        return output.get("content"), {k: v for k, v in output.items() if k != "content"}
    if not isinstance(output, str) or not output.startswith("{"):
        return output, None
    try:
        inner = _decode(output)
    except (ValueError, RecursionError):  # plain text that starts with a brace
        return output, None
    if isinstance(inner, dict) and isinstance(inner.get("output"), str):
        return inner["output"], inner.get("metadata")
    return output, None
