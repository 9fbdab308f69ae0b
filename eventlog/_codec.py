"""The stored form of an event and its hash chain: one encoder, one decoder, built once.

A stored record is the msgpack array of an `Envelope`, hash first. Its hash is
``blake3(previous hash || every byte after the hash field)``, so the hash covers exactly the stored
bytes that follow it and verifying never re-encodes anything. This module must never touch storage.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Generic, TypeVar

import blake3
import msgspec

from eventlog._plain import check_plain
from eventlog.errors import IntegrityError, InvalidArgumentError
from eventlog.events import AnyEvent, Timestamp, event_type_name

T = TypeVar("T")
HASH_BYTES = 32
GENESIS_HASH = bytes(HASH_BYTES)
# msgpack: fixarray of 7, then bin8 of 32 bytes; the hash sits at [3:35] and the body follows it.
RECORD_PREFIX = b"\x97\xc4\x20"
HASH_START = len(RECORD_PREFIX)
BODY_START = HASH_START + HASH_BYTES


class Envelope(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One recorded event: where it sits in the log and in its stream, when, and its payload."""

    hash: bytes
    position: int
    stream: str
    version: int
    recorded_at: Timestamp
    meta: dict[str, Any]
    data: AnyEvent

    @property
    def type(self) -> str:
        """The event's tag, e.g. ``message_injected``."""
        return event_type_name(self.data)


_encoder = msgspec.msgpack.Encoder(order="deterministic")
_set_field = msgspec.structs.force_setattr
_encode_into = _encoder.encode_into
_blake3 = blake3.blake3
envelope_decoder = msgspec.msgpack.Decoder(Envelope)
_decode = envelope_decoder.decode


def encode_meta(meta: dict[str, Any]) -> int:
    """The encoded size of `meta`; raises msgspec's errors for unencodable values."""
    return len(_encoder.encode(meta))


class EncodeFailure(Exception):
    """Event `index` of a run cannot be stored: `cause` is msgspec's error, or None when its
    record is `size` bytes, over the limit."""

    def __init__(self, index: int, cause: Exception | None, size: int = 0) -> None:
        super().__init__(index, cause, size)
        self.index = index
        self.cause = cause
        self.size = size


def encode_records(
    prev_hash: bytes,
    first_position: int,
    stream: str,
    first_version: int,
    recorded_at: datetime,
    meta: dict[str, Any],
    events: Iterable[Any],
    max_bytes: int,
    *,
    checked: bool = False,
) -> tuple[list[bytearray], list[Envelope]]:
    """Encode a run of events at consecutive positions and versions of one stream, each chained
    to the one before: this loop is what every append costs.

    Each record is decoded back before it is accepted, so a payload with a wrongly typed field
    (which msgspec encodes without complaint) can never reach the log and poison later reads.
    `checked` skips that read-back for events whose caller has already checked every field to be
    exactly its declared, immutable type (the engine's plain text messages): decoding such a
    record gives back an equal event, so the envelope is built from the event itself.
    Raises `EncodeFailure` naming the event that cannot be stored."""
    records: list[bytearray] = []
    envelopes: list[Envelope] = []
    add_record, add_envelope = records.append, envelopes.append
    hasher = _blake3()
    reset, update, digest_of = hasher.reset, hasher.update, hasher.digest
    position, version = first_position, first_version
    for index, data in enumerate(events):
        buf = bytearray()
        try:
            # Encoded with the previous hash where its own goes, the record's bytes from the hash
            # field on are exactly what its hash covers: hashed as they are, then overwritten. A
            # checked envelope is handed out as it is, so it gets a meta dict of its own.
            own_meta = dict(meta) if checked else meta
            envelope = Envelope(prev_hash, position, stream, version, recorded_at, own_meta, data)
            _encode_into(envelope, buf)
            reset()
            update(buf[HASH_START:])
            buf[HASH_START:BODY_START] = prev_hash = digest_of()
            if checked:
                _set_field(envelope, "hash", prev_hash)  # built here and shared with nobody yet
            else:
                envelope = _decode(buf)  # also proves the payload reads back as its own type
        except (msgspec.MsgspecError, TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise EncodeFailure(index, exc) from exc
        if len(buf) > max_bytes:
            raise EncodeFailure(index, None, len(buf))
        add_record(buf)
        add_envelope(envelope)
        position += 1
        version += 1
    if records and records[0][:HASH_START] != RECORD_PREFIX:  # our own invariant, checked once
        raise AssertionError("record prefix changed; the envelope layout is broken")
    return records, envelopes


# What msgspec raises for bytes that are not a valid record: malformed msgpack, a schema mismatch,
# and invalid UTF-8 in a string, which surfaces as the builtin `UnicodeDecodeError`.
# A record nested past the interpreter's stack is damage too, never a crash of the reader.
DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


def stored_hash(record: bytes | bytearray | memoryview) -> bytes:
    return bytes(record[HASH_START:BODY_START])


def chain_hash(prev_hash: bytes | memoryview, record: bytes | bytearray | memoryview) -> bytes:
    """The hash a record must carry when it follows a record hashed `prev_hash`."""
    hasher = blake3.blake3(prev_hash)
    hasher.update(memoryview(record)[BODY_START:])
    return hasher.digest()


def check_record(
    prev_hash: bytes | bytearray | memoryview,
    record: bytes | bytearray | memoryview,
    position: int,
) -> bytes:
    """Check one stored record against the chain; returns its hash or raises IntegrityError."""
    view = memoryview(record)
    if len(view) <= BODY_START or view[:HASH_START] != RECORD_PREFIX:
        raise IntegrityError(f"event at position {position}: not a sessionlog record", position)
    hasher = blake3.blake3(prev_hash)
    hasher.update(view[BODY_START:])
    digest = hasher.digest()
    if digest != view[HASH_START:BODY_START]:
        raise IntegrityError(
            f"event at position {position}: hash chain broken (stored bytes were changed)", position
        )
    return digest


def decode_record(record: bytes | bytearray | memoryview, position: int) -> Envelope:
    """Decode a record already checked against the chain."""
    try:
        envelope = envelope_decoder.decode(record)
    except DECODE_ERRORS as exc:
        raise IntegrityError(
            f"event at position {position}: cannot decode: {exc}", position
        ) from exc
    if envelope.position != position:
        raise IntegrityError(
            f"event at position {position} says it is at position {envelope.position}", position
        )
    return envelope


class StructCodec(Generic[T]):
    """Deterministic msgpack for one type, for projection state kept next to the log.

    Decoding damaged bytes raises `IntegrityError`, so no msgspec error leaves `eventlog`.
    """

    def __init__(self, type_: type[T], what: str) -> None:
        self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(type_)
        self._what = what

    def encode(self, value: T) -> bytes:
        return _encoder.encode(value)

    def decode(self, data: bytes | bytearray | memoryview) -> T:
        try:
            return self._decoder.decode(data)
        except DECODE_ERRORS as exc:
            raise IntegrityError(f"stored {self._what} cannot be decoded: {exc}") from exc


def convert(value: object, type_: type[T], *, what: str) -> T:
    """Turn builtin data (dicts, lists) into `type_`, raising `InvalidArgumentError` that names
    `what` and the path inside it on a mismatch."""
    try:
        return msgspec.convert(value, type_, strict=True)
    except msgspec.ValidationError as exc:
        raise InvalidArgumentError(f"{what}: {exc}") from exc
    except UnicodeEncodeError as exc:  # msgspec naming a value or key that is no valid UTF-8
        raise InvalidArgumentError(
            f"{what}: a string holds a lone surrogate ({exc.object[exc.start : exc.end]!r}), "
            f"which is not valid Unicode"
        ) from exc


def to_builtins(value: object) -> Any:
    """Structs to dicts and lists (defaults left out), for callers who want plain data."""
    return msgspec.to_builtins(value)


def json_copy(value: object, *, what: str) -> Any:
    """A deep copy of `value` as JSON would carry it (tuples become lists, bytes base64 text);
    raises `InvalidArgumentError` naming `what` for what JSON cannot carry."""
    try:
        return msgspec.json.decode(msgspec.json.encode(value))
    except (msgspec.MsgspecError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InvalidArgumentError(f"{what} cannot be written as JSON: {exc}") from exc


def check_encodable(value: object, *, what: str, plain: bool = True) -> int:
    """The encoded size of `value`; raises `InvalidArgumentError` if it cannot be stored or (with
    `plain`, for anything read back as JSON-like dicts) is not plain data (`check_plain`)."""
    if plain:
        check_plain(value, what=what)
    try:
        return len(_encoder.encode(value))
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InvalidArgumentError(f"{what} cannot be stored: {exc}") from exc
