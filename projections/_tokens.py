"""The bearer-session projection: one record per token handle, folded from the `$bearer/` streams.

Owns the key layout ``b/<handle>`` and the pure fold of the three `bearer_session_*` events. It
only ever sees a token's one-way handle (the stream's suffix), never a token, and reads no clock:
whether a record has expired is for the caller to decide with its own `now`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from eventlog import Envelope, LogView, StructCodec, Transaction
from eventlog import events as ev
from projections import _keys as keys
from projections import _kv

BEARER_STREAM_PREFIX = "$bearer/"
"""A bearer session's stream is this followed by its handle. The `$` keeps it out of the session
namespace: session ids never start with it (see `SYSTEM_STREAM_PREFIX`)."""

RECORD_PREFIX = keys.BEARER_PREFIX
"""Key of a record: this followed by the handle (ASCII hex)."""


class BearerRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """What the store knows about one bearer session."""

    handle: str
    principal: str
    created_at: datetime
    last_seen_at: datetime
    expires_at: datetime
    attributes: dict[str, Any] = {}
    revoked_at: datetime | None = None
    revoke_reason: str | None = None


RECORD_CODEC = StructCodec(BearerRecord, "bearer record")


def bearer_stream(handle: str) -> str:
    return BEARER_STREAM_PREFIX + handle


def record_key(handle: str) -> bytes:
    return RECORD_PREFIX + handle.encode()


def load_record(view: LogView, handle: str) -> BearerRecord | None:
    data = _kv.get(view, record_key(handle))
    return None if data is None else RECORD_CODEC.decode(data)


def apply_bearer(tx: Transaction, envelope: Envelope) -> None:
    """Fold one event of a `$bearer/<handle>` stream. Total, like the session fold: an event that
    makes no sense for the record (a touch before any create) changes nothing."""
    handle = envelope.stream[len(BEARER_STREAM_PREFIX) :]
    data = envelope.data
    record = load_record(tx, handle)
    if isinstance(data, ev.BearerSessionCreated):
        if record is not None or data.handle != handle:
            return  # a stream is created once (NO_STREAM); a mismatched handle is not ours
        record = BearerRecord(
            handle=handle,
            principal=data.principal,
            created_at=data.created_at,
            last_seen_at=data.created_at,
            expires_at=data.expires_at,
            attributes=data.attributes,
        )
    elif record is None:
        return
    elif isinstance(data, ev.BearerSessionTouched):
        # Touches only move forward, so concurrent writers can land in any order.
        if data.last_seen_at <= record.last_seen_at:
            return
        record = msgspec.structs.replace(record, last_seen_at=data.last_seen_at)
    elif isinstance(data, ev.BearerSessionExpired):
        if record.revoked_at is not None:
            return  # the first revocation is the one that counts
        record = msgspec.structs.replace(
            record, revoked_at=data.expired_at, revoke_reason=data.reason
        )
    else:
        return  # a session event on a bearer stream: never written by the engine
    _kv.put(tx, record_key(handle), RECORD_CODEC.encode(record))
