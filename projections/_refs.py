"""Message references: where a transcript's messages are, packed into chunks of segments.

A transcript is a list of ranges of segments; a segment is a run of packed (position, index)
references stored in chunks of `REFS_PER_CHUNK` under `g/`. Appending extends the last segment in
place when the transcript ends where it ends, or starts a new one (a fork got there first), so a
segment shared by forks never changes under any of them. The chunk a session is filling lives in
its transcript (`Transcript.held`) until it fills or is shared, so an append rewrites one value
of the session's, not a chunk under `g/` besides. Reading resolves references to the messages of
the events they point at, each event read and checked once.
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
    """The references in the chunk `key` (under `g/`) that slot `end` of its segment falls in,
    if `end` is where the segment ends, so appending there extends it in place; None if the
    segment goes on (a fork that shares it got there first). A segment's length is its last
    chunk's: no key of its own. Asked only of a segment no session holds."""
    value = _kv.get(tx, key)
    used = (end % st.REFS_PER_CHUNK) * st.REF_BYTES
    if value is None and used == 0:
        return b""
    if value is not None and len(value) >= used:
        return bytes(value) if len(value) == used else None
    raise IntegrityError(
        f"projection: reference chunk {key!r} holds {0 if value is None else len(value)} bytes, "
        f"fewer than the {used} its transcript has used; rebuild the projection"
    )


def release(tx: Transaction, transcript: Transcript) -> Transcript:
    """`transcript` holding no segment: the chunk it held written out under `g/`."""
    if not transcript.held:
        return transcript
    if transcript.tail:
        _kv.put(tx, st.ref_chunk_key(transcript.held, transcript.held_chunk), transcript.tail)
    return msgspec.structs.replace(transcript, held=0, held_chunk=0, tail=b"")


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
    return extend(tx, transcript, packed, len(refs), fresh=fresh)


def extend(
    tx: Transaction, transcript: Transcript, packed: bytes, count: int, *, fresh: bool = False
) -> Transcript:
    """`transcript` with the `packed` references (`count` of them) after its messages.

    The last segment grows in place only when the transcript ends exactly where the segment
    ends; otherwise (a fork got there first, or `fresh`) a new segment starts, so nobody sharing
    the old one ever sees these messages. The session then holds the segment it grew: its last
    chunk is kept in the transcript, written once per commit with it, and goes out under `g/`
    only when it fills or the session lets the segment go (`release`)."""
    if not packed:
        return transcript
    ranges = transcript.ranges
    segment, start, end = ranges[-1] if ranges and not fresh else (0, 0, 0)
    size, taken, grows = st.REFS_PER_CHUNK, False, False
    if segment and segment == transcript.held:
        # The common append, where it holds; unless it went back inside its segment.
        chunk, data = transcript.held_chunk, transcript.tail + packed
        grows = end == chunk * size + len(transcript.tail) // st.REF_BYTES
    elif segment:
        chunk = end // size
        held = tail_chunk(tx, st.ref_chunk_key(segment, chunk), end)
        if held is not None:  # a segment no one holds, and it ends here: take it
            transcript, data = release(tx, transcript), held + packed
            taken = grows = True
    if grows:
        ranges = ranges[:-1]
    else:  # what follows goes into a new segment of its own
        transcript = release(tx, transcript)
        segment, start, chunk, data = new_segment(tx), 0, 0, packed
    end, chunk, tail = _grow(tx, segment, chunk, data)
    if taken:  # its new end under `g/` too, so no other sharer grows it
        _kv.put(tx, st.ref_chunk_key(segment, chunk), tail)
    return msgspec.structs.replace(
        transcript,
        ranges=(*ranges, (segment, start, end)),
        length=transcript.length + count,
        held=segment,
        held_chunk=chunk,
        tail=tail,
    )


def _grow(tx: Transaction, segment: int, chunk: int, data: bytes) -> tuple[int, int, bytes]:
    """The held chunk `chunk` of `segment` grown to `data`: every chunk it fills written out
    under `g/`, and the segment's new end, the number of the chunk now held and what it holds
    (never empty)."""
    size, width = st.REFS_PER_CHUNK, st.REF_BYTES
    full = size * width
    if len(data) <= full:
        return chunk * size + len(data) // width, chunk, data
    last = (len(data) - 1) // full
    for number, piece in enumerate(_pieces(data[: last * full]), chunk):
        _kv.put(tx, st.ref_chunk_key(segment, number), piece)
    tail = data[last * full :]
    return (chunk + last) * size + len(tail) // width, chunk + last, tail


def _pieces(data: bytes) -> list[bytes]:
    full = st.REFS_PER_CHUNK * st.REF_BYTES
    return [data[at : at + full] for at in range(0, len(data), full)]


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
