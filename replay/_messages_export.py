"""`export_messages`: a session's transcript (or its context view) as a model API's request body.

Three shapes: OpenAI Chat Completions (`openai-chat`: `messages[]`), Anthropic Messages
(`anthropic-messages`: `system` and alternating `messages[]` of content blocks) and OpenAI
Responses (`responses`: `instructions` and `input[]` items). An image in block content (in the
shape of any log read: Anthropic, OpenAI chat or Responses, pi, Gemini) is written as the
target API's image part wherever that API takes one. Only what the API takes is written:
keys the engine keeps beside a message (`usage`, `model`, `metadata`, ...) are left out, and the
caller adds the model and its parameters. It reads the store and never writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from sessions import InvalidArgumentError, SessionStore

MESSAGE_FORMATS = ("openai-chat", "anthropic-messages", "responses")
_CHAT_ROLES = frozenset(("system", "developer", "user", "assistant", "tool"))
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+);base64,(.*)", re.DOTALL)
_ANTHROPIC_IMAGE_TYPES = frozenset(("image/jpeg", "image/png", "image/gif", "image/webp"))

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
            item["content"] = _chat_content(message.get("content"), role == "user")
        out.append(item)
    return {"messages": out}


def _chat_content(content: object, images: bool) -> str | list[dict[str, Any]]:
    """Content as Chat Completions takes it: text, or (in a user message, the only one whose
    parts may be images) text and `image_url` parts when it holds an image."""
    parts = _parts(content) if images else None
    if parts is None:
        return _text(content)
    return [
        {"type": "image_url", "image_url": {"url": value}}
        if kind == "image"
        else {"type": "text", "text": value}
        for kind, value, _ in parts
    ]


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
            "content": _anthropic_content(message.get("content")) or _text(message.get("content")),
        }
        if (message.get("metadata") or {}).get("is_error") is True:
            result["is_error"] = True
        return "user", [result]
    text = _text(message.get("content"))
    if role != "assistant":
        prefix = "" if role == "user" else f"[{role}] "
        carried = _anthropic_content(message.get("content"))
        if carried is not None:
            return "user", ([{"type": "text", "text": prefix}] if prefix else []) + carried
        return "user", [{"type": "text", "text": prefix + text}]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for call in message.get("tool_calls") or []:
        call_id, name, arguments, custom = _call_parts(call)
        blocks.append(
            {"type": "tool_use", "id": call_id, "name": name, "input": _input(arguments, custom)}
        )
    return "assistant", blocks or [{"type": "text", "text": ""}]


def _anthropic_content(content: object) -> list[dict[str, Any]] | None:
    """Content holding an image as Anthropic blocks (text and `image`, with a base64 or a url
    source); an image the API cannot take (another media type) as the JSON of its block. None
    when the content holds no image."""
    parts = _parts(content)
    if parts is None:
        return None
    blocks: list[dict[str, Any]] = []
    for kind, value, block in parts:
        source: dict[str, Any] | None = None
        found = _DATA_URL.fullmatch(value) if kind == "image" else None
        if found is not None and found.group(1) in _ANTHROPIC_IMAGE_TYPES:
            source = {"type": "base64", "media_type": found.group(1), "data": found.group(2)}
        elif kind == "image" and value.startswith(("https://", "http://")):
            source = {"type": "url", "url": value}
        if source is not None:
            blocks.append({"type": "image", "source": source})
        elif kind == "text" and value:  # the API refuses an empty text block
            blocks.append({"type": "text", "text": value})
        elif kind == "image":
            blocks.append({"type": "text", "text": json.dumps(block, ensure_ascii=False)})
    return blocks


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
            output = _responses_content(message.get("content"))
            items.append({"type": kind, "call_id": call_id, "output": output})
            continue
        if role not in ("user", "assistant", "system", "developer"):
            role = "user"
        text = _text(message.get("content"))
        if role != "assistant" and _parts(message.get("content")) is not None:
            content = _responses_content(message.get("content"))
            items.append({"type": "message", "role": role, "content": content})
        elif text or role != "assistant" or not message.get("tool_calls"):
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


def _responses_content(content: object) -> str | list[dict[str, Any]]:
    """Content as a Responses input or tool output: text, or `input_text` and `input_image`
    parts when it holds an image."""
    parts = _parts(content)
    if parts is None:
        return _text(content)
    return [
        {"type": "input_image", "image_url": value, "detail": "auto"}
        if kind == "image"
        else {"type": "input_text", "text": value}
        for kind, value, _ in parts
    ]


# Images in block content


def _parts(content: object) -> list[tuple[str, str, object]] | None:
    """Block content holding an image as its parts, each (kind, value, block): ("image", its
    URL or data URL) or ("text", its text; any other block as its JSON). None when the content
    is not a list or holds no image (it is written as text)."""
    if not isinstance(content, list):
        return None
    parts: list[tuple[str, str, object]] = []
    for block in content:
        url = _image_url(block)
        if url is not None:
            parts.append(("image", url, block))
        elif isinstance(block, dict) and isinstance(block.get("text"), str):
            parts.append(("text", block["text"], block))
        else:
            text = block if isinstance(block, str) else json.dumps(block, ensure_ascii=False)
            parts.append(("text", text, block))
    return parts if any(kind == "image" for kind, _, _ in parts) else None


def _image_url(block: object) -> str | None:
    """The URL (base64 data as a data URL) of an image block in any shape a log read writes:
    Anthropic's `image` (base64 or url source), OpenAI chat's `image_url`, Responses'
    `input_image`, pi's `image` (`data`, `mimeType`), Gemini's `inlineData`; None otherwise."""
    if not isinstance(block, dict):
        return None
    kind, source = block.get("type"), block.get("source")
    if kind == "image" and isinstance(source, dict):
        if source.get("type") == "base64":
            return _data_url(source.get("media_type"), source.get("data"))
        url = source.get("url")
        return url if isinstance(url, str) else None
    if kind == "image":
        return _data_url(block.get("mimeType"), block.get("data"))
    if kind == "image_url":
        found = block.get("image_url")
        url = found.get("url") if isinstance(found, dict) else found
        return url if isinstance(url, str) else None
    if kind == "input_image":
        url = block.get("image_url")
        return url if isinstance(url, str) else None
    inline = block.get("inlineData")
    if isinstance(inline, dict) and str(inline.get("mimeType")).startswith("image/"):
        return _data_url(inline.get("mimeType"), inline.get("data"))
    return None


def _data_url(media_type: object, data: object) -> str | None:
    if isinstance(media_type, str) and isinstance(data, str):
        return f"data:{media_type};base64,{data}"
    return None


_BUILDERS: dict[str, Callable[[str | None, list[Message]], dict[str, Any]]] = {
    "openai-chat": _openai_chat,
    "anthropic-messages": _anthropic,
    "responses": _responses,
}
