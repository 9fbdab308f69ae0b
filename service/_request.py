"""What every handler needs: the service's parts, the caller, a bounded JSON body, JSON answers,
reads off the event loop, and writes through the store's group commit with `Idempotency-Key`
honoured.

A retried write (same caller, method, path and key) writes nothing and answers as the first did;
the same key with another body is a 409. The key is recorded in the first event the write appends,
in the same commit, so the promise holds across restarts and between worker processes. What is
recorded are digests (of the key, scoped to the caller, method and path; of the body); when that
event goes to an encrypted session the engine keeps them keyed by the session's data key
(`SessionStore.keyed_digest`), so after `forget` no guess of the key or the body can be checked.
The key's digest is keyed only when the request's path names that session: a retry must find the
first attempt before it knows where it wrote. A request that creates a session (an id in its body,
which a reused key may change, or none) keeps it unkeyed, so a guessed key can still be checked
after `forget`; its body's digest is keyed by the new session's key all the same.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from eventlog import ForgottenError, LogClosedError, Transaction, convert
from service import _limits
from service._access import Caller
from service._hub import Hub
from service._past import PastRebuilds
from service._problems import HTTPProblem
from sessions import SessionStore

T = TypeVar("T")
Answer = tuple[int, Any]
Found = tuple[str, int, int]

_encoder = msgspec.json.Encoder()


@dataclass
class Service:
    """The parts one app shares: the store and its stream hub."""

    store: SessionStore
    hub: Hub
    stopping: bool = False
    """Set when the app shuts down: writes are refused from then on."""
    past_rebuilds_max: int = _limits.past_rebuilds_max
    """Past states the app may rebuild at once (`create_app`'s setting)."""
    past: PastRebuilds = field(init=False)
    """The one bound on those rebuilds, for the API's routes and the viewer's alike."""

    def __post_init__(self) -> None:
        self.past = PastRebuilds(self.past_rebuilds_max)

    async def submit(self, run: Callable[[], Any], *, solo: bool = False) -> Any:
        """`run()` in the store's group commit (`sessions/_group.py`): its own savepoint of a
        commit shared with the requests that arrived together, or, `solo`, a commit of its own
        (big imports). Returns once that commit is durable, so an answer of 2xx always means the
        write survives a crash. The loop never waits on storage."""
        if self.stopping:
            raise LogClosedError("the service is stopping; nothing was written")
        return await self.store._group.submit(run, solo=solo)


def service(request: Request) -> Service:
    found: Service = request.app.state.service
    return found


def caller(request: Request) -> Caller:
    return Caller.of(request.scope)


def respond(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    if status == 204:
        return Response(status_code=204, headers=headers)
    return Response(
        _encoder.encode(data), status_code=status, media_type="application/json", headers=headers
    )


async def body_bytes(request: Request, limit: int = _limits.body_bytes_max) -> bytes:
    """The body, refused with 413 as soon as it passes `limit` (never read whole first)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPProblem(
            413, "payload-too-large", f"the body has {declared} bytes; at most {limit} are read"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPProblem(
                413, "payload-too-large", f"the body passed {limit} bytes, the most read here"
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(
    request: Request, type_: type[T], *, limit: int = _limits.body_bytes_max
) -> tuple[T, bytes]:
    """The body decoded into `type_`, and its bytes (which an idempotency key fingerprints)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    raw = await body_bytes(request, limit)
    if not raw and media == "":
        raw, media = b"{}", "application/json"  # a POST without a body takes the defaults
    if media != "application/json":
        raise HTTPProblem(
            415, "unsupported-media-type", f"expected application/json, got {media or 'nothing'}"
        )
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise HTTPProblem(400, "malformed-request", f"the body is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise HTTPProblem(
            400, "malformed-request", f"the body must be a JSON object, got {type(parsed).__name__}"
        )
    return convert(parsed, type_, what="request body"), raw


async def read(fn: Callable[..., T], *args: Any) -> T:
    """Run a read of the store in a worker thread: the loop never waits on storage."""
    return await run_in_threadpool(fn, *args)


async def write(
    request: Request,
    act: Callable[[], Answer],
    *,
    again: Callable[[Found], Answer],
    raw: bytes = b"",
    solo: bool = False,
    session_id: str | None = None,
) -> Response:
    """Run `act` in the group commit; with an `Idempotency-Key`, a retry answers `again(found)` instead,
    where `found` is ``(stream, first, last)`` of the first attempt's events. `session_id`: the
    session the request's path names, to which the write's first event goes (see the module's
    text); None for a write that creates one."""
    svc = service(request)
    key = request.headers.get("idempotency-key")
    if key is None:
        status, data = await svc.submit(act, solo=solo)
        return respond(data, status)
    scoped, fingerprint = _scoped_key(request, key, raw)
    store = svc.store
    stamp = {"idempotency_key": scoped, "request_sha256": fingerprint}
    digests = ("request_sha256",) if session_id is None else tuple(stamp)

    def run() -> tuple[Found | None, Answer | None]:
        with store.log.transaction(join=True) as tx:
            found = _first_attempt(store, tx, session_id, scoped)
            if found is None:
                tx.stamp_next_append(stamp, digests=digests, stream=session_id)
                try:
                    return None, act()
                finally:
                    tx.stamp_next_append(None)
            anchor = tx.anchor[0]
            if found[1] <= anchor:
                raise _truncated(found, anchor)
            first = tx.event_at(found[1])
            if first is None or not _same_body(store, found[0], first.meta, fingerprint):
                raise HTTPProblem(
                    409,
                    "idempotency-key-reused",
                    "this Idempotency-Key was used for a request with another body",
                )
            return found, None

    found, answer = await svc.submit(run, solo=solo)
    if found is None:
        assert answer is not None
        return respond(answer[1], answer[0])
    status, data = await read(again, found)
    return respond(data, status, {"idempotent-replayed": "true"})


def _first_attempt(
    store: SessionStore, tx: Transaction, session_id: str | None, scoped: str
) -> Found | None:
    """Where the first attempt of a request whose key's digest is `scoped` wrote: looked up under
    the session's key when it is encrypted, then as it is (a plain session's, one a request that
    names no session made, or one written before digests were keyed)."""
    keyed = None
    if session_id is not None:
        try:
            keyed = store.keyed_digest(session_id, scoped)
        except ForgottenError:
            pass  # its key is gone, and every digest keyed by it: the write itself refuses it
    if keyed is not None:
        found = tx.appended_with(keyed)
        if found is not None:
            return found
    return tx.appended_with(scoped)


def _same_body(store: SessionStore, stream: str, meta: dict[str, Any], fingerprint: str) -> bool:
    """Whether the first attempt, whose first event went to `stream` with `meta`, carried the body
    whose digest is `fingerprint`: as it is, or keyed by that session's key when it is encrypted."""
    stored = meta.get("request_sha256")
    if stored == fingerprint:
        return True
    keyed = store.keyed_digest(stream, fingerprint)
    return keyed is not None and stored == keyed


def _truncated(found: Found, anchor: int) -> HTTPProblem:
    """The answer to a retry whose first attempt's events were truncated from the log: it was
    applied (and is not applied again), but what it answered, and the body it carried, went
    with them to the archive."""
    stream, first, last = found
    return HTTPProblem(
        410,
        "idempotency-result-truncated",
        f"this Idempotency-Key's request was applied at positions {first} to {last} of "
        f"`{stream}`, which were truncated from the log (it now starts after position "
        f"{anchor}): it is not applied again, and its original answer is no longer available",
        stream=stream,
        first_position=first,
        last_position=last,
        anchor=anchor,
    )


def _scoped_key(request: Request, key: str, raw: bytes) -> tuple[str, str]:
    if not key or len(key) > _limits.idempotency_key_chars_max or not key.isprintable():
        raise HTTPProblem(
            400,
            "malformed-request",
            f"Idempotency-Key must be 1 to {_limits.idempotency_key_chars_max} printable "
            f"characters, got {len(key)}",
        )
    who = caller(request).principal
    scope = f"{who}\n{request.method}\n{request.url.path}\n{key}".encode()
    return "http:" + hashlib.sha256(scope).hexdigest(), hashlib.sha256(raw).hexdigest()[:32]
