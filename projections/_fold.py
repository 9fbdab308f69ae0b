"""The session projection: a fold from each committed event to key-value state, in its transaction.

`project(tx, envelopes)` (`projections/_project.py`) is installed as the log's projector, so
every append, from the engine or from anyone else, updates the state in the same commit. It is
total: an event that makes no sense for the current state (a message to a session that does not
exist) changes nothing, so a rebuild can never fail half way. It reads no clock; times come from
the events.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from eventlog import Envelope, LogView, Transaction, limits
from eventlog import events as ev
from projections import _keys as keys
from projections import _kv, _refs
from projections import _runtime as rt
from projections import _state as st
from projections._context import apply_pruned
from projections._state import (
    ACTIVE,
    CLOSED,
    DELETED,
    EMPTY_TRANSCRIPT,
    STATE_CODEC,
    TRANSCRIPT_CODEC,
    LiveClient,
    SessionState,
    Transcript,
)
from projections._tokens import BEARER_STREAM_PREFIX, apply_bearer

SYSTEM_STREAM_PREFIX = "$"
"""Streams whose names start with this are not sessions (bearer tokens, runtime bookkeeping)."""


SESSION_KEYS_MAX = 4096
"""Sessions whose state and transcript keys `session_keys` remembers."""


@functools.lru_cache(maxsize=SESSION_KEYS_MAX)
def session_keys(session_id: str) -> tuple[bytes, bytes]:
    """`state_key` and `transcript_key` of a session, remembered: every command and every
    message a session takes looks them up, and they never change."""
    return st.state_key(session_id), st.transcript_key(session_id)


def load_session(view: LogView, session_id: str) -> tuple[SessionState | None, Transcript | None]:
    """`load_state` and `load_transcript` in one call: every command on a session reads both."""
    state_key, transcript_key = session_keys(session_id)
    return (
        _kv.cached(view, state_key, STATE_CODEC.decode),
        _kv.cached(view, transcript_key, TRANSCRIPT_CODEC.decode),
    )


def load_state(view: LogView, session_id: str) -> SessionState | None:
    state: SessionState | None = _kv.cached(view, st.state_key(session_id), STATE_CODEC.decode)
    return state


def load_transcript(view: LogView, session_id: str) -> Transcript | None:
    key = st.transcript_key(session_id)
    transcript: Transcript | None = _kv.cached(view, key, TRANSCRIPT_CODEC.decode)
    return transcript


def _save_state(tx: Transaction, state: SessionState) -> None:
    key = st.state_key(state.session_id)
    data = STATE_CODEC.encode(state)
    _kv.put(tx, key, data)
    _kv.remember(tx, key, state, len(data))  # after the put, which drops any cached value


def _save_transcript(tx: Transaction, session_id: str, transcript: Transcript) -> None:
    # Rewritten by every event of the session: written once per transaction, at commit.
    _kv.defer(tx, st.transcript_key(session_id), transcript, TRANSCRIPT_CODEC.encode)


def _count(tx: Transaction, key: bytes, delta: int) -> None:
    current = _kv.get(tx, key)
    value = (int.from_bytes(current, "big") if current else 0) + delta
    _kv.put(tx, key, max(value, 0).to_bytes(8, "big"))


def _note_key_slot(tx: Transaction, slot: int) -> None:
    """Keep the highest keyring slot the log names: a key made later takes a slot above it, even
    in a keyring that is not this log's own (a log imported without its keyring)."""
    if slot and slot > highest_key_slot(tx):
        _kv.put(tx, keys.KEY_SLOT_KEY, slot.to_bytes(8, "big"))


def highest_key_slot(view: LogView) -> int:
    value = _kv.get(view, keys.KEY_SLOT_KEY)
    return int.from_bytes(value, "big") if value else 0


def apply_runs(tx: Transaction, envelopes: list[Envelope]) -> None:
    """`apply` each envelope, except that a run of one-message events on one session (a batch of
    injected messages) is folded in one step; the result is the same as one event at a time."""
    index, count = 0, len(envelopes)
    while index < count:
        first = envelopes[index]
        end = index + 1
        if type(first.data) in _ONE_MESSAGE and not first.stream.startswith(SYSTEM_STREAM_PREFIX):
            stream = first.stream
            while (
                end < count
                and type(envelopes[end].data) in _ONE_MESSAGE
                and envelopes[end].stream == stream
            ):
                end += 1
        if end - index == 1:
            apply(tx, first)
        else:
            key = st.transcript_key(first.stream)
            transcript = _kv.cached(tx, key, TRANSCRIPT_CODEC.decode)
            if transcript is not None:
                _append_messages(tx, envelopes[index:end], transcript, key)
                for envelope in envelopes[index:end]:
                    _remember_key(tx, envelope)
        index = end


def apply(tx: Transaction, envelope: Envelope) -> None:
    if envelope.stream.startswith(SYSTEM_STREAM_PREFIX):
        if envelope.stream.startswith(BEARER_STREAM_PREFIX):
            apply_bearer(tx, envelope)
        return
    data = envelope.data
    if type(data) in _ONE_MESSAGE:  # most events: one message at the end, nothing else changes
        key = session_keys(envelope.stream)[1]
        transcript = _kv.cached(tx, key, TRANSCRIPT_CODEC.decode)
        if transcript is not None:  # else no session was ever opened here: nothing to project
            _append_messages(tx, (envelope,), transcript, key)
            _remember_key(tx, envelope)
        return
    opener = _OPENERS.get(type(data))
    if opener is not None:
        opener(tx, envelope)
        return
    transcript = load_transcript(tx, envelope.stream)
    if transcript is None:
        return  # no session has ever been opened on this stream: nothing to project
    _remember_key(tx, envelope)
    transcript = _touch(transcript, envelope)
    refs = _message_refs(envelope)
    if refs:
        transcript = _refs.append_refs(tx, transcript, refs)
        stamp = _item_timestamp((envelope,), transcript.item_timestamp)
        if stamp != transcript.item_timestamp:
            transcript = msgspec.structs.replace(transcript, item_timestamp=stamp)
    shaper = _TRANSCRIPT_CHANGES.get(type(data))
    if shaper is not None:
        transcript = shaper(tx, transcript, envelope)
    _save_transcript(tx, envelope.stream, transcript)
    updater = _STATE_CHANGES.get(type(data))
    if updater is not None:
        state = load_state(tx, envelope.stream)
        if state is not None:
            _write_state_change(tx, state, updater(state, envelope))
    follower = rt.FOLLOWERS.get(type(data))
    if follower is not None:  # the runtime's status, loops and usage (`_runtime.py`)
        follower(tx, envelope)


def _remember_key(tx: Transaction, envelope: Envelope) -> None:
    """Record the command's idempotency key, if it carries one, for the session's incarnation."""
    key = getattr(envelope.data, "idempotency_key", None)
    if key is not None:
        _kv.put(tx, st.idempotency_key(envelope.stream, key), st.int8(envelope.position))


def _touch(transcript: Transcript, envelope: Envelope) -> Transcript:
    return msgspec.structs.replace(
        transcript, version=envelope.version, last_activity_at=envelope.recorded_at
    )


def _write_state_change(tx: Transaction, before: SessionState, after: SessionState) -> None:
    if before.status == ACTIVE and after.status != ACTIVE:
        _count(tx, keys.ACTIVE_COUNT_KEY, -1)
    _save_state(tx, after)


# Opening a session: a fresh incarnation, directly or as a fork.


def _open(tx: Transaction, envelope: Envelope) -> None:
    data = envelope.data
    assert isinstance(data, ev.SessionOpened)
    previous = load_state(tx, envelope.stream)
    if previous is not None and previous.status == ACTIVE:
        return  # opening an open session changes nothing (the engine never writes this)
    state = SessionState(
        session_id=envelope.stream,
        generation=previous.generation + 1 if previous else 1,
        opened_version=envelope.version,
        created_at=data.created_at,
        last_activity_at=envelope.recorded_at,
        agent_id=data.agent_id,
        title=data.title,
        formation=data.formation,
        scope=data.scope,
        system_prompt=data.system_prompt,
        tool_format=data.tool_format,
        metadata=data.metadata,
        parent_spawn_ref=data.parent_spawn_ref,
        workspace_anchor=data.workspace_anchor,
        workspace_policy=data.workspace_policy or {},
        key_slot=data.key_slot,
    )
    _note_key_slot(tx, data.key_slot)
    _begin_incarnation(tx, state, _touch(EMPTY_TRANSCRIPT, envelope), first=previous is None)


def _fork(tx: Transaction, envelope: Envelope) -> None:
    data = envelope.data
    assert isinstance(data, ev.SessionForked)
    previous = load_state(tx, envelope.stream)
    if previous is not None and previous.status == ACTIVE:
        return
    # The log checks an event's stream, not the ids in it: a fork appended through a bare log
    # (or imported) may name a parent that no stream can be, where no session was ever opened,
    # and one too long for a state key, which the child's state then does not keep.
    pid = data.parent_id
    parent: SessionState | None = None
    parent_transcript = EMPTY_TRANSCRIPT
    if pid and "\x00" not in pid and len(pid.encode()) <= limits.stream_name_bytes_max:
        parent = load_state(tx, pid)
        parent_transcript = load_transcript(tx, pid) or EMPTY_TRANSCRIPT
    parent_id = pid if len(st.state_key(pid)) <= limits.kv_key_bytes_max else None
    if parent_transcript.held:  # the child shares it: every slot it uses goes out under `g/`
        parent_transcript = _refs.release(tx, parent_transcript)
        _save_transcript(tx, data.parent_id, parent_transcript)
    ranges = parent_transcript.ranges
    length = parent_transcript.length
    if data.keep_first is not None and data.keep_first < length:
        ranges = _refs.slice_ranges(ranges, 0, data.keep_first)
        length = data.keep_first
    base = dict(
        session_id=envelope.stream,
        generation=previous.generation + 1 if previous else 1,
        opened_version=envelope.version,
        created_at=data.created_at,
        last_activity_at=envelope.recorded_at,
        parent_id=parent_id,
        branched_at_event_index=data.branched_at_event_index,
    )
    if parent is None:
        state = SessionState(**base, title=data.title, key_slot=data.key_slot)  # type: ignore[arg-type]
    else:
        state = msgspec.structs.replace(
            parent,
            **base,
            title=data.title if data.title is not None else parent.title,
            status=ACTIVE,
            clients=[],
            controller_id=None,
            close_reason=None,
            close_status={},
            key_slot=data.key_slot,
            forgotten=False,
            forgotten_reason=None,
        )
    # The newest item's timestamp goes with the whole transcript; a cut one may have lost it.
    stamp = parent_transcript.item_timestamp if length == parent_transcript.length else None
    transcript = Transcript(ranges=ranges, length=length, item_timestamp=stamp)
    _note_key_slot(tx, data.key_slot)
    _begin_incarnation(tx, state, _touch(transcript, envelope), first=previous is None)
    if parent is not None:  # children are listed under an incarnation; no state, no listing
        _kv.put(tx, st.child_key(data.parent_id, envelope.position), envelope.stream.encode())


def _begin_incarnation(
    tx: Transaction, state: SessionState, transcript: Transcript, *, first: bool
) -> None:
    # A fresh incarnation has no children of its own yet; its predecessor's stay in the log.
    # A session's first incarnation has none to drop: child keys are only written under a parent
    # that has a state. Skipping the scan matters: a scan writes out every deferred key first.
    if not first:
        for prefix in (st.child_prefix(state.session_id), st.idempotency_prefix(state.session_id)):
            for key, _ in _kv.scan(tx, prefix):
                _kv.delete(tx, key)
    _save_state(tx, state)
    _save_transcript(tx, state.session_id, transcript)
    _count(tx, keys.ACTIVE_COUNT_KEY, +1)
    forked = state.parent_id is not None
    rt.begin(
        tx, state.session_id, state.metadata, state.parent_spawn_ref, first=first, forked=forked
    )


_OPENERS: dict[type, Callable[[Transaction, Envelope], None]] = {
    ev.SessionOpened: _open,
    ev.SessionForked: _fork,
}


# Messages: every event that adds messages to the transcript, and where each message sits in it.


def _message_refs(envelope: Envelope) -> list[tuple[int, int]]:
    data = envelope.data
    if isinstance(
        data,
        (
            ev.MessageInjected,
            ev.PromptStarted,
            ev.PromptCompleted,
            ev.DoomLoopDetected,
            ev.StepCompleted,
            ev.ToolCallFinished,
        ),
    ):
        return [(envelope.position, 0)]
    if isinstance(data, ev.MessagesInjected):
        return [(envelope.position, index) for index in range(len(data.messages))]
    return []


def _append_messages(
    tx: Transaction, envelopes: Sequence[Envelope], transcript: Transcript, key: bytes
) -> None:
    """`_touch` + `refs.append_refs` for one-message events of one session, building one Transcript
    (the hot path of every inject); `key` is where the transcript is kept."""
    pack = st.REF_FORMAT.pack
    if len(envelopes) == 1:
        packed = pack(envelopes[0].position, 0)
    else:
        packed = b"".join([pack(envelope.position, 0) for envelope in envelopes])
    last = envelopes[-1]
    grown = _refs.extend(tx, transcript, packed, len(envelopes))
    stamp = _item_timestamp(envelopes, transcript.item_timestamp)
    # Positional, in the field order of `Transcript`: ranges, length, version, last activity,
    # item timestamp, and the chunk the session holds.
    updated = Transcript(
        grown.ranges,
        grown.length,
        last.version,
        last.recorded_at,
        stamp,
        grown.held,
        grown.held_chunk,
        grown.tail,
    )
    # Rewritten by every event of the session: written once per transaction, at commit.
    _kv.defer(tx, key, updated, TRANSCRIPT_CODEC.encode)


def _item_timestamp(envelopes: Sequence[Envelope], before: float | None) -> float | None:
    """The `timestamp` of the newest item among these one-message events' messages that has
    one, else `before`: a framework's own update time for the session, kept here so it needs
    no record of its own in the log."""
    for envelope in reversed(envelopes):
        data = envelope.data
        if type(data) is ev.MessageInjected:
            if data.message.item is None:  # a chat message, the common case: no item to read
                continue
            messages: Sequence[ev.Message] = (data.message,)
        elif type(data) is ev.MessagesInjected:
            messages = data.messages
        else:  # the runtime's prompts and warnings carry no framework item
            continue
        for message in reversed(messages):
            item = message.item
            if type(item) is dict:
                stamp = item.get("timestamp")
                if type(stamp) is float or type(stamp) is int:
                    return float(stamp)
    return before


def _reset(tx: Transaction, transcript: Transcript, envelope: Envelope) -> Transcript:
    return msgspec.structs.replace(transcript, ranges=(), length=0)


def _trim(tx: Transaction, transcript: Transcript, envelope: Envelope) -> Transcript:
    data = envelope.data
    assert isinstance(data, ev.SessionTrimmed)
    keep = min(data.kept_count, transcript.length)
    ranges = _refs.slice_ranges(transcript.ranges, transcript.length - keep, transcript.length)
    return msgspec.structs.replace(transcript, ranges=ranges, length=keep)


def _rewind(tx: Transaction, transcript: Transcript, envelope: Envelope) -> Transcript:
    """Keep the first `to_length` entries (all of them when it is past the end)."""
    data = envelope.data
    assert isinstance(data, ev.SessionRewound)
    keep = min(max(data.to_length, 0), transcript.length)
    ranges = _refs.slice_ranges(transcript.ranges, 0, keep)
    return msgspec.structs.replace(transcript, ranges=ranges, length=keep)


def _compact(tx: Transaction, transcript: Transcript, envelope: Envelope) -> Transcript:
    data = envelope.data
    assert isinstance(data, ev.SessionCompacted)
    length = transcript.length
    start = min(max(data.replace_start, 0), length)
    end = min(max(data.replace_end, start), length)
    head = _cut(transcript, start)
    if data.replacement:
        refs = [(envelope.position, index) for index in range(len(data.replacement))]
        head = _refs.append_refs(tx, head, refs, fresh=True)
    tail = _refs.slice_ranges(transcript.ranges, end, length)
    return msgspec.structs.replace(
        head, ranges=(*head.ranges, *tail), length=head.length + (length - end)
    )


def _cut(transcript: Transcript, at: int) -> Transcript:
    """The first `at` messages of `transcript`, still holding what it holds."""
    ranges = _refs.slice_ranges(transcript.ranges, 0, at)
    return msgspec.structs.replace(transcript, ranges=ranges, length=at)


def _checkpoint(tx: Transaction, transcript: Transcript, envelope: Envelope) -> Transcript:
    """Insert a context checkpoint pair before message `insert_at`; nothing is removed."""
    data = envelope.data
    assert isinstance(data, ev.ContextCompacted)
    length = transcript.length
    at = min(max(data.insert_at, 0), length)
    head = _refs.append_refs(
        tx, _cut(transcript, at), [(envelope.position, 0), (envelope.position, 1)], fresh=True
    )
    tail = _refs.slice_ranges(transcript.ranges, at, length)
    return msgspec.structs.replace(
        head, ranges=(*head.ranges, *tail), length=head.length + (length - at)
    )


_TRANSCRIPT_CHANGES: dict[type, Callable[[Transaction, Transcript, Envelope], Transcript]] = {
    ev.SessionReset: _reset,
    ev.SessionTrimmed: _trim,
    ev.SessionRewound: _rewind,
    ev.SessionCompacted: _compact,
    ev.ContextCompacted: _checkpoint,
    ev.ContextPruned: apply_pruned,
}


# Everything else about a session: one pure function from (state, event) to state per event type.


def _replace(state: SessionState, **changes: Any) -> SessionState:
    return msgspec.structs.replace(state, **changes)


def _scratchpad_set(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.ScratchpadSet)
    return _replace(state, scratchpad=data.scratchpad, scratchpad_version=data.version)


def _scratchpad_cleared(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.ScratchpadCleared)
    return _replace(state, scratchpad=None, scratchpad_version=data.version)


def _live_client(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.LiveSessionClient)
    at = envelope.recorded_at
    clients = {client.client_id: client for client in state.clients}
    controller = state.controller_id
    existing = clients.get(data.client_id)
    if data.action in ("attached", "taken_over"):
        mode = data.mode or "observer"
        if data.action == "taken_over" or mode == "controller":
            if controller is not None and controller != data.client_id and controller in clients:
                clients[controller] = msgspec.structs.replace(clients[controller], mode="observer")
            controller = data.client_id
            mode = "controller"
        elif controller == data.client_id:
            controller = None
        clients[data.client_id] = LiveClient(
            client_id=data.client_id,
            mode=mode,
            attached_at=existing.attached_at if existing else at,
            last_seen_at=at,
            metadata={**(existing.metadata if existing else {}), **data.metadata},
        )
    elif data.action == "detached":
        clients.pop(data.client_id, None)
        if controller == data.client_id:
            controller = None
    elif data.action == "heartbeat" and existing is not None:
        clients[data.client_id] = msgspec.structs.replace(
            existing, last_seen_at=at, metadata={**existing.metadata, **data.metadata}
        )
    return _replace(state, clients=list(clients.values()), controller_id=controller)


def _anchor(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.WorkspaceAnchorSet)
    return _replace(state, workspace_anchor=data.anchor)


def _policy(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.WorkspacePolicySet)
    return _replace(state, workspace_policy=data.policy)


def _root_added(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.WorkspaceRootAdded)
    roots = [root for root in state.roots if root.get("root") != data.root]
    entry: dict[str, Any] = {"root": data.root, "mount_mode": data.mount_mode}
    if data.mounted_at is not None:
        entry["mounted_at"] = data.mounted_at
    return _replace(state, roots=[*roots, entry])


def _root_removed(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.WorkspaceRootRemoved)
    return _replace(state, roots=[root for root in state.roots if root.get("root") != data.root])


def _renamed(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.SessionRenamed)
    return _replace(state, title=data.title)


def _metadata_set(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.SessionMetadataSet)
    merged = {**state.metadata, **data.metadata}
    for key in data.removed:
        merged.pop(key, None)
    return _replace(state, metadata=merged)


def _deleted(state: SessionState, envelope: Envelope) -> SessionState:
    if state.status != ACTIVE:
        return state
    return _replace(state, status=DELETED, clients=[], controller_id=None)


def _closed(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.AgentSessionClosed)
    if state.status != ACTIVE:
        return state
    return _replace(
        state,
        status=CLOSED,
        close_reason=data.reason,
        close_status=data.status,
        clients=[],
        controller_id=None,
    )


def _forgotten(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.SessionForgotten)
    return _replace(state, forgotten=True, forgotten_reason=data.reason)


def _archived(state: SessionState, envelope: Envelope) -> SessionState:
    data = envelope.data
    assert isinstance(data, ev.SessionArchived)
    return _replace(state, archive=data.archive)


_STATE_CHANGES: dict[type, Callable[[SessionState, Envelope], SessionState]] = {
    ev.SessionForgotten: _forgotten,
    ev.ScratchpadSet: _scratchpad_set,
    ev.ScratchpadCleared: _scratchpad_cleared,
    ev.LiveSessionClient: _live_client,
    ev.WorkspaceAnchorSet: _anchor,
    ev.WorkspacePolicySet: _policy,
    ev.WorkspaceRootAdded: _root_added,
    ev.WorkspaceRootRemoved: _root_removed,
    ev.SessionRenamed: _renamed,
    ev.SessionMetadataSet: _metadata_set,
    ev.SessionDeleted: _deleted,
    ev.AgentSessionClosed: _closed,
    ev.SessionArchived: _archived,
}

# Events carrying one message and changing nothing else take `apply`'s fast path; derived from the
# tables above, so giving one of them a shaper or a state change takes it off the fast path.
_ONE_MESSAGE = frozenset(
    kind
    for kind in (ev.MessageInjected, ev.PromptStarted, ev.PromptCompleted, ev.DoomLoopDetected)
    if kind not in _TRANSCRIPT_CHANGES and kind not in _STATE_CHANGES and kind not in rt.FOLLOWERS
)
