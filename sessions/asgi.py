"""Bearer authentication for ASGI applications: static API keys first, then durable bearer sessions.

Plain ASGI 3, no web framework. Owns parsing the `Authorization` header and the 401 answer; the
session checks are `store.tokens.touch`, run in a worker thread so the event loop never waits on
LMDB or an fsync. It must never reveal why a token failed (unknown, expired and revoked get the
same answer), never log or echo a token, and never compare a secret in time that depends on it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from eventlog import IntegrityError, InvalidArgumentError, limits
from sessions._tokens import could_be_token, entropy_problem

if TYPE_CHECKING:
    from sessions._store import SessionStore

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PRINCIPAL = "sessionlog.principal"
"""Scope key: the authenticated principal (str): a session's principal, or an API key's name."""
SESSION_HANDLE = "sessionlog.session_handle"
"""Scope key: the bearer session's handle (str), or None when a static API key matched. The handle
names the session in logs and admin tools; it is not a credential."""
SESSION = "sessionlog.session"
"""Scope key: the touched `BearerSession` record (no token in it), or None for an API key."""
AUTH_METHOD = "sessionlog.auth_method"
"""Scope key: ``"api_key"`` or ``"bearer_session"``."""

UNAUTHORIZED_BODY = json.dumps({"error": "unauthorized"}).encode()
"""The one body of every 401, whatever went wrong, so a caller learns nothing from it."""

_HEADER_BYTES_MAX = len("Bearer ") + limits.token_chars_max + 16
"""An Authorization header longer than this cannot hold a token we accept: refused unparsed."""

_WEBSOCKET_POLICY_VIOLATION = 1008


class BearerAuth:
    """ASGI middleware: ``app = BearerAuth(app, store, api_keys={key: name})``.

    A request passes with ``Authorization: Bearer <credential>`` when the credential is one of
    `api_keys` (compared in constant time against every key) or the token of a live bearer session
    in `store` (which is then touched at `clock()`). On success the scope passed to `app` carries
    `PRINCIPAL`, `SESSION_HANDLE`, `SESSION` and `AUTH_METHOD`. Otherwise HTTP requests get 401
    with ``WWW-Authenticate: Bearer`` and `UNAUTHORIZED_BODY`, and WebSocket handshakes are closed
    with code 1008. Lifespan and other scopes pass through untouched.

    With `check_projections`, construction runs `store.verify(projections=True)` (seconds on a
    large store; see the bench row `verify_projections`) and raises `IntegrityError` if the bearer
    records or any other projection differ from what the log says, so a service never starts
    answering from tampered token state.
    """

    def __init__(
        self,
        app: ASGIApp,
        store: SessionStore,
        *,
        api_keys: Mapping[str, str] | None = None,
        realm: str = "sessionlog",
        clock: Callable[[], datetime] | None = None,
        check_projections: bool = False,
    ) -> None:
        if not realm or not realm.isprintable() or '"' in realm or "\\" in realm:
            raise InvalidArgumentError(
                f"BearerAuth: `realm` must be printable, without quotes, got {realm!r}"
            )
        if check_projections:
            # The token records are a projection: state changed underneath the log could revive
            # a revoked token. Refuse to start on a store whose projections the log disowns.
            report = store.verify(projections=True)
            if not report.ok:
                raise IntegrityError(
                    f"BearerAuth: the store does not verify: {report.problem}; run `sessionlog "
                    "rebuild` to recompute the projections from the log",
                    report.first_bad_position,
                )
        self.app = app
        self.store = store
        self.clock = clock or (lambda: datetime.now(UTC))
        self._keys = [(_digest(key), name) for key, name in _check_keys(api_keys).items()]
        self._challenge = f'Bearer realm="{realm}"'.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        credential = _credential(scope)
        granted = None if credential is None else await self._check(credential)
        if granted is None:
            await self._refuse(scope, send)
            return
        await self.app({**scope, **granted}, receive, send)

    async def _check(self, credential: str) -> dict[str, Any] | None:
        digest = _digest(credential)
        named: str | None = None
        for key_digest, name in self._keys:  # every key, no early exit: time says nothing
            if hmac.compare_digest(digest, key_digest):
                named = name
        if named is not None:
            return {PRINCIPAL: named, SESSION_HANDLE: None, SESSION: None, AUTH_METHOD: "api_key"}
        record = await asyncio.to_thread(self.store.tokens.touch, credential, self.clock())
        if record is None:
            return None
        return {
            PRINCIPAL: record.principal,
            SESSION_HANDLE: record.handle,
            SESSION: record,
            AUTH_METHOD: "bearer_session",
        }

    async def _refuse(self, scope: Scope, send: Send) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": _WEBSOCKET_POLICY_VIOLATION})
            return
        # RFC 6750 section 3.1: no error code when no credentials came; one code for every
        # credential that fails, so unknown, expired and revoked tokens look the same.
        challenge = self._challenge
        if _authorization(scope):
            challenge += b', error="invalid_token"'
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()),
            (b"www-authenticate", challenge),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})


def _digest(secret: str) -> bytes:
    """Fixed-length digests compare in constant time even when the secrets differ in length."""
    return hashlib.sha256(secret.encode()).digest()


def check_api_keys(api_keys: Mapping[str, str] | None) -> dict[str, str]:
    """`api_keys` as `BearerAuth` accepts them, checked before anything starts (a server checks
    its keys before it binds a port); raises `InvalidArgumentError` naming the entry, never the
    key."""
    return _check_keys(api_keys)


def _check_keys(api_keys: Mapping[str, str] | None) -> dict[str, str]:
    """Static keys are credentials too: each must be a high-entropy token with a name."""
    keys = dict(api_keys or {})
    for index, (key, name) in enumerate(keys.items()):
        where = f"BearerAuth: api_keys entry {index}"  # never the key itself
        if not could_be_token(key):
            raise InvalidArgumentError(
                f"{where}: a key must be {limits.token_chars_min} to {limits.token_chars_max} "
                "characters of A-Z a-z 0-9 - . _ ~ + / (and trailing =)"
            )
        problem = entropy_problem(key)
        if problem is not None:
            raise InvalidArgumentError(f"{where}: the key is not high-entropy: {problem}")
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"{where}: its principal must be a non-empty str")
    return keys


def _authorization(scope: Scope) -> list[bytes]:
    return [value for name, value in scope.get("headers", ()) if name.lower() == b"authorization"]


def _credential(scope: Scope) -> str | None:
    """The credential of the one ``Authorization: Bearer`` header, or None if there is no such
    header, several, another scheme, or a value no token can have."""
    values = _authorization(scope)
    if len(values) != 1 or len(values[0]) > _HEADER_BYTES_MAX:
        return None
    scheme, _, rest = values[0].decode("latin-1").partition(" ")
    credential = rest.strip(" ")
    if scheme.lower() != "bearer" or not could_be_token(credential):
        return None
    return credential
