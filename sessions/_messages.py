"""Messages at the edge of the engine: plain dicts in and out, `Message` structs in the log.

A message dict needs a non-empty `role`, or an `item` (a value stored verbatim, whose entry's
role is then ``item`` unless given); the fields the catalog names are type-checked; any other key is
kept verbatim in `extra` and comes back as a top-level key, so nothing a caller stored is dropped.
An `item` comes back equal in value to what was given, bytes as bytes. This module owns that
mapping and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

import msgspec

from eventlog import (
    InvalidArgumentError,
    LimitExceededError,
    check_encodable,
    check_plain,
    convert,
    limits,
    to_builtins,
)
from eventlog import events as ev
from eventlog.limits import check_at_most

_KNOWN = frozenset(
    (
        "role",
        "content",
        "name",
        "tool_call_id",
        "tool_calls",
        "files",
        "usage",
        "model",
        "synthetic",
        "summary",
        "metadata",
        "item",
    )
)
ITEM_ROLE = "item"
"""The role of an item entry whose caller named none."""


_FILE_FIELDS = frozenset(("path", "name", "mime_type", "size_bytes"))
_USAGE_FIELDS = frozenset(
    ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_tokens", "cache_write_tokens")
)


def _split(value: object, known: frozenset[str]) -> object:
    """A nested record's named fields, with every other key moved under `extra`."""
    if not isinstance(value, Mapping):
        return value  # the conversion below names the wrong type and where it is
    named = {key: item for key, item in value.items() if key in known}
    extra = {key: item for key, item in value.items() if key not in known}
    if extra:
        named["extra"] = extra
    return named


_ROLE_AND_CONTENT = frozenset(("role", "content"))


def plain_message(message: object) -> ev.Message | None:
    """The `Message` of the most common shape, a plain dict holding a role and text, built
    directly (a third of the cost of `to_message`); None for any other shape. Every field of the
    result is an exact, immutable `str` or None, so its events may be appended `checked`."""
    if type(message) is dict and message.keys() <= _ROLE_AND_CONTENT:
        role, content = message.get("role"), message.get("content")
        if type(role) is str and role.strip() and (content is None or type(content) is str):
            return ev.Message(role=role, content=content)
    return None


_ROLE_AND_ITEM = frozenset(("role", "item"))


def item_message(message: object, *, where: str) -> tuple[ev.Message, int] | None:
    """The `Message` of an item entry (a dict of an `item` and at most a `role`), its item
    checked once (`check_item`) and the message built directly, with an upper bound of its
    encoded size; None for any other shape (`to_message` then takes it the long way, and
    refuses what is wrong with it there)."""
    if type(message) is not dict or not message.keys() <= _ROLE_AND_ITEM:
        return None
    item, role = message.get("item"), message.get("role")
    if role is None:
        role = ITEM_ROLE
    if item is None or type(role) is not str or not role.strip():
        return None
    size = check_item(item, where=f"{where}: `item`")
    return ev.Message(role=role, item=item), size + 4 * len(role) + 16


def to_message(message: object, *, where: str) -> ev.Message:
    """Validate a caller's message dict and turn it into a `Message`."""
    plain = plain_message(message)
    if plain is not None:
        return plain
    item = item_message(message, where=where)
    if item is not None:
        return item[0]
    if isinstance(message, ev.Message):
        return message
    if not isinstance(message, Mapping):
        raise InvalidArgumentError(
            f"{where}: a message must be a dict, got {type(message).__name__}"
        )
    role = message.get("role")
    if role is None and message.get("item") is not None:
        role = ITEM_ROLE
        message = {**message, "role": role}
        check_item(message["item"], where=f"{where}: `item`")
    elif message.get("item") is not None:
        check_item(message["item"], where=f"{where}: `item`")
    if not isinstance(role, str) or not role.strip():
        raise InvalidArgumentError(
            f"{where}: a message needs a non-empty string `role` (or an `item`), got {role!r}"
        )
    for key in message:
        if not isinstance(key, str):
            raise InvalidArgumentError(f"{where}: message keys must be strings, got {key!r}")
    # Every field but a verbatim `item` (checked above, bytes and aware datetimes kept) is JSON.
    check_plain({k: v for k, v in message.items() if k != "item"}, what=f"{where}: message")
    known = {key: value for key, value in message.items() if key in _KNOWN and value is not None}
    extra = {key: value for key, value in message.items() if key not in _KNOWN}
    files = known.get("files")
    if isinstance(files, list):
        check_at_most(
            len(files),
            limits.files_per_message_max,
            "files_per_message_max",
            f"{where}: files attached to one message",
        )
        known["files"] = [
            {"path": item} if isinstance(item, str) else _split(item, _FILE_FIELDS)
            for item in files
        ]
    usage = known.get("usage")
    if isinstance(usage, Mapping):
        known["usage"] = _split(usage, _USAGE_FIELDS)
    if extra:
        known["extra"] = extra
    return convert(known, ev.Message, what=f"{where}: message")


_SCALARS = (str, int, float, bool, bytes, bytearray, type(None))
_LEAVES = frozenset((str, int, bool, bytes, bytearray, type(None)))
"""Types whose values are kept exactly as they are: a value of exactly one of them needs no look
(a float does: it may not be finite)."""

_Path = tuple["_Path | None", object] | None
"""Where a value sits inside an item: (where its container sits, its key or index), None at the
top; turned into text only for an error message."""


def check_item(value: object, *, where: str) -> int:
    """Refuse an item that would not read back equal in value: only None, bools, numbers,
    strings, bytes, lists, dicts with string keys and timezone-aware datetimes are kept
    exactly (a tuple would come back a list, a naive datetime a string). Returns its encoded
    size."""
    stack: list[tuple[object, _Path, int]] = [(value, None, 0)]
    leaves = _LEAVES
    while stack:
        current, path, depth = stack.pop()
        if isinstance(current, float) and not math.isfinite(current):
            raise InvalidArgumentError(f"{where}{_text(path)}: {current} is not a JSON number")
        if isinstance(current, _SCALARS):
            continue
        if depth >= limits.value_depth_max:
            raise LimitExceededError(
                f"{where}{_text(path)}: nesting depth",
                "value_depth_max",
                limits.value_depth_max,
                depth + 1,
            )
        if isinstance(current, datetime):
            if current.tzinfo is None:
                raise InvalidArgumentError(
                    f"{where}{_text(path)}: a datetime needs a timezone to be kept exactly"
                )
        elif type(current) is list:
            stack.extend(
                (v, (path, i), depth + 1) for i, v in enumerate(current) if type(v) not in leaves
            )
        elif type(current) is dict:
            for key, item in current.items():
                if not isinstance(key, str):
                    raise InvalidArgumentError(
                        f"{where}{_text(path)}: keys must be strings, "
                        f"got {type(key).__name__} {key!r}"
                    )
                if type(item) not in leaves:
                    stack.append((item, (path, key), depth + 1))
        else:
            raise InvalidArgumentError(
                f"{where}{_text(path)}: a {type(current).__name__} would not come back as it went "
                "in (use None, bool, int, float, str, bytes, list, dict with str keys, or an "
                "aware datetime)"
            )
    return check_encodable(value, what=where, plain=False)


def _text(path: _Path) -> str:
    """`path` as the subscripts that reach the value, e.g. ``['content'][0]``."""
    parts: list[str] = []
    while path is not None:
        path, key = path
        parts.append(f"[{key!r}]")
    return "".join(reversed(parts))


_ITEM_ENCODER = msgspec.msgpack.Encoder()
_ITEM_DECODER = msgspec.msgpack.Decoder()


def item_copy(value: Any) -> Any:
    """A fresh copy of a stored item, bytes and datetimes kept as they are."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    return _ITEM_DECODER.decode(_ITEM_ENCODER.encode(value))


def item_copier(fresh: bool) -> Callable[[Any], Any]:
    """How to hand out the items of structs `message_structs` returned: as they are when they were
    decoded for that read alone (`fresh`), else copied (structs from the cache are shared)."""
    return _as_is if fresh else item_copy


def _as_is(value: Any) -> Any:
    return value


def to_dict(message: ev.Message) -> dict[str, Any]:
    """A fresh plain dict of a message: its set fields, with `extra` keys back at the top level."""
    data: dict[str, Any] = to_builtins(message)
    _restore(data)
    if message.item is not None:
        data["item"] = item_copy(message.item)
    return data


def to_dicts(messages: list[ev.Message], *, fresh: bool = False) -> list[dict[str, Any]]:
    """`to_dict` of a whole transcript, converted in one call. `fresh`: the messages were just
    decoded for this call and nobody else holds them, so their items are handed out as they are
    instead of copied."""
    data: list[dict[str, Any]] = to_builtins(messages)
    for item, message in zip(data, messages, strict=True):
        # `role` is always there: role and content alone need nothing restored, and any
        # other key makes more than two, or two without content.
        if len(item) > 2 or "content" not in item:
            _restore(item)
            if message.item is not None:
                item["item"] = message.item if fresh else item_copy(message.item)
    return data


def _restore(data: dict[str, Any]) -> None:
    _flatten(data)
    for item in data.get("files", ()):
        _flatten(item)
    if "usage" in data:
        _flatten(data["usage"])


def _flatten(data: dict[str, Any]) -> None:
    extra = data.pop("extra", None)
    if extra:
        for key, value in extra.items():
            data.setdefault(key, value)


def text_of(content: object) -> str:
    """The text a token counter sees: string content, or the text inside content blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                for key in ("text", "content", "input", "output"):
                    value = block.get(key)
                    if isinstance(value, str):
                        parts.append(value)
            elif isinstance(block, str):
                parts.append(block)
    return "\n".join(parts)


media_tokens_estimate: Final = 1_600
"""What one image, document or file attachment is counted as: about what the largest image a
provider accepts costs (Anthropic: about 1,600 tokens); counting it as nothing let a context of
screenshots overflow its window unseen."""

_MEDIA_BLOCKS = frozenset(
    ("image", "image_url", "input_image", "document", "file", "input_file", "audio", "input_audio")
)


def _texts(value: object, parts: list[str]) -> int:
    """Append the text inside `value` (content, blocks, nested tool-result blocks) to `parts`;
    returns the tokens of the media blocks in it."""
    if isinstance(value, str):
        parts.append(value)
        return 0
    if isinstance(value, list):
        return sum(_texts(item, parts) for item in value)
    if not isinstance(value, Mapping):
        return 0
    if value.get("type") in _MEDIA_BLOCKS:
        return media_tokens_estimate
    media = 0
    for key in ("text", "content", "output", "input", "arguments"):
        found = value.get(key)
        if isinstance(found, (str, list)) or (key == "content" and isinstance(found, Mapping)):
            media += _texts(found, parts)
        elif found is not None:
            parts.append(msgspec.json.encode(found, enc_hook=repr).decode())
    return media


def _text_tokens(text: str) -> int:
    # About four ASCII characters make a token; any other character (CJK, emoji, most accented
    # letters) takes one or more, so counting it as a quarter under-counted those texts 4x.
    ascii_chars = len(text) if text.isascii() else len(text.encode("ascii", "ignore"))
    return (ascii_chars + 3) // 4 + (len(text) - ascii_chars)


def default_token_counter(message: Mapping[str, Any]) -> int:
    """About four ASCII characters per token and one per other character, a fixed estimate per
    image, document or file: no tokenizer needed, close enough for thresholds. An item entry
    counts as its JSON."""
    parts: list[str] = []
    item = message.get("item")
    if item is not None:
        parts.append(msgspec.json.encode(item, enc_hook=repr).decode())
    media = _texts(message.get("content"), parts)
    calls = message.get("tool_calls")
    if calls:
        parts.append(str(calls))
    for ref in message.get("files") or ():
        size = ref.get("size_bytes") if isinstance(ref, Mapping) else None
        mime = ref.get("mime_type") if isinstance(ref, Mapping) else None
        textual = isinstance(mime, str) and not mime.startswith(("image/", "audio/"))
        if textual and type(size) is int and size >= 0:
            media += (size + 3) // 4
        else:
            media += media_tokens_estimate
    return _text_tokens("".join(parts)) + media


def tool_use_ids(message: ev.Message) -> set[str]:
    """The ids of the tool calls a message makes: its `tool_calls`, and `tool_use` blocks."""
    calls: list[object] = list(message.tool_calls or ())
    if isinstance(message.content, list):
        calls.extend(
            block
            for block in message.content
            if isinstance(block, Mapping) and block.get("type") == "tool_use"
        )
    return {
        call["id"]
        for call in calls
        if isinstance(call, Mapping) and isinstance(call.get("id"), str)
    }


def tool_result_ids(message: ev.Message) -> set[str]:
    """The ids of the tool calls a message answers: its `tool_call_id`, and the `tool_use_id` of
    its `tool_result` blocks (a user message in the Anthropic format)."""
    found = {message.tool_call_id} if message.tool_call_id is not None else set()
    if isinstance(message.content, list):
        for block in message.content:
            is_result = isinstance(block, Mapping) and block.get("type") == "tool_result"
            if is_result and isinstance(block.get("tool_use_id"), str):
                found.add(block["tool_use_id"])
    return found


def is_tool_result(message: ev.Message) -> bool:
    """Whether a message is a tool result in the chat form (role `tool`, or a `tool_call_id`)."""
    return message.role == "tool" or message.tool_call_id is not None


def answers_call(message: ev.Message) -> bool:
    """Whether a message is (or holds) a tool result, so must stay after the call it answers:
    `is_tool_result`, or a message holding `tool_result` blocks (the Anthropic form)."""
    if is_tool_result(message):
        return True
    return isinstance(message.content, list) and any(
        isinstance(block, Mapping) and block.get("type") == "tool_result"
        for block in message.content
    )
