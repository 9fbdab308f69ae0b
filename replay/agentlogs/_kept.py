"""The finished messages of a session being imported, kept packed until they are written.

Each message is packed (msgpack, in the engine's `Message` shape) into one buffer, so a kept
message costs about its JSON size, not a tree of dicts; the engine takes them as they are.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

import msgspec

from sessions import PackedMessages

_pack = msgspec.msgpack.Encoder().encode


class Kept:
    """Finished messages, each packed (msgpack, in the engine's `Message` shape) into one buffer
    and handed to the engine as `PackedMessages`, which its typed decoder checks field by field
    in C once: a message is never walked again as a tree of dicts, nor built as a struct here.
    `patches` adds metadata keys to a message already kept (a dangling call is known only at
    the end)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.ends = array("Q")
        self.patches: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.ends)

    def append(self, message: dict[str, Any]) -> None:
        self.buffer += _pack(message)
        self.ends.append(len(self.buffer))

    def insert(self, index: int, messages: list[dict[str, Any]]) -> None:
        """Put `messages` before the kept message `index` (a checkpoint placed where the agent's
        context started again, before messages kept already): the buffer is copied once."""
        start = self.ends[index - 1] if index else 0
        parts = [_pack(message) for message in messages]
        data = b"".join(parts)
        self.buffer[start:start] = data
        at, sizes = start, []
        for part in parts:
            at += len(part)
            sizes.append(at)
        moved = [end + len(data) for end in self.ends[index:]]
        self.ends = self.ends[:index] + array("Q", sizes) + array("Q", moved)
        self.patches = {
            (i + len(messages) if i >= index else i): patch for i, patch in self.patches.items()
        }

    def packed(self, index: int) -> bytes:
        """The kept message `index`, packed, with its patch applied."""
        start = self.ends[index - 1] if index else 0
        data = bytes(self.buffer[start : self.ends[index]])
        patch = self.patches.get(index)
        if patch is None:
            return data
        message = msgspec.msgpack.decode(data)
        message["metadata"].update(patch)
        return _pack(message)

    def line_of(self, index: int) -> int | None:
        """The first line the kept message `index` was read from."""
        lines = msgspec.msgpack.decode(self.packed(index))["metadata"]["source"]["lines"]
        return lines[0] if lines else None

    def batches(
        self, count_max: int, bytes_max: int, start: int = 0
    ) -> Iterator[tuple[int, PackedMessages]]:
        """(index of its first message, the batch) of consecutive kept messages from `start`:
        up to `count_max` of them, ending with the first that brings the batch to `bytes_max`."""
        ends, total = self.ends, len(self.ends)
        first = start
        while first < total:
            base = ends[first - 1] if first else 0
            stop = min(total, first + count_max)
            last = min(bisect_left(ends, base + bytes_max, first, stop) + 1, stop)
            if self.patches.keys().isdisjoint(range(first, last)):  # the usual case: one slice
                data = bytes(self.buffer[base : ends[last - 1]])
                yield first, PackedMessages(data, [end - base for end in ends[first:last]])
            else:
                parts, at = bytearray(), []
                for index in range(first, last):
                    parts += self.packed(index)
                    at.append(len(parts))
                yield first, PackedMessages(bytes(parts), at)
            first = last
