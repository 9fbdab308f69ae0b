"""Checks of what callers hand the log: stream names, versions, pages, keys, events, meta.

Each raises `InvalidArgumentError` or `LimitExceededError` saying what is wrong and where, before
anything reaches storage.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from eventlog import _codec, limits
from eventlog._storage import stream_key
from eventlog.errors import InvalidArgumentError
from eventlog.events import Event
from eventlog.limits import check_at_most


class ExpectedVersion(enum.Enum):
    NO_STREAM = "no_stream"
    ANY = "any"

    def __repr__(self) -> str:
        return self.name


NO_STREAM = ExpectedVersion.NO_STREAM
"""`expected_version` for an append that must create its stream."""
ANY = ExpectedVersion.ANY
"""`expected_version` for an append that does not care about the stream's version."""


_STREAM_KEYS_MAX = 4096
"""Stream names `check_stream` remembers as valid (with their index prefix) before it starts over."""
_stream_keys: dict[str, bytes] = {}


def check_stream(stream: object) -> bytes:
    """Validate a stream name; returns its index prefix. A name that passed once passes always,
    so the few names a process appends to again and again are checked once."""
    if type(stream) is str:
        known = _stream_keys.get(stream)
        if known is not None:
            return known
    key = _checked_stream(stream)
    if type(stream) is str:
        if len(_stream_keys) >= _STREAM_KEYS_MAX:
            _stream_keys.clear()
        _stream_keys[stream] = key
    return key


def _checked_stream(stream: object) -> bytes:
    if not isinstance(stream, str):
        raise InvalidArgumentError(f"stream name must be a str, got {type(stream).__name__}")
    if not stream:
        raise InvalidArgumentError("stream name must not be empty")
    if "\x00" in stream:
        raise InvalidArgumentError(f"stream name {stream!r} contains a NUL character")
    try:
        key = stream_key(stream)
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"stream name {stream!r} is not valid UTF-8: {exc}") from exc
    check_at_most(
        len(key) - 1, limits.stream_name_bytes_max, "stream_name_bytes_max", "stream name"
    )
    return key


def check_expected(expected: object) -> None:
    if isinstance(expected, ExpectedVersion):
        return
    if isinstance(expected, bool) or not isinstance(expected, int):
        raise InvalidArgumentError(
            f"expected_version must be an int, NO_STREAM or ANY, got {type(expected).__name__}"
        )
    if expected < 0:
        raise InvalidArgumentError(f"expected_version must be >= 0, got {expected}")


def check_page(after: object, limit: object, what: str) -> tuple[int, int]:
    if (
        isinstance(after, bool)
        or not isinstance(after, int)
        or not 0 <= after <= limits.position_max
    ):
        raise InvalidArgumentError(
            f"{what}: `after` must be an int from 0 to {limits.position_max}, got {after!r:.40}"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgumentError(f"{what}: `limit` must be an int >= 1, got {limit!r}")
    check_at_most(limit, limits.read_page_events_max, "read_page_events_max", f"{what} page")
    return after, limit


def check_key(key: object) -> bytes:
    if not isinstance(key, bytes):
        raise InvalidArgumentError(f"projection key must be bytes, got {type(key).__name__}")
    if not key or len(key) > limits.kv_key_bytes_max:
        raise InvalidArgumentError(
            f"projection key must be 1 to {limits.kv_key_bytes_max} bytes, got {len(key)}"
        )
    return key


def check_events(events: object) -> Sequence[Event]:
    if not isinstance(events, (list, tuple)):
        raise InvalidArgumentError(
            f"events must be a list or tuple of events, got {type(events).__name__}"
        )
    if not events:
        raise InvalidArgumentError("append needs at least one event")
    most = limits.events_per_append_max
    if len(events) > most:  # checked inline first: it runs on every append
        check_at_most(len(events), most, "events_per_append_max", "events in one append")
    for index, event in enumerate(events):
        if not isinstance(event, Event):
            raise InvalidArgumentError(
                f"event {index} must be an eventlog.events.Event, got {type(event).__name__}"
            )
    return events


def check_meta(meta: object) -> dict[str, Any]:
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
        raise InvalidArgumentError("meta must be a dict with str keys")
    try:
        size = _codec.encode_meta(meta)
    except (msgspec.MsgspecError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgumentError(f"meta cannot be stored: {exc}") from exc
    check_at_most(size, limits.meta_bytes_max, "meta_bytes_max", "meta")
    return meta


def check_idempotency_key(meta: dict[str, Any]) -> str | None:
    key = meta.get("idempotency_key")
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(
            f'meta["idempotency_key"] must be a non-empty str, got {type(key).__name__} {key!r}'
        )
    check_at_most(
        len(key),
        limits.idempotency_key_chars_max,
        "idempotency_key_chars_max",
        'meta["idempotency_key"]',
    )
    return key


def check_time(at: object) -> datetime:
    if at is None:
        return datetime.now(UTC)
    if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise InvalidArgumentError(f"recorded_at must be a timezone-aware datetime, got {at!r}")
    return at
