"""`inject_many`'s messages as `messages_injected` events, and which message an error is about.

A refusal names its message by `index` (its place in the caller's list), so a caller such as the
seeder finds the bad one without parsing the error's text or retrying message by message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from eventlog import (
    InvalidArgumentError,
    SessionLogError,
    check_plain,
    limits,
)
from eventlog import events as ev
from eventlog.limits import check_at_most
from sessions._messages import check_item, item_message, plain_message, to_message

_SIZE_ENCODER = msgspec.msgpack.Encoder()
# A batch stops well short of `event_bytes_max`: the sizes below are estimates, and the envelope
# and the field names come on top.
_BATCH_BYTES_MAX = limits.event_bytes_max // 2
_MESSAGE_DECODER = msgspec.msgpack.Decoder(ev.Message)


class PackedMessages:
    """Messages handed to `inject_many` already encoded: each a msgpack map in the shape of the
    event catalog's `Message`, one after another in `data`, message `i` ending at `ends[i]`.
    The engine decodes them with its own typed decoder, so every field it keeps is exactly its
    declared type and shared with nobody: their records need not be read back once encoded,
    and a message's size is its length. A reader that keeps its messages packed (the agent-log
    importer) hands them over without building them as structs first."""

    __slots__ = ("data", "ends")

    def __init__(self, data: bytes, ends: Sequence[int]) -> None:
        self.data = data
        self.ends = ends

    def __len__(self) -> int:
        return len(self.ends)


def _unpacked(packed: PackedMessages) -> tuple[list[ev.Message], list[int]]:
    """The messages of `packed` and their sizes; a refusal names the message by its `index`."""
    parsed: list[ev.Message] = []
    sizes: list[int] = []
    data = packed.data
    if not isinstance(data, bytes):
        raise InvalidArgumentError(f"inject_many: packed data must be bytes, got {type(data)}")
    view, decode, start = memoryview(data), _MESSAGE_DECODER.decode, 0
    for index, end in enumerate(packed.ends):
        where = f"inject_many: messages[{index}]"
        if type(end) is not int or not start < end <= len(data):
            raise InvalidArgumentError(f"{where}: packed end {end!r} out of order", index=index)
        try:
            message = decode(view[start:end])
        except (ValueError, RecursionError) as exc:  # malformed, or a field of a wrong type
            raise InvalidArgumentError(
                f"{where}: not a packed message: {exc}", index=index
            ) from exc
        if not message.role.strip() or message.sealed is not None:
            raise InvalidArgumentError(
                f"{where}: a message needs a non-empty `role` and no `sealed`", index=index
            )
        _check_open_fields(message, where, index)
        if message.files is not None:
            check_at_most(
                len(message.files),
                limits.files_per_message_max,
                "files_per_message_max",
                f"{where}: files attached to one message",
                index=index,
            )
        parsed.append(message)
        sizes.append(end - start)
        start = end
    if start != len(data):
        raise InvalidArgumentError("inject_many: packed data goes on past its last message")
    return parsed, sizes


def _check_open_fields(message: ev.Message, where: str, index: int) -> None:
    """Hold the fields of any type of a decoded message to what the dict path lets in
    (`to_message`): plain data, and for `item` what reads back equal. The decoder takes any
    msgpack there (an extension type, nesting past `value_depth_max`, NaN), which would be
    written and then fail to read back. Only fields present are walked: text costs nothing."""
    fields = {
        name: value
        for name, value in (
            ("content", None if isinstance(message.content, str) else message.content),
            ("tool_calls", message.tool_calls),
            ("metadata", message.metadata or None),
            ("extra", message.extra or None),
        )
        if value is not None
    }
    try:
        if message.item is not None:
            check_item(message.item, where=f"{where}: `item`")
        if fields:
            check_plain(fields, what=f"{where}: message")
    except SessionLogError as exc:
        exc.index = index
        raise


def message_events(
    messages: Sequence[Any] | PackedMessages, key: str | None
) -> tuple[list[ev.Event], int, bool]:
    """The events recording `messages` (the first one carrying the idempotency `key`), how many
    messages they hold, and whether every message was of the plain, pre-checked shape (or
    decoded here from `PackedMessages`)."""
    if isinstance(messages, PackedMessages):
        parsed, sizes = _unpacked(messages)
        return _keyed(_batches(parsed, sizes), key), len(parsed), True
    parsed = []
    sizes = []
    checked = True
    for index, message in enumerate(messages):
        plain = plain_message(message)
        if plain is None:
            checked = False
            rich, size = _indexed_message(message, index)
            parsed.append(rich)
            sizes.append(size)
        else:
            parsed.append(plain)
            text = plain.content if isinstance(plain.content, str) else None
            sizes.append(_text_bytes(text) + len(plain.role))
    return _keyed(_batches(parsed, sizes), key), len(parsed), checked


def _keyed(events: list[ev.Event], key: str | None) -> list[ev.Event]:
    """`events`, the first one carrying the idempotency `key`."""
    if key is not None and events:
        first = events[0]
        assert isinstance(first, ev.MessagesInjected)
        events[0] = ev.MessagesInjected(messages=first.messages, idempotency_key=key)
    return events


def blame_message(error: SessionLogError, events: list[ev.Event], first_event: int) -> None:
    """Give `error`, raised appending `events` from `first_event` on (its `index` counting from
    there), the index of the message it refused when the failing event holds that one alone."""
    if error.index is None:
        return
    failed = first_event + error.index
    error.index = None
    event = events[failed]
    if isinstance(event, ev.MessagesInjected) and len(event.messages) == 1:
        before = events[:failed]
        error.index = sum(len(e.messages) for e in before if isinstance(e, ev.MessagesInjected))


def _text_bytes(text: str | None) -> int:
    """An upper bound of the UTF-8 size of `text`, without encoding it."""
    if not text:
        return 0
    return len(text) if text.isascii() else 4 * len(text)


def _indexed_message(message: object, index: int) -> tuple[ev.Message, int]:
    """`to_message` for `messages[index]` of a batch, and its encoded size (an item entry's
    bounded from its item's, which its check measured already); a refusal carries that
    `index`, and as `where` the prefix its message starts with."""
    where = f"inject_many: messages[{index}]"
    try:
        item = item_message(message, where=where)
        if item is not None:
            return item
        rich = to_message(message, where=where)
        try:
            return rich, len(_SIZE_ENCODER.encode(rich))
        except UnicodeError as exc:  # a lone surrogate in a dict key, which `to_message` let by
            raise InvalidArgumentError(f"{where}: message cannot be encoded: {exc}") from exc
    except SessionLogError as exc:
        exc.index, exc.where = index, where
        raise


def _batches(messages: list[ev.Message], sizes: list[int]) -> list[ev.Event]:
    """`messages_injected` events of consecutive messages, each within the count and size bounds."""
    events: list[ev.Event] = []
    start, total = 0, 0
    for index, size in enumerate(sizes):
        full = index - start >= limits.messages_per_event_max
        if index > start and (full or total + size > _BATCH_BYTES_MAX):
            events.append(ev.MessagesInjected(messages=messages[start:index]))
            start, total = index, 0
        total += size + 16
    if start < len(messages):
        events.append(ev.MessagesInjected(messages=messages[start:]))
    return events
