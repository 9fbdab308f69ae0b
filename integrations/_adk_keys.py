"""Where `integrations.adk` keeps things in a store: the sessionlog ids made of ADK's names
(app, user, session), and the checks those names pass before any id is made of them.

A store id holds at most `limits.session_id_bytes_max` bytes. An ADK session's id is its three
names, each percent-encoded (``adk:app/user/session``), whenever they fit: short names stay
readable in the store, and every session stored before longer names were allowed keeps its id.
Names that do not fit together take a fixed-size form instead (``adk#`` and a digest of each
name), whose prefixes still select one app's or one user's sessions; the names themselves are then
kept in the session's scratchpad (`NAMES`), since a digest cannot be read back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

import blake3

from eventlog import limits
from sessions import InvalidArgumentError, LimitExceededError

SESSION_PREFIX = "adk:"
HASHED_PREFIX = "adk#"
APP_PREFIX = "adk-app:"
USER_PREFIX = "adk-user:"
NAMES = "names"
"""The scratchpad key holding ``[app, user, session]`` of a session stored under a digest."""
NAME_CHARS_MAX = 128
"""The longest name taken, in characters: what ADK's `DatabaseSessionService` allows for each of
the three. Any name up to it fits, however it encodes."""
_DIGEST_BYTES = 16  # 32 hex characters a name; three of them and their separators fit in 128 bytes


def check_name(value: object, argument: str, where: str) -> str:
    """`value` if it can name an app, user or session, else a typed error naming `argument`."""
    if not isinstance(value, str):
        raise InvalidArgumentError(
            f"{where}: `{argument}` must be a string, got {type(value).__name__}",
            where=where,
        )
    if len(value) > NAME_CHARS_MAX:
        raise LimitExceededError(
            f"{where}: `{argument}` length in characters",
            "NAME_CHARS_MAX",
            NAME_CHARS_MAX,
            len(value),
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no id can be made of it
        raise InvalidArgumentError(
            f"{where}: `{argument}` is not valid Unicode text ({exc.reason})", where=where
        ) from exc
    return value


def session_key(app_name: str, user_id: str, session_id: str) -> str:
    """The sessionlog id of an ADK session: its three names percent-encoded when they fit, else
    a digest of each."""
    readable = f"{SESSION_PREFIX}{_part(app_name)}/{_part(user_id)}/{_part(session_id)}"
    if _fits(readable):
        return readable
    return f"{HASHED_PREFIX}{_digest(app_name)}/{_digest(user_id)}/{_digest(session_id)}"


def app_key(app_name: str) -> str:
    """The id of the session holding an app's shared (``app:``) state."""
    readable = APP_PREFIX + _part(app_name)
    return readable if _fits(readable) else f"adk-app#{_digest(app_name)}"


def user_key(app_name: str, user_id: str) -> str:
    """The id of the session holding a user's shared (``user:``) state within an app."""
    readable = f"{USER_PREFIX}{_part(app_name)}/{_part(user_id)}"
    return readable if _fits(readable) else f"adk-user#{_digest(app_name)}/{_digest(user_id)}"


def names_pad(key: str, app_name: str, user_id: str, session_id: str) -> dict[str, Any]:
    """What a session's scratchpad must hold for its names to be read back from `key`."""
    return {NAMES: [app_name, user_id, session_id]} if key.startswith(HASHED_PREFIX) else {}


def list_prefixes(app_name: str, user_id: str | None) -> tuple[str, str]:
    """The two id prefixes under which an app's (a user's) sessions are stored: readable ids and
    digests."""
    readable = f"{SESSION_PREFIX}{_part(app_name)}/"
    hashed = f"{HASHED_PREFIX}{_digest(app_name)}/"
    if user_id is not None:
        readable += _part(user_id) + "/"
        hashed += _digest(user_id) + "/"
    return readable, hashed


def names_of(key: str, pad: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The (app, user, session) names of a session stored under `key`: read from a readable id,
    or from the scratchpad of one stored under a digest (None when it holds none)."""
    if key.startswith(SESSION_PREFIX):
        app_name, user_id, session_id = key[len(SESSION_PREFIX) :].split("/")
        return unquote(app_name), unquote(user_id), unquote(session_id)
    names = pad.get(NAMES)
    if isinstance(names, list) and len(names) == 3 and all(isinstance(n, str) for n in names):
        return names[0], names[1], names[2]
    return None


def _part(name: str) -> str:
    return quote(name, safe="")


def _fits(key: str) -> bool:
    return len(key.encode("utf-8")) <= limits.session_id_bytes_max


def _digest(name: str) -> str:
    return blake3.blake3(name.encode("utf-8")).hexdigest(length=_DIGEST_BYTES)
