"""OpenAI-style `messages[]` trajectories into a session: SWE-agent `.traj` files (`history`),
mini-swe-agent outputs (`messages`), and any JSON holding an OpenAI chat `messages` array.

Messages keep their roles; the first system message becomes the session's system prompt; native
`tool_calls` pair with `tool` messages in order (`tool_call_id`, or SWE-agent's `tool_call_ids`),
so a reused id pairs with the latest call that made it. Whatever else the document holds (the
trajectory steps, `info`, the environment) is kept in the session's metadata. Positions in
`source` metadata are 1-based indexes into the messages array.
"""

from __future__ import annotations

from typing import Any

from replay.agentlogs._common import (
    ITEM_ARRAYS,
    Built,
    Message,
    Parsed,
    Record,
    Source,
    item_value,
    items,
    shape_checked,
)
from replay.agentlogs._content import content_of

NAME = "openai-chat"
_ARRAYS = ITEM_ARRAYS[::-1]  # SWE-agent's `history` first


def _messages_of(document: object) -> list[Any] | None:
    if isinstance(document, list):
        return document
    if isinstance(document, dict):
        for key in _ARRAYS:
            if isinstance(document.get(key), list):
                return list(document[key])
    return None


def looks_like_document(document: object) -> bool:
    """A JSON list of chat messages, or an object holding one under `history` or `messages`."""
    messages = _messages_of(document)
    if not messages:
        return False
    first = [item_value(m) for m in messages[:20]]
    return all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in first)


@shape_checked
def parse_document(source: Source, document: Any) -> Parsed:
    built = Built("main", source)
    messages = document if isinstance(document, list) else []
    if isinstance(document, dict):
        key = next(k for k in _ARRAYS if isinstance(document.get(k), list))
        messages = document[key]
        built.info["document"] = {k: v for k, v in document.items() if k != key}
    count = len(messages)
    for index, message in items(source, messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            built.attach(index, {"value": message}, known=False)
            continue
        _message(built, index, message)
    built.title = built.first_prompt
    built.finish()
    return Parsed(
        sessions=[built],
        tool_version=_tool_version(document),
        records=count,
        extra={"producer": _producer(document)},
    )


_FIELDS = frozenset(
    (
        "role",
        "content",
        "name",
        "tool_calls",
        "tool_call_id",
        "function_call",
        "refusal",
        "audio",
        "cache_control",
        "tool_call_ids",
        "agent",
        "message_type",
        "thought",
        "action",
        "is_demo",
        "extra",
    )
)
"""OpenAI chat message fields, with SWE-agent's and mini-swe-agent's; others count as unknown."""


def _message(built: Built, index: int, message: Record) -> None:
    built.check_fields(message, _FIELDS)
    role = message["role"] or "user"
    content = message.get("content")
    kept = content_of(built.counts, content)
    if role == "system" and built.system_prompt is None and built.length == 0 and type(kept) is str:
        built.system_prompt = kept
        built.attach(index, message)
        return
    out: Message = {"role": role, "content": kept}
    for key in ("name", "model"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    if message.get("is_demo") is True:
        out["synthetic"] = True
    calls = message.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and calls:
        out["tool_calls"] = [c for c in calls if isinstance(c, dict)]
    ids = message.get("tool_call_ids")
    call_ids = [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
    if isinstance(message.get("tool_call_id"), str):
        call_ids = [message["tool_call_id"], *call_ids]
    if role == "tool" and call_ids:
        out["tool_call_id"] = call_ids[0]
    added = built.add(out, index, message)
    if message.get("is_demo") is True:
        added["metadata"]["is_demo"] = True
    for call in added.get("tool_calls", []):
        built.call(call)
    if role == "tool":
        answered = [built.result(call_id) for call_id in call_ids] or [built.result(None)]
        if len(call_ids) > 1:
            added["metadata"]["tool_call_ids"] = call_ids
        if not all(answered):
            added["metadata"]["orphan_result"] = True


def _tool_version(document: Any) -> str | None:
    info = document.get("info") if isinstance(document, dict) else None
    if isinstance(info, dict):
        for key in ("swe_agent_version", "mini_version", "version"):
            if isinstance(info.get(key), str):
                return str(info[key])
    return None


def _producer(document: Any) -> str:
    if isinstance(document, dict) and "history" in document and "trajectory" in document:
        return "swe-agent"
    if (
        isinstance(document, dict)
        and isinstance(document.get("info"), dict)
        and "messages" in document
    ):
        return "mini-swe-agent"
    return "openai-messages"
