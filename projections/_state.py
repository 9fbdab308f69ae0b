"""The read models the session projection keeps, and where each lives in the key-value space.

Key layout (all keys are bytes; session ids are UTF-8 and never contain NUL):
  @<stream>\0P               the position of the stream's last event folded in (8 bytes)
  h/<sid>                    SessionState of the session's current incarnation
  @<sid>\0t                  Transcript: ranges over shared message segments, and the chunk of
                             references the session is filling
  V                          layout version of this key space (1); another value means rebuild
  g/<seg:8><chunk:4>         the message references of slots chunk*128 .. chunk*128+127 of a
                             segment, packed: per slot the log position (8) and the index of the
                             message inside its event (2); only a segment's last chunk is short,
                             so the last chunk gives the segment's length, except the chunk a
                             session holds (`Transcript.held`), which lives in its transcript

Keys under `@` are cluster keys (`eventlog.cluster_key`): a store that can keeps them beside the
stream's own index, so a commit appending to a session writes one leaf of the tree for it: the
index, the transcript with its growing chunk of references, and the position folded.
  #seg                       next segment id (8)
  c/<parent>\0<position:8>   a child forked from parent at that log position -> child id
  i/<sid>\0<digest:16>       an idempotency key used on the session's current incarnation (its
                             blake3 digest) -> log position of the event that carried it (8)
  n/active                   number of sessions whose status is active (8)
  b/<handle>                 BearerRecord of a bearer session (see `projections/_tokens.py`)
  rt/...                     the runtime's status, loops and usage (see `projections/_runtime.py`)
"""

from __future__ import annotations

import struct
from datetime import datetime
from typing import Any

import blake3
import msgspec

from eventlog import StructCodec, cluster_key
from projections._keys import (
    CHILD_PREFIX,
    FOLDED_SUFFIX,
    IDEMPOTENCY_PREFIX,
    REF_PREFIX,
    STATE_PREFIX,
    TRANSCRIPT_SUFFIX,
)

LAYOUT_VERSION = b"\x07"
"""Version 2 packs a segment's message references into chunks (version 1: one key per message);
version 3 adds the runtime's status, loop and usage records (`_runtime.py`, keys under rt/);
version 4 drops the segment-length keys (G/), which the last chunk of a segment already gives;
version 5 has a transcript keep its newest item's timestamp (`Transcript.item_timestamp`);
version 6 indexes each prompt by its request id (rt/r/, what makes a retried request id answer
the first run) and has a loop record keep where it ended and how many model calls it made;
version 7 keeps the transcript and the position folded under cluster keys (one per stream where
version 6 kept one position for the log), and a session's growing chunk of references inside its
transcript (`Transcript.held`)."""

ACTIVE = "active"
CLOSED = "closed"
DELETED = "deleted"


def state_key(session_id: str) -> bytes:
    return STATE_PREFIX + session_id.encode()


def transcript_key(session_id: str) -> bytes:
    return cluster_key(session_id, TRANSCRIPT_SUFFIX)


def folded_key(stream: str) -> bytes:
    """Where the position of the stream's last event folded in is kept."""
    return cluster_key(stream, FOLDED_SUFFIX)


def int8(value: int) -> bytes:
    """A count or a log position as the projection keeps it: 8 bytes, big-endian."""
    return value.to_bytes(8, "big")


REFS_PER_CHUNK = 128
"""Slots per reference chunk: a full chunk (1,280 bytes) still fits inside an LMDB page, and
reading a 1,000-message transcript takes eight values instead of a thousand."""
REF_BYTES = 10
REF_FORMAT = struct.Struct(">QH")


def ref_chunk_key(segment: int, chunk: int) -> bytes:
    return REF_PREFIX + segment.to_bytes(8, "big") + chunk.to_bytes(4, "big")


def child_prefix(parent_id: str) -> bytes:
    return CHILD_PREFIX + parent_id.encode() + b"\x00"


def child_key(parent_id: str, position: int) -> bytes:
    return child_prefix(parent_id) + position.to_bytes(8, "big")


def idempotency_prefix(session_id: str) -> bytes:
    return IDEMPOTENCY_PREFIX + session_id.encode() + b"\x00"


def idempotency_key(session_id: str, key: str) -> bytes:
    """Where `key` is remembered: a fixed-size digest, so any key fits an LMDB key."""
    digest = blake3.blake3(key.encode("utf-8", "surrogatepass")).digest(16)
    return idempotency_prefix(session_id) + digest


def pack_ref(position: int, index: int) -> bytes:
    return REF_FORMAT.pack(position, index)


class LiveClient(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    client_id: str
    mode: str
    attached_at: datetime
    last_seen_at: datetime
    metadata: dict[str, Any] = {}


class SessionState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """Everything about one incarnation of a session except its messages."""

    session_id: str
    status: str = ACTIVE
    generation: int = 1
    opened_version: int = 1
    created_at: datetime
    last_activity_at: datetime
    agent_id: str | None = None
    title: str | None = None
    formation: dict[str, Any] = {}
    scope: str = "persistent"
    system_prompt: str | None = None
    tool_format: str | None = None
    metadata: dict[str, Any] = {}
    parent_spawn_ref: dict[str, Any] | None = None
    workspace_anchor: dict[str, Any] | None = None
    workspace_policy: dict[str, Any] = {}
    roots: list[dict[str, Any]] = []
    scratchpad: dict[str, Any] | None = None
    scratchpad_version: int = 0
    parent_id: str | None = None
    branched_at_event_index: int | None = None
    clients: list[LiveClient] = []
    controller_id: str | None = None
    close_reason: str | None = None
    close_status: dict[str, Any] = {}
    key_slot: int = 0
    """The keyring slot of the session's data key; 0 when it is not encrypted."""
    forgotten: bool = False
    """The session's data key was destroyed (`session_forgotten`): its content is unreadable."""
    forgotten_reason: str | None = None
    archive: str | None = None
    """Where a retention sweep archived this incarnation (`session_archived`), None if it did not."""


class Transcript(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """The part of a session that changes with every event: its messages, as ranges
    ``(segment, start, end)`` of immutable, shared message segments, and its activity."""

    ranges: tuple[tuple[int, int, int], ...] = ()
    length: int = 0
    version: int = 0
    last_activity_at: datetime | None = None
    item_timestamp: float | None = None
    """The `timestamp` number carried by the item of the newest message that had one (an item
    mapping with a number under that key, as a framework's event has): its clock, not the
    log's. None until such a message is appended; older code wrote no such field."""
    held: int = 0
    """The segment whose last chunk this session is filling, kept in `tail` rather than under
    `g/` (0: none). Only the session holding a segment extends it; it writes the chunk out when
    it fills, when the session moves to another segment and when a fork shares it, so any other
    reader of the segment finds under `g/` every slot its own ranges use."""
    held_chunk: int = 0
    """The number of the chunk `tail` holds."""
    tail: bytes = b""
    """The references of that chunk (`REF_BYTES` each), as `g/` would keep them."""


class StateScratchpad(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The id, status and scratchpad of a `SessionState`, decoded without its other fields: what
    a listing of many sessions by their scratchpads reads (`iter_scratchpads`)."""

    session_id: str
    status: str = ACTIVE
    scratchpad: dict[str, Any] | None = None


STATE_CODEC = StructCodec(SessionState, "session state")
SCRATCHPAD_CODEC = StructCodec(StateScratchpad, "session state")
TRANSCRIPT_CODEC = StructCodec(Transcript, "transcript")
EMPTY_TRANSCRIPT = Transcript()
