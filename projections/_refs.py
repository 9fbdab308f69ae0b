"""Message references: where a transcript's messages are, packed into chunks of segments.

A transcript is a list of ranges of segments; a segment is a run of packed (position, index)
references stored in chunks of `REFS_PER_CHUNK` under `g/`. Appending extends the last segment in
place when the transcript ends where it ends, or starts a new one (a fork got there first), so a
segment shared by forks never changes under any of them. Reading resolves references to the
messages of the events they point at, each event read and checked once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

import msgspec

from eventlog import IntegrityError, LogView, Transaction
from eventlog import events as ev
from projections import _keys as keys
from projections import _kv
from projections import _state as st
from projections._state import Transcript


def tail_chunk(tx: Transaction, key: bytes, end: int) -> bytes | None:
    """The references in the chunk `key` that slot `end` of its segment falls in, if `end` is
    where the segment ends, so appending there extends it in place; None if the segment goes on
    (a fork that shares it got there first). A segment's length is its last chunk's: no key of
    its own."""
    state: _kv.Pending | None = tx.projector_state  # type: ignore[assignment]
    cached = None if state is None else state.cache.get(key)
    value = cached if cached is not None else _kv.get(tx, key)
    used = (end % st.REFS_PER_CHUNK) * st.REF_BYTES
    if value is None and used == 0:
        return b""
    if value is not None and len(value) >= used:
        return bytes(value) if len(value) == used else None
    raise IntegrityError(
        f"projection: reference chunk {key!r} holds {0 if value is None else len(value)} bytes, "
        f"fewer than the {used} its transcript has used; rebuild the projection"
    )


def put_refs(
    tx: Transaction, segment: int, end: int, key: bytes, chunk: bytes, packed: bytes
) -> int:
    """Write packed references into the slots from `end` on, where the segment ends and `chunk`
    holds the references before `end` in its chunk, `key`; returns the segment's new length.
    Chunks are rewritten whole, and written once per transaction, at commit."""
    size, width = st.REFS_PER_CHUNK, st.REF_BYTES
    room = (size - end % size) * width
    if not packed:
        return end
    if len(packed) <= room:  # the common case: the references fit in the tail chunk
        _kv.defer(tx, key, chunk + packed, bytes)
        return end + len(packed) // width
    _kv.defer(tx, key, chunk + packed[:room], bytes)
    slot, offset = end + room // width, room
    while offset < len(packed):  # any further chunk starts empty
        piece = packed[offset : offset + size * width]
        _kv.defer(tx, st.ref_chunk_key(segment, slot // size), piece, bytes)
        slot += len(piece) // width
        offset += len(piece)
    return slot


Opener = Callable[[ev.Event, int, list[int]], Sequence[ev.Message]]
"""Called once per run of references to one event, with the event, its log position and the
indexes wanted (numbered as `message_of` numbers them): those messages, opened, in that order.
The engine opens sealed messages there (`sessions/_seal.py`), a batch event's list with one call;
the projections never see a key."""


def messages_at(
    view: LogView, refs: Sequence[tuple[int, int]], opener: Opener | None = None
) -> list[ev.Message]:
    """The messages `refs` (position, index) point at, in order: each event read, hash-checked
    and opened once, however many of its messages are wanted (a batch holds up to a thousand)."""
    # Events in order of first reference: a run of references to one event reads it once.
    positions = list(dict.fromkeys([position for position, _ in refs]))
    if opener is not None:
        events = {envelope.position: envelope.data for envelope in view.events_at(positions)}
        found: list[ev.Message] = []
        for position, run in groupby(refs, itemgetter(0)):
            found += opener(events[position], position, [index for _, index in run])
        return found
    if len(positions) == len(refs):  # one message per event: the common case
        injected = ev.MessageInjected
        return [  # an injected message, the most common event, without a call
            data.message if type(data := envelope.data) is injected else message_of(data, index)
            for envelope, (_, index) in zip(view.events_at(positions), refs, strict=True)
        ]
    events = {envelope.position: envelope.data for envelope in view.events_at(positions)}
    return [message_of(events[position], index) for position, index in refs]


def message_of(data: ev.Event, index: int) -> ev.Message:
    """The message an event carries at `index` (see `_message_refs` and compaction)."""
    take = _MESSAGE_OF.get(type(data))
    if take is None:
        raise AssertionError(f"{type(data).__name__} carries no message")
    message: ev.Message = take(data, index)
    return message


_MESSAGE_OF: dict[type, Callable[[Any, int], ev.Message]] = {
    ev.MessageInjected: lambda data, index: data.message,
    ev.MessagesInjected: lambda data, index: data.messages[index],
    ev.PromptStarted: lambda data, index: data.prompt,
    ev.PromptCompleted: lambda data, index: data.reply,
    ev.SessionCompacted: lambda data, index: data.replacement[index],
    ev.DoomLoopDetected: lambda data, index: data.message,
    ev.StepCompleted: lambda data, index: data.reply,
    ev.ToolCallFinished: lambda data, index: data.result,
    ev.ContextCompacted: lambda data, index: data.summary if index else data.boundary,
}
"""What `message_of` reads from each event type that carries messages."""


def new_segment(tx: Transaction) -> int:
    current = _kv.get(tx, keys.SEGMENT_COUNTER_KEY)
    segment = int.from_bytes(current, "big") + 1 if current else 1
    _kv.put(tx, keys.SEGMENT_COUNTER_KEY, segment.to_bytes(8, "big"))
    return segment


def append_refs(
    tx: Transaction, transcript: Transcript, refs: list[tuple[int, int]], *, fresh: bool = False
) -> Transcript:
    """Add messages at the end (`fresh`: in a segment of their own)."""
    packed = b"".join([st.pack_ref(*ref) for ref in refs])
    return msgspec.structs.replace(
        transcript,
        ranges=extend(tx, transcript.ranges, packed, fresh=fresh),
        length=transcript.length + len(refs),
    )


def extend(
    tx: Transaction, ranges: tuple[tuple[int, int, int], ...], packed: bytes, *, fresh: bool = False
) -> tuple[tuple[int, int, int], ...]:
    """`ranges` with the `packed` references after them. The last segment grows in place only
    when these ranges end exactly where it ends; otherwise (a fork got there first, or `fresh`) a
    new segment starts, so nobody sharing the old one ever sees these messages."""
    segment, start, end = ranges[-1] if ranges and not fresh else (0, 0, 0)
    state: _kv.Pending | None = tx.projector_state  # type: ignore[assignment]
    if segment and state is not None:  # the common append: into the tail chunk it just wrote
        key = st.ref_chunk_key(segment, end // st.REFS_PER_CHUNK)
        held = state.cache.get(key)
        if (
            type(held) is bytes
            and len(held) == end % st.REFS_PER_CHUNK * st.REF_BYTES
            and len(held) + len(packed) <= _CHUNK_BYTES
        ):
            value = held + packed
            state.cache[key] = value  # as `_kv.defer` keeps it, without checking our own key
            state.deferred[key] = (value, bytes)
            return (*ranges[:-1], (segment, start, end + len(packed) // st.REF_BYTES))
    chunk = None
    if segment:
        key = st.ref_chunk_key(segment, end // st.REFS_PER_CHUNK)
        chunk = tail_chunk(tx, key, end)
    if chunk is None:
        segment, start, end, chunk = new_segment(tx), 0, 0, b""
        key = st.ref_chunk_key(segment, 0)
        ranges = (*ranges, (segment, 0, 0))
    end = put_refs(tx, segment, end, key, chunk, packed)
    return (*ranges[:-1], (segment, start, end))


_CHUNK_BYTES = st.REFS_PER_CHUNK * st.REF_BYTES


def slice_ranges(
    ranges: tuple[tuple[int, int, int], ...], start: int, stop: int
) -> tuple[tuple[int, int, int], ...]:
    """The ranges covering messages ``[start, stop)`` of a transcript."""
    out: list[tuple[int, int, int]] = []
    offset = 0
    for segment, lo, hi in ranges:
        size = hi - lo
        a, b = max(start, offset), min(stop, offset + size)
        if a < b:
            out.append((segment, lo + a - offset, lo + b - offset))
        offset += size
        if offset >= stop:
            break
    return tuple(out)
