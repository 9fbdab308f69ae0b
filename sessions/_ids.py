"""Session ids: minting UUIDv7 and refusing ids the log could not carry.

A session id is its stream name, so it obeys the stream rules plus two of its own: it may not start
with the system-stream prefix, and it has its own length bound.
"""

from __future__ import annotations

import os
import re
import time
from contextvars import ContextVar

from eventlog import InvalidArgumentError, limits
from eventlog.limits import check_at_most

SYSTEM_PREFIX = "$"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_current: ContextVar[tuple[str, ...]] = ContextVar("sessionlog_current", default=())


def uuid7() -> str:
    """A UUIDv7: 48 bits of Unix milliseconds, then random bits, so ids sort by creation time."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= ((rand >> 62) & 0xFFF) << 64  # 12 random bits
    value |= 0b10 << 62  # RFC 4122 variant
    value |= rand & ((1 << 62) - 1)
    digits = f"{value:032x}"  # the text `str(uuid.UUID(int=value))` gives, a third of its cost
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def check_session_id(session_id: object, *, where: str) -> str:
    if not isinstance(session_id, str):
        raise InvalidArgumentError(
            f"{where}: a session id must be a str, got {type(session_id).__name__}"
        )
    if not session_id or session_id.strip() != session_id:
        raise InvalidArgumentError(
            f"{where}: a session id must be non-empty with no surrounding space, got {session_id!r}"
        )
    if session_id.startswith(SYSTEM_PREFIX):
        raise InvalidArgumentError(
            f"{where}: session ids may not start with {SYSTEM_PREFIX!r} (reserved), "
            f"got {session_id!r}"
        )
    if _CONTROL.search(session_id):
        raise InvalidArgumentError(f"{where}: session id {session_id!r} has control characters")
    try:
        size = len(session_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"{where}: session id is not valid UTF-8: {exc}") from exc
    check_at_most(size, limits.session_id_bytes_max, "session_id_bytes_max", f"{where}: session id")
    return session_id


def possible_id(session_id: object) -> str | None:
    """`session_id` if some session could have it, else None: the tolerant queries (`exists`,
    `snapshot`, `ancestry`) answer "no such session" for ids no session can have."""
    try:
        return check_session_id(session_id, where="query")
    except InvalidArgumentError:
        return None


def current_id() -> str | None:
    """The session being driven: inside a subscriber callback, or inside `store.driving(id)`."""
    stack = _current.get()
    return stack[-1] if stack else None


def push_current(session_id: str) -> object:
    return _current.set((*_current.get(), session_id))


def pop_current(token: object) -> None:
    _current.reset(token)  # type: ignore[arg-type]
