"""Durable bearer sessions (`store.tokens`): opaque tokens for HTTP callers, recorded in the log.

Owns `create`, `get`, `touch` and `expire`, and the checks of what they accept. The raw token is
returned by `create` and nowhere else: only its one-way handle is written (stream name, events,
projection) or named in errors and logs. Records are the bearer projection (`projections/_tokens.py`),
so they are rebuilt from the log like every other read model.
"""

from __future__ import annotations

import hmac
import itertools
import json
import math
import re
import secrets
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import blake3
from dateutil.parser import isoparse

import projections as pj
from eventlog import (
    ConcurrencyError,
    InvalidArgumentError,
    LogView,
    SessionExistsError,
    Transaction,
    check_plain,
    limits,
)
from eventlog import events as ev
from eventlog.limits import check_at_most
from sessions._checks import iso
from sessions._host import SessionHost, append, transact

HANDLE_CONTEXT = "sessionlog 2026 bearer handle v1"
"""The blake3 key-derivation context of a token's handle. Fixed and versioned: a different context
would give every token a different handle, so changing it means a new version and a migration."""

GENERATED_TOKEN_BYTES = 32
"""Random bytes in a generated token: 256 bits from `secrets`, 43 URL-safe base64 characters."""

TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~+/-]+=*")
"""RFC 6750's b64token: what an `Authorization: Bearer` header can carry without quoting."""

RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)
"""The shape of an RFC 3339 date-time; dateutil then checks that its fields are real."""


@dataclass(frozen=True)
class BearerSession:
    """One bearer session as callers see it, times as RFC 3339 strings (UTC).

    `token` (the seed's `id`) is set only on the record `create` returns, and never printed by
    `repr`: keep it out of logs. Everything else is safe to log; `handle` names the session."""

    handle: str
    principal: str
    created_at: str
    last_seen_at: str
    expires_at: str
    attributes: dict[str, Any]
    token: str | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The record as plain data, without the token."""
        return {
            "handle": self.handle,
            "principal": self.principal,
            "created_at": self.created_at,
            "last_seen_at": self.last_seen_at,
            "expires_at": self.expires_at,
            "attributes": json.loads(json.dumps(self.attributes)),
        }


_HANDLE_SHAPE = re.compile(r"[0-9a-f]{64}")
"""What `token_handle` returns; anything else names no session."""


def token_handle(token: str) -> str:
    """The one-way handle of a token (64 hex characters): blake3 in key-derivation mode with
    `HANDLE_CONTEXT`. Its cost depends on the token's length only, never on its content."""
    return blake3.blake3(token.encode(), derive_key_context=HANDLE_CONTEXT).hexdigest()


def could_be_token(token: object) -> bool:
    """Whether some session could have this token: a str of an allowed length and alphabet.
    Anything else is answered "unknown" without hashing (an attacker picks the length)."""
    return (
        isinstance(token, str)
        and limits.token_chars_min <= len(token) <= limits.token_chars_max
        and TOKEN_PATTERN.fullmatch(token) is not None
    )


def entropy_problem(token: str) -> str | None:
    """Why a caller-supplied token is too weak to be a credential, or None.

    One sample cannot prove randomness, so this only refuses what is visibly weak. The estimate is
    the Shannon entropy of the token's own character frequencies times the length of its shortest
    repeating unit (so ``x * 2`` counts once); it underestimates short tokens from small alphabets,
    so 32 random hex characters (128 bits) are refused while 43 URL-safe base64 characters (256
    bits, what `create` generates) or 64 hex characters always pass. On top of that, fewer than
    `limits.token_distinct_chars_min` different characters, or more than half of neighbouring
    characters one same step apart (``abcdef...``, ``acegik...``), are refused.
    """
    distinct = len(set(token))
    if distinct < limits.token_distinct_chars_min:
        return (
            f"it uses {distinct} different characters, expected at least "
            f"{limits.token_distinct_chars_min}"
        )
    unit = token[: _shortest_period(token)]
    counts = Counter(unit).values()
    bits = -sum(n * math.log2(n / len(unit)) for n in counts)
    if bits < limits.token_entropy_bits_min:
        return (
            f"its estimated entropy is {bits:.0f} bits, expected at least "
            f"{limits.token_entropy_bits_min}"
        )
    steps = Counter(ord(b) - ord(a) for a, b in itertools.pairwise(token))
    if 2 * steps.most_common(1)[0][1] > len(token) - 1:
        return "more than half of its neighbouring characters are one same step apart"
    return None


def _shortest_period(text: str) -> int:
    """The smallest p with text[i] == text[i + p] for every i (len(text) if none is shorter)."""
    border = [0] * len(text)  # Knuth-Morris-Pratt failure function
    k = 0
    for i in range(1, len(text)):
        while k and text[i] != text[k]:
            k = border[k - 1]
        if text[i] == text[k]:
            k += 1
        border[i] = k
    return len(text) - border[-1]


def parse_time(value: object, name: str, verb: str) -> datetime:
    """An aware datetime or an RFC 3339 string with an offset, as a UTC datetime."""
    if isinstance(value, datetime):
        at = value
    elif isinstance(value, str):
        if RFC3339.fullmatch(value) is None:
            raise InvalidArgumentError(
                f"{verb}: `{name}` must be an RFC 3339 date-time with an offset "
                f"(like 2026-05-01T12:00:00Z), got {value[:64]!r}"
            )
        try:
            at = isoparse(value.upper())
        except (ValueError, OverflowError) as exc:
            raise InvalidArgumentError(
                f"{verb}: `{name}` {value[:64]!r} is not a real time: {exc}"
            ) from exc
    else:
        raise InvalidArgumentError(
            f"{verb}: `{name}` must be an RFC 3339 str or an aware datetime, "
            f"got {type(value).__name__}"
        )
    if at.tzinfo is None or at.utcoffset() is None:
        raise InvalidArgumentError(
            f"{verb}: `{name}` must carry a UTC offset, got the naive time {at.isoformat()}"
        )
    return at.astimezone(UTC)


def _now(now: object, verb: str) -> datetime:
    return datetime.now(UTC) if now is None else parse_time(now, "now", verb)


def check_attributes(attributes: object, verb: str) -> dict[str, Any]:
    if attributes is None:
        return {}
    if not isinstance(attributes, Mapping):
        raise InvalidArgumentError(
            f"{verb}: `attributes` must be a JSON object (a dict), got {type(attributes).__name__}"
        )
    check_plain(attributes, what=f"{verb}: `attributes`")
    # A JSON round trip gives the stored value its own lists and dicts, none shared with the caller.
    text = json.dumps(attributes, separators=(",", ":"), ensure_ascii=False)
    size = len(text.encode())
    check_at_most(
        size,
        limits.bearer_attributes_bytes_max,
        "bearer_attributes_bytes_max",
        f"{verb}: `attributes` as JSON",
    )
    copied: dict[str, Any] = json.loads(text)
    return copied


def _check_principal(principal: object, verb: str) -> str:
    if not isinstance(principal, str) or not principal:
        raise InvalidArgumentError(
            f"{verb}: `principal` must be a non-empty str, got {principal!r:.64}"
        )
    check_at_most(
        len(principal), limits.principal_chars_max, "principal_chars_max", f"{verb}: `principal`"
    )
    return principal


def _check_supplied_token(token: object, verb: str) -> str:
    """A caller-supplied token. Messages never quote it: a refused token may still be a secret."""
    if not isinstance(token, str):
        raise InvalidArgumentError(f"{verb}: `id` must be a str, got {type(token).__name__}")
    if not limits.token_chars_min <= len(token) <= limits.token_chars_max:
        raise InvalidArgumentError(
            f"{verb}: `id` must be {limits.token_chars_min} to {limits.token_chars_max} "
            f"characters, got {len(token)}"
        )
    if TOKEN_PATTERN.fullmatch(token) is None:
        raise InvalidArgumentError(
            f"{verb}: `id` may only hold A-Z a-z 0-9 - . _ ~ + / and trailing = (RFC 6750)"
        )
    problem = entropy_problem(token)
    if problem is not None:
        raise InvalidArgumentError(f"{verb}: `id` is not a high-entropy token: {problem}")
    return token


def _view(record: pj.BearerRecord, token: str | None = None) -> BearerSession:
    return BearerSession(
        handle=record.handle,
        principal=record.principal,
        created_at=str(iso(record.created_at)),
        last_seen_at=str(iso(record.last_seen_at)),
        expires_at=str(iso(record.expires_at)),
        attributes=record.attributes,  # decoded from bytes for this call: nobody else holds it
        token=token,
    )


def _live_record(view: LogView, token: object, now: datetime) -> pj.BearerRecord | None:
    """The record of a live session with this token at `now`, else None."""
    if not could_be_token(token):
        return None
    assert isinstance(token, str)
    handle = token_handle(token)
    record = pj.load_record(view, handle)
    # The key lookup already matched; comparing again in constant time costs nothing and keeps a
    # damaged or hand-edited projection from answering for another token's record.
    if record is None or not hmac.compare_digest(record.handle, handle):
        return None
    if record.revoked_at is not None or record.expires_at <= now:
        return None
    return record


class BearerSessions:
    """`store.tokens`: create, get, touch and expire durable bearer sessions."""

    def __init__(self, store: SessionHost) -> None:
        self._store = store

    def create(
        self,
        principal: str,
        expires_at: str | datetime,
        *,
        attributes: Mapping[str, Any] | None = None,
        id: str | None = None,  # the name the session semantics give it
        created_at: str | datetime | None = None,
    ) -> BearerSession:
        """A new bearer session; the returned record is the only place its token ever appears.

        Without `id`, the token is 256 random bits from `secrets`. A caller-supplied `id` must be
        a high-entropy b64token (see `entropy_problem`). Creating a session for a token that
        already has one (live, expired or revoked) raises `SessionExistsError`: exactly one of
        two concurrent creates of the same token wins.
        """
        verb = "tokens.create"
        self._store._writable(verb)
        who = _check_principal(principal, verb)
        until = parse_time(expires_at, "expires_at", verb)
        since = (
            datetime.now(UTC) if created_at is None else parse_time(created_at, "created_at", verb)
        )
        if until <= since:
            raise InvalidArgumentError(
                f"{verb}: `expires_at` ({iso(until)}) must be after `created_at` ({iso(since)})"
            )
        labels = check_attributes(attributes, verb)
        if id is None:
            token = secrets.token_urlsafe(GENERATED_TOKEN_BYTES)
        else:
            token = _check_supplied_token(id, verb)
        handle = token_handle(token)
        created = ev.BearerSessionCreated(
            handle=handle, principal=who, created_at=since, expires_at=until, attributes=labels
        )
        stream = pj.bearer_stream(handle)
        taken = f"{verb}: a bearer session with handle `{handle[:16]}…` already exists"

        def decide(tx: Transaction) -> pj.BearerRecord | None:
            if pj.load_record(tx, handle) is not None:
                raise SessionExistsError(taken)
            try:
                append(tx, stream, [created], new=True)
            except ConcurrencyError as exc:  # the stream exists but its record does not
                raise SessionExistsError(taken) from exc
            return pj.load_record(tx, handle)

        record = transact(self._store.log, decide)
        assert record is not None, "the bearer projection did not fold bearer_session_created"
        return _view(record, token)

    def get(self, token: str, now: str | datetime | None = None) -> BearerSession | None:
        """The live session of `token` at `now` (default: the clock), or None when the token is
        unknown, revoked or expired (`expires_at <= now`). Reads only."""
        at = _now(now, "tokens.get")
        with self._store.log.view() as view:
            record = _live_record(view, token, at)
        return None if record is None else _view(record)

    def touch(self, token: str, now: str | datetime | None = None) -> BearerSession | None:
        """Mark the session of `token` as seen at `now` and return it; None (and nothing written)
        when unknown, revoked or expired. `last_seen_at` only moves forward; `expires_at` never
        changes, so an expired session stays expired."""
        verb = "tokens.touch"
        self._store._writable(verb)
        at = _now(now, verb)
        if not could_be_token(token):
            return None
        # Read first: an unknown, dead or already-seen token is answered without waiting for
        # the write lock, so a flood of bad tokens never queues behind (or slows) real writers.
        with self._store.log.view() as view:
            seen = _live_record(view, token, at)
        if seen is None or at <= seen.last_seen_at:
            return None if seen is None else _view(seen)

        def decide(tx: Transaction) -> pj.BearerRecord | None:
            record = _live_record(tx, token, at)  # again: it may have been revoked meanwhile
            if record is None or at <= record.last_seen_at:
                return record
            touched = ev.BearerSessionTouched(last_seen_at=at)
            append(tx, pj.bearer_stream(record.handle), [touched])
            after = pj.load_record(tx, record.handle)
            assert after is not None, "the bearer projection lost a record it was touching"
            return after

        record = transact(self._store.log, decide)
        return None if record is None else _view(record)

    def expire(self, token: str, now: str | datetime | None = None) -> bool:
        """Revoke the session of `token` as of `now`: `get` and `touch` answer None from then on,
        whatever time they are asked about. Returns False (writing nothing) for an unknown or
        already revoked token."""
        verb = "tokens.expire"
        self._store._writable(verb)
        at = _now(now, verb)
        if not could_be_token(token):
            return False
        assert isinstance(token, str)
        handle = token_handle(token)
        return self._revoke(handle, at)

    def revoke(self, handle: str, now: str | datetime | None = None) -> bool:
        """`expire` by the session's handle, for an administrator who holds the handle (from
        `create`, a log or an audit) but never the token. Same answers as `expire`."""
        verb = "tokens.revoke"
        self._store._writable(verb)
        at = _now(now, verb)
        if not isinstance(handle, str) or not _HANDLE_SHAPE.fullmatch(handle):
            return False
        return self._revoke(handle, at)

    def _revoke(self, handle: str, at: datetime) -> bool:
        """Revoke the session of `handle` as of `at`; False (writing nothing) when there is
        none, or it is already revoked."""

        def decide(tx: Transaction) -> bool:
            record = pj.load_record(tx, handle)
            if record is None or record.revoked_at is not None:
                return False
            expired = ev.BearerSessionExpired(expired_at=at, reason="revoked")
            append(tx, pj.bearer_stream(handle), [expired])
            return True

        return transact(self._store.log, decide)
