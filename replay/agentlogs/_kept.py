"""The finished messages of a session being imported, kept packed until they are written.

Each message is packed (msgpack, in the engine's `Message` shape) into one buffer, so a kept
message costs about its JSON size, not a tree of dicts; the engine takes them as they are.
"""

from __future__ import annotations

from array import array
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

    def _packed(self, index: int) -> bytes:
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
        lines = msgspec.msgpack.decode(self._packed(index))["metadata"]["source"]["lines"]
        return lines[0] if lines else None

    def batches(self, count_max: int, bytes_max: int) -> Iterator[tuple[int, PackedMessages]]:
        """(index of its first message, the batch) of consecutive kept messages."""
        first, parts, ends = 0, bytearray(), []
        for index in range(len(self.ends)):
            parts += self._packed(index)
            ends.append(len(parts))
            if len(ends) >= count_max or len(parts) >= bytes_max:
                yield first, PackedMessages(bytes(parts), ends)
                first, parts, ends = index + 1, bytearray(), []
        if ends:
            yield first, PackedMessages(bytes(parts), ends)
