"""Who may do what: static API keys are admins; a bearer session's principal sees and changes only
the sessions it created and their forks, unless its attributes grant every session.

A session a caller may not see answers exactly as an unknown one (404, same words), so ids never
leak. The owner is recorded at creation in the session's metadata under `OWNER_KEY`; forks belong
to the owner of their root. Must never trust a client to name its own principal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eventlog import InvalidArgumentError, SessionExistsError, UnknownSessionError
from service._problems import HTTPProblem
from sessions import SessionStore
from sessions._ids import check_session_id
from sessions.asgi import AUTH_METHOD, PRINCIPAL, SESSION

OWNER_KEY = "sessionlog.owner"
"""The metadata key naming the principal that created a session through the service."""

GRANT_ATTRIBUTE = "sessions"
GRANT_ALL = "all"
"""A bearer session whose attributes hold ``{"sessions": "all"}`` sees every session."""

_ANCESTORS_MAX = 64
"""How far up a fork chain the owner is looked for; deeper chains are followed by their root."""


@dataclass(frozen=True)
class Caller:
    principal: str
    admin: bool
    all_sessions: bool

    @classmethod
    def of(cls, scope: Mapping[str, Any]) -> Caller:
        admin = scope.get(AUTH_METHOD) == "api_key"
        record = scope.get(SESSION)
        attributes = getattr(record, "attributes", None) or {}
        grant = attributes.get(GRANT_ATTRIBUTE) == GRANT_ALL
        return cls(str(scope.get(PRINCIPAL, "")), admin, admin or grant)

    def require_admin(self, what: str) -> None:
        if not self.admin:
            raise HTTPProblem(403, "forbidden", f"{what} needs an API key (an administrator)")

    def require_all(self, what: str) -> None:
        if not self.all_sessions:
            raise HTTPProblem(
                403, "forbidden", f"{what} shows every session: an API key or a grant of all"
            )


def owner_of(store: SessionStore, session_id: str) -> str | None:
    """The principal that created `session_id` or the root of its fork family; None if unknown."""
    current: str | None = session_id
    for _ in range(_ANCESTORS_MAX):
        if current is None:
            return None
        summary = store.summary(current)
        if summary is None:
            return None
        owner = (summary.get("metadata") or {}).get(OWNER_KEY)
        if isinstance(owner, str):
            return owner
        current = summary.get("parent_id")
    return None


def may_see(store: SessionStore, caller: Caller, session_id: str) -> bool:
    return caller.all_sessions or owner_of(store, session_id) == caller.principal


def check_visible(store: SessionStore, caller: Caller, session_id: str, verb: str) -> None:
    """Raise the engine's own `UnknownSessionError` for a session the caller may not see."""
    if not may_see(store, caller, session_id):
        raise UnknownSessionError(session_id, verb)


def owned_metadata(caller: Caller, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """The metadata a new session is created with: the caller becomes its owner. Only an admin
    may name another owner (to create a session on a principal's behalf)."""
    given = dict(metadata or {})
    if OWNER_KEY in given and not caller.admin:
        raise InvalidArgumentError(f"metadata: `{OWNER_KEY}` is set by the service, not the caller")
    if caller.admin:
        return given or None
    given[OWNER_KEY] = caller.principal
    return given


def check_new_id(store: SessionStore, caller: Caller, session_id: str | None, verb: str) -> None:
    """Refuse an id a session is to be made under (opened, or forked into) that the caller may
    not take. An id must be one path segment of a URL (no `/`, not `.` or `..`), or no route
    could name the session. A caller that is not an admin takes only an id never used, or one
    whose history it owns: reopening another principal's closed or deleted session would hand
    it that history (the events page, `as_of`). The ids are one namespace, so the refusal says
    the id is taken, never whose it is nor what it holds. Run inside the command's transaction,
    where nobody else can take the id between this check and the write."""
    if session_id is None:
        return
    sid = check_session_id(session_id, where=verb)
    if "/" in sid or sid in (".", ".."):
        raise InvalidArgumentError(
            f"{verb}: session id {sid!r} cannot be one segment of a URL path (it holds `/`, or "
            f"is `.` or `..`): the service could never address it"
        )
    if caller.admin:
        return
    tx = store.log.current_transaction()
    used = (tx or store.log).stream_version(sid) > 0
    if used and owner_of(store, sid) != caller.principal:
        raise SessionExistsError(f"{verb}: the session id `{sid}` is taken; choose another")
