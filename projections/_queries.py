"""Reading the session projection, and rebuilding it from the log.

Queries take a `LogView` (one short read transaction, or the caller's write transaction) and never
write. `rebuild` and `catch_up` re-run the same fold the appends run, so a rebuilt projection equals
the incremental one by construction; the property tests check that it really does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence

from eventlog import (
    Envelope,
    EventLog,
    IntegrityError,
    LogView,
    StorageError,
    Transaction,
    limits,
)
from eventlog import events as ev
from projections import _keys as keys
from projections import _kv
from projections import _state as st
from projections._fold import apply
from projections._refs import Opener, messages_at
from projections._state import (
    SCRATCHPAD_CODEC,
    STATE_CODEC,
    TRANSCRIPT_CODEC,
    SessionState,
    StateScratchpad,
    Transcript,
)

Ranges = tuple[tuple[int, int, int], ...]


def read_messages(
    view: LogView,
    transcript: Transcript,
    *,
    ranges: Ranges | None = None,
    opener: Opener | None = None,
) -> list[ev.Message]:
    """The messages of a transcript (or of `ranges` of it), in order, each read (hash-checked)
    from the log."""
    refs: list[tuple[int, int]] = []
    for segment, start, end in transcript.ranges if ranges is None else ranges:
        refs.extend(read_refs(view, segment, start, end, transcript))
    return messages_at(view, refs, opener)


def ranges_window(ranges: Ranges, skip: int, count: int | None) -> Ranges:
    """The part of `ranges` holding messages `skip` .. `skip + count` (to the end when `count`
    is None): a page of a transcript without reading the messages before it."""
    out: list[tuple[int, int, int]] = []
    left = count
    for segment, start, end in ranges:
        if left is not None and left <= 0:
            break
        size = end - start
        if skip >= size:
            skip -= size
            continue
        first = start + skip
        last = end if left is None else min(end, first + left)
        out.append((segment, first, last))
        skip = 0
        if left is not None:
            left -= last - first
    return tuple(out)


def ranges_added(before: Ranges, after: Ranges) -> Ranges | None:
    """The ranges `after` holds beyond `before` when it is `before` with messages appended (the
    last range grown and/or new ranges after it), else None: `ranges_shared` when `after` shares
    every message of `before`."""
    shared, rest = ranges_shared(before, after)
    return rest if shared == sum(end - start for _, start, end in before) else None


def ranges_shared(before: Ranges, after: Ranges) -> tuple[int, Ranges]:
    """How many first messages `after` shares with `before`, and the ranges of `after` past them.
    Filled slots of a segment never change, so two transcripts whose ranges start alike hold the
    same first messages: a transcript and itself later (messages appended, or taken back), or
    two sessions of one family (a fork and its parent, two forks of one session)."""
    shared = 0
    for index, (segment, start, end) in enumerate(after):
        if index == len(before):
            return shared, after[index:]
        was_segment, was_start, was_end = before[index]
        if (segment, start) != (was_segment, was_start):
            return shared, after[index:]
        common = min(end, was_end)
        shared += common - start
        if end != was_end:  # one of the two stops inside this range: nothing after is shared
            rest = ((segment, common, end),) if common < end else ()
            return shared, rest + after[index + 1 :]
    return shared, ()


def read_refs(
    view: LogView, segment: int, start: int, end: int, transcript: Transcript
) -> list[tuple[int, int]]:
    """The (position, index) references in slots ``[start, end)`` of a segment of `transcript`'s
    ranges: from `g/`, and from `transcript` for the chunk it holds (`Transcript.held`), which
    is the segment's last."""
    if start >= end:
        return []
    size, width = st.REFS_PER_CHUNK, st.REF_BYTES
    first, last = start // size, (end - 1) // size
    held = transcript if transcript.held == segment else None
    stop = last + 1 if held is None else min(last + 1, held.held_chunk)  # the chunks under `g/`
    values: list[bytes] = []
    if first < stop:
        found = _kv.scan(
            view, start=st.ref_chunk_key(segment, first), stop=st.ref_chunk_key(segment, stop)
        )
        values = [value for _, value in found]
    if held is not None and first <= held.held_chunk <= last:
        values.append(held.tail)
    full = size * width
    if len(values) != last - first + 1 or any(len(value) != full for value in values[:-1]):
        raise IntegrityError(
            f"projection: segment {segment} lacks references for its slots {start}..{end}; "
            "rebuild the projection"
        )
    low = (start - first * size) * width
    high = low + (end - start) * width
    data = values[0] if len(values) == 1 else b"".join(values)
    if len(data) < high:
        raise IntegrityError(
            f"projection: segment {segment} holds {len(data) // width + first * size} slots, "
            f"fewer than the {end} a transcript uses; rebuild the projection"
        )
    return list(st.REF_FORMAT.iter_unpack(data[low:high]))


def first_referenced_position(view: LogView, transcript: Transcript) -> int | None:
    """The lowest log position any message of `transcript` comes from (None when it has none):
    what a truncation of the log must keep for the transcript to stay readable."""
    lowest: int | None = None
    for segment, start, end in transcript.ranges:
        for position, _ in read_refs(view, segment, start, end, transcript):
            if lowest is None or position < lowest:
                lowest = position
    return lowest


def child_ids(view: LogView, session_id: str) -> list[str]:
    """Children forked from the session's current incarnation, oldest first.

    A child that was closed stays listed (lineage is history); a child id that was later reopened
    as an unrelated session does not. A child id forked again after it was closed is listed once,
    where it first appeared.
    """
    children: list[str] = []
    for _, value in _kv.scan(view, st.child_prefix(session_id)):
        child = value.decode()
        if child in children:
            continue
        raw = _kv.get(view, st.state_key(child))
        if raw is None or STATE_CODEC.decode(raw).parent_id == session_id:
            children.append(child)
    return children


def iter_states(
    view: LogView, *, after: str | None = None, limit: int | None = None
) -> Iterator[SessionState]:
    """Session states in id order, starting after the session id `after`."""
    start = st.state_key(after) + b"\x00" if after is not None else None
    for _, value in _kv.scan(view, keys.STATE_PREFIX, start=start, limit=limit):
        yield STATE_CODEC.decode(value)


def iter_scratchpads(view: LogView, *, prefix: str) -> Iterator[StateScratchpad]:
    """The id, status and scratchpad of each session whose id starts with `prefix`, in id order,
    each decoded without the rest of its state (a few times cheaper per session than
    `iter_states`, which decodes every field)."""
    for _, value in _kv.scan(view, st.state_key(prefix)):
        yield SCRATCHPAD_CODEC.decode(value)


def iter_transcripts(view: LogView, *, prefix: str) -> Iterator[tuple[str, Transcript]]:
    """The id and transcript of each session whose id starts with `prefix`, in id order, read
    in one pass (a listing's per-session figures without a read per session)."""
    for session_id, value in _kv.cluster_values(view, prefix, keys.TRANSCRIPT_SUFFIX):
        yield session_id, TRANSCRIPT_CODEC.decode(value)


def active_count(view: LogView) -> int:
    value = _kv.get(view, keys.ACTIVE_COUNT_KEY)
    return int.from_bytes(value, "big") if value else 0


def projected_position(view: LogView, *, below: int | None = None) -> int:
    """The last log position the projection reflects (of those up to `below` when given).

    Each commit records, per stream it appended to, the position of that stream's last event
    folded in (`st.folded_key`), beside the stream's index, so no key common to every commit is
    rewritten. The projection reflects the newest event whose stream names it there: a later
    event was appended by a writer without a projector (its stream's key names an earlier one),
    and every event before a folded one was folded first. On a store written only through the
    engine the first event looked at is that one. A transaction that folded events remembers
    the answer (`keys.POSITION_KEY` in its cache)."""
    state = _kv.pending(view)
    if state is not None and below is None:
        known = state.cache.get(keys.POSITION_KEY)
        if known is not None:
            return int(known)
    floor, head = view.anchor[0], view.head
    top = head if below is None else below
    page = 1  # the newest event alone first: it is the one, unless a bare log appended
    while top > floor:
        low = max(floor + 1, top - page + 1)
        for envelope in reversed(view.events_at(range(low, top + 1))):
            value = _kv.get(view, _folded_key(envelope.stream))
            folded = 0 if value is None else int.from_bytes(value, "big")
            if folded == envelope.position:
                return folded
            if folded > head:  # state folded from a longer log than this one
                raise IntegrityError(
                    f"the projection reflects position {folded} of stream "
                    f"{envelope.stream!r}, but the log ends at {head}",
                    head,
                )
        top, page = low - 1, FOLDED_WALK_PAGE
    return floor


FOLDED_WALK_PAGE = 64
"""Events `projected_position` reads per step back past the newest."""


def note_folded(tx: Transaction, envelopes: Sequence[Envelope]) -> None:
    """Record that `envelopes` (in log order) are folded in: per stream, its last one's
    position, written once at commit; and the last position in this transaction's cache."""
    state = _kv.pending_for_write(tx)
    cache, deferred = state.cache, state.deferred
    if len(envelopes) == 1:
        newest = {envelopes[0].stream: envelopes[0].position}
    else:
        newest = {envelope.stream: envelope.position for envelope in envelopes}
    for stream, position in newest.items():
        key = _folded_key(stream)
        cache[key] = position  # as `_kv.defer` keeps it, without checking our own key
        deferred[key] = (position, st.int8)
    cache[keys.POSITION_KEY] = envelopes[-1].position


_folded_key = functools.lru_cache(maxsize=4096)(st.folded_key)


def dump(view: LogView) -> list[tuple[bytes, bytes]]:
    """Every key and value of the projection state, for comparing two states."""
    out: list[tuple[bytes, bytes]] = []
    start = b""
    while True:
        page = _kv.scan(view, start=start, limit=10_000)
        out.extend(page)
        if len(page) < 10_000:
            return out
        start = page[-1][0] + b"\x00"


def _apply_after(
    tx: Transaction,
    after: int,
    progress: Callable[[int, int], object] | None = None,
    *,
    before: int | None = None,
) -> int:
    """Apply the events after `after` (those before `before` only, when given), recording the
    position reached after each page; returns it."""
    position = after
    head = tx.head
    while True:
        limit = limits.read_page_events_max
        if before is not None:
            limit = min(limit, before - 1 - position)
            if limit <= 0:
                return position
        page = tx.read(after=position, limit=limit)
        if not page:
            return position
        for envelope in page:
            apply(tx, envelope)
        position = page[-1].position
        note_folded(tx, page)
        if progress is not None:
            progress(position, head)


def catch_up(log: EventLog) -> int:
    """Apply the events the projection has not seen (appended while no projector was installed).
    A store that is open meanwhile folds them in its next commit (`projections/_project.py`);
    this is for those appended while none was.

    Returns how many were applied; on a store written only through the engine that is zero, so
    opening a store never replays the log.
    """
    with log.view() as view:
        done, head = projected_position(view), view.head
        layout = _kv.get(view, keys.LAYOUT_KEY)
    if done == head and layout == st.LAYOUT_VERSION:
        return 0
    if done > head:
        raise IntegrityError(
            f"the projection reflects position {done}, but the log ends at {head}", head
        )
    with log.transaction(fold=False) as tx:
        if _kv.get(tx, keys.LAYOUT_KEY) != st.LAYOUT_VERSION:
            # Written by another version of this code (or never): its keys mean something else.
            return _rebuild_in(tx)
        start = projected_position(tx)
        return _apply_after(tx, start) - start


def catch_up_before(tx: Transaction, done: int, first: int) -> None:
    """Apply, in `tx`, the committed events after `done` (the position the projection reflects)
    and before `first`, the first event `tx` appended: appended by a process that wrote to the
    log without a projector (a bare `EventLog`) while a store was open on it. The store's next
    commit folds them before its own events (`projections/_project.py`), so the projection never
    skips them, nor marks them seen with its position. What a truncation took away cannot be
    folded: a truncated log is caught up from its anchor."""
    if done > first - 1:
        raise IntegrityError(
            f"the projection reflects position {done}, but the log before this commit ends at "
            f"{first - 1}",
            first,
        )
    _apply_after(tx, max(done, tx.anchor[0]), before=first)


def check_current(log: EventLog) -> None:
    """Refuse, on a store opened read-only, a projection that is behind its log or of another
    layout: bringing it up to date is a write."""
    with log.view() as view:
        done, head = projected_position(view), view.head
        layout = _kv.get(view, keys.LAYOUT_KEY)
    if done == head and (layout == st.LAYOUT_VERSION or head == 0):
        return
    raise StorageError(
        f"the read models of {log.description} reflect position {done} of {head} (or another "
        f"layout): open the store for writing once (`sessionlog rebuild`) to bring them up to date"
    )


def rebuild(log: EventLog, *, progress: Callable[[int, int], object] | None = None) -> int:
    """Recompute the whole projection from position 1, in one transaction. Returns the position.

    `progress(done, head)` is called after each page of events applied."""
    with log.transaction(fold=False) as tx:
        return _rebuild_in(tx, progress)


def _rebuild_in(tx: Transaction, progress: Callable[[int, int], object] | None = None) -> int:
    _kv.clear(tx)
    _kv.put(tx, keys.LAYOUT_KEY, st.LAYOUT_VERSION)
    return _apply_after(tx, 0, progress)
