"""`export_messages`: a session's transcript (or its context view) as a model API's request body.

Three shapes: OpenAI Chat Completions (`openai-chat`: `messages[]`), Anthropic Messages
(`anthropic-messages`: `system` and alternating `messages[]` of content blocks) and OpenAI
Responses (`responses`: `instructions` and `input[]` items). Only what the API takes is written:
keys the engine keeps beside a message (`usage`, `model`, `metadata`, ...) are left out, and the
caller adds the model and its parameters. It reads the store and never writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sessions import InvalidArgumentError, SessionStore

MESSAGE_FORMATS = ("openai-chat", "anthropic-messages", "responses")
_CHAT_ROLES = frozenset(("system", "developer", "user", "assistant", "tool"))

Message = dict[str, Any]


def export_messages(
    store: SessionStore, session_id: str, format: str = "openai-chat", *, context: bool = False
) -> dict[str, Any]:
    """The session's messages as the request body `format` takes (one of `MESSAGE_FORMATS`),
    system prompt included, tool calls and results in that API's own form. With `context`, the
    context view (what the next model call would see: from the latest checkpoint on) instead of
    the whole transcript. Raises `UnknownSessionError` for an unknown id."""
    build = _BUILDERS.get(format)
    if build is None:
        raise InvalidArgumentError(
            f"export_messages: `format` must be one of {', '.join(MESSAGE_FORMATS)}, got {format!r}"
        )
    store.length(session_id)  # raises the engine's UnknownSessionError for an unknown id
    snapshot = store.snapshot(session_id) or {}
    messages = store.context(session_id) if context else snapshot.get("transcript", [])
    return build(snapshot.get("system_prompt"), messages)


def _text(content: object) -> str:
    """Content as text: a string as it is; the text of text blocks; anything else as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        ]
        if texts and len(texts) == len(content):
            return "\n\n".join(texts)
    return json.dumps(content, ensure_ascii=False)


def _call_parts(call: Any) -> tuple[str, str, str, bool]:
    """(id, name, arguments or input text, is a custom/freeform call) of a stored tool call."""
    if not isinstance(call, dict):
        return "", "unknown", json.dumps(call), False
    call_id = str(call.get("id") or "")
    if call.get("type") == "custom" and isinstance(call.get("custom"), dict):
        custom = call["custom"]
        return call_id, str(custom.get("name") or "unknown"), _text(custom.get("input")), True
    found = call.get("function")
    function: dict[str, Any] = found if isinstance(found, dict) else call
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return call_id, str(function.get("name") or "unknown"), arguments, False


# OpenAI Chat Completions


def _openai_chat(system: str | None, messages: list[Message]) -> dict[str, Any]:
    out: list[Message] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        role = message["role"] if message["role"] in _CHAT_ROLES else "user"
        item: Message = {"role": role}
        if role == "tool":
            item["tool_call_id"] = str(message.get("tool_call_id") or "")
            item["content"] = _text(message.get("content"))
        elif role == "assistant":
            item["content"] = _text(message["content"]) if message.get("content") else None
            calls = [_chat_call(c) for c in message.get("tool_calls") or []]
            if calls:
                item["tool_calls"] = calls
        else:
            item["content"] = _text(message.get("content"))
        out.append(item)
    return {"messages": out}


def _chat_call(call: Any) -> dict[str, Any]:
    call_id, name, arguments, custom = _call_parts(call)
    if custom:
        return {"id": call_id, "type": "custom", "custom": {"name": name, "input": arguments}}
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# Anthropic Messages


def _anthropic(system: str | None, messages: list[Message]) -> dict[str, Any]:
    turns: list[Message] = []
    for message in messages:
        role, blocks = _anthropic_blocks(message)
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)  # the API alternates user and assistant
        else:
            turns.append({"role": role, "content": blocks})
    body: dict[str, Any] = {"messages": turns}
    if system:
        body["system"] = system
    return body


def _anthropic_blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    role = message["role"]
    if role == "tool":
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": str(message.get("tool_call_id") or ""),
            "content": _text(message.get("content")),
        }
        if (message.get("metadata") or {}).get("is_error") is True:
            result["is_error"] = True
        return "user", [result]
    text = _text(message.get("content"))
    if role != "assistant":
        prefix = "" if role == "user" else f"[{role}] "
        return "user", [{"type": "text", "text": prefix + text}]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for call in message.get("tool_calls") or []:
        call_id, name, arguments, custom = _call_parts(call)
        blocks.append(
            {"type": "tool_use", "id": call_id, "name": name, "input": _input(arguments, custom)}
        )
    return "assistant", blocks or [{"type": "text", "text": ""}]


def _input(arguments: str, custom: bool) -> dict[str, Any]:
    if custom:
        return {"input": arguments}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


# OpenAI Responses


def _responses(system: str | None, messages: list[Message]) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    custom_ids: set[str] = set()
    for message in messages:
        role = message["role"]
        if role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            kind = "custom_tool_call_output" if call_id in custom_ids else "function_call_output"
            items.append(
                {"type": kind, "call_id": call_id, "output": _text(message.get("content"))}
            )
            continue
        if role not in ("user", "assistant", "system", "developer"):
            role = "user"
        text = _text(message.get("content"))
        if text or role != "assistant" or not message.get("tool_calls"):
            items.append({"type": "message", "role": role, "content": text})
        for call in message.get("tool_calls") or []:
            call_id, name, arguments, custom = _call_parts(call)
            if custom:
                custom_ids.add(call_id)
                items.append(
                    {
                        "type": "custom_tool_call",
                        "call_id": call_id,
                        "name": name,
                        "input": arguments,
                    }
                )
            else:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call_id,
                        "name": name,
                        "arguments": arguments,
                    }
                )
    body: dict[str, Any] = {"input": items}
    if system:
        body["instructions"] = system
    return body


_BUILDERS: dict[str, Callable[[str | None, list[Message]], dict[str, Any]]] = {
    "openai-chat": _openai_chat,
    "anthropic-messages": _anthropic,
    "responses": _responses,
}
