"""The application: Starlette routes behind `sessions.asgi.BearerAuth`, errors as problem+json,
and the parts (the stream hub, the refusal of writes once stopping) started and stopped with the
app.

`create_app(store, api_keys=...)` returns a plain ASGI app for any server. `/v1/health`,
`/v1/openapi.json` and the viewer's static files (`/`, `/viewer/...`: no data in them) answer
without credentials; everything else needs an API key or a live bearer session. The app never
closes the store it was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from eventlog import InvalidArgumentError, SessionLogError
from service import _headers, _limits, _openapi, _problems, _routes, _routes_log
from service._hub import Hub
from service._problems import HTTPProblem
from service._request import Service
from service._serve import draining_on_signals
from service.viewer import ROUTES as VIEWER_ROUTES
from service.viewer import is_public as viewer_file
from sessions import RetentionPolicy, SessionStore
from sessions.asgi import BearerAuth, Message, Receive, Scope, Send

logger = logging.getLogger("sessionlog.service")

PROTOCOL_HEADER = "harn-agents-protocol-version"
PROTOCOL_VERSION = "agents-protocol-2026-04-25"
"""The Agents Protocol version this service speaks; a request naming another gets 426."""

PUBLIC_PATHS = frozenset(("/v1/health", "/v1/openapi.json"))


def create_app(
    store: SessionStore,
    *,
    api_keys: Mapping[str, str] | None = None,
    follow: bool = False,
    poll_interval_s: float = 0.02,
    heartbeat_interval_s: float = _limits.heartbeat_interval_s,
    retention: RetentionPolicy | None = None,
    retention_interval_s: float = _limits.retention_interval_s_default,
    past_rebuilds_max: int = _limits.past_rebuilds_max,
) -> Gate:
    """The service over `store`. `api_keys` maps each static key to its (admin) principal name.
    `follow=True` makes streams see commits of other processes sharing the store (several
    workers); otherwise they hear this process's commits directly. Idle streams get a comment
    line every `heartbeat_interval_s`.

    Open `store` with ``hot_sessions=0`` (as `sessionlog serve` does): the app reads from many
    threads at once, and the engine's cache of decoded transcripts is not shared between threads.

    With a `retention` policy the app sweeps the store by it (`SessionStore.sweep`) every
    `retention_interval_s` while it runs; a failed sweep is logged and the next one runs. Several
    workers on one store each sweep: a sweep is idempotent, and a session another worker
    retired meanwhile is skipped.

    The app rebuilds at most `past_rebuilds_max` past states at once, one bound for every route
    that shows one (`?as_of=`, a fork's `at_event_id`, the viewer's `as_of` and `version`); a
    request past that is answered 503 with `Retry-After`."""
    _check_settings(heartbeat_interval_s, retention, retention_interval_s)
    if type(past_rebuilds_max) is not int or past_rebuilds_max < 1:
        raise InvalidArgumentError(
            f"create_app: past_rebuilds_max must be an int >= 1, got {past_rebuilds_max!r}"
        )
    hub = Hub(
        store,
        follow=follow,
        poll_interval_s=poll_interval_s,
        heartbeat_interval_s=heartbeat_interval_s,
    )
    parts = Service(store=store, hub=hub, past_rebuilds_max=past_rebuilds_max)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        hub.start()
        loop = asyncio.get_running_loop()
        try:
            async with _sweeping(store, retention, retention_interval_s):
                with draining_on_signals(lambda: loop.call_soon_threadsafe(hub.drain)):
                    yield
        finally:
            hub.drain()
            hub.stop()
            parts.stopping = True

    app = Starlette(
        routes=[
            *_routes.ROUTES,
            *_routes_log.ROUTES,
            Route("/v1/openapi.json", openapi, methods=["GET"]),
            *VIEWER_ROUTES,
        ],
        exception_handlers={
            SessionLogError: _problem,
            HTTPProblem: _problem,
            HTTPException: _http_exception,
            Exception: _problem,
        },
        lifespan=lifespan,
    )
    app.state.service = parts
    return Gate(app, _ProblemAuth(app, store, api_keys=api_keys), parts)


def _check_settings(
    heartbeat_interval_s: float, retention: object, retention_interval_s: float
) -> None:
    for name, value in (
        ("heartbeat_interval_s", heartbeat_interval_s),
        ("retention_interval_s", retention_interval_s),
    ):
        if not value > 0:
            raise InvalidArgumentError(f"create_app: {name} must be > 0, got {value!r}")
    if retention is not None and not isinstance(retention, RetentionPolicy):
        raise InvalidArgumentError(
            f"create_app: retention must be a RetentionPolicy: {retention!r}"
        )


@contextlib.asynccontextmanager
async def _sweeping(
    store: SessionStore, policy: RetentionPolicy | None, interval_s: float
) -> AsyncIterator[None]:
    """`_sweep_forever` in a task for the block, when there is a policy."""
    if policy is None:
        yield
        return
    task = asyncio.create_task(_sweep_forever(store, policy, interval_s))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _sweep_forever(store: SessionStore, policy: RetentionPolicy, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            report = await asyncio.to_thread(store.sweep, policy)
        except Exception:  # a store error must not end the sweeps for good
            logger.exception("the retention sweep failed; trying again in %.0fs", interval_s)
            continue
        if report.archived or report.forgotten:
            logger.info(
                "retention: archived %d, forgot %d sessions",
                len(report.archived),
                len(report.forgotten),
            )


async def openapi(request: Request) -> Response:
    return Response(_openapi.document_bytes(), media_type="application/json")


async def _problem(request: Request, exc: Exception) -> Response:
    status, answer = _problems.problem_of(exc, request.url.path)
    headers = exc.headers if isinstance(exc, HTTPProblem) else None
    return Response(
        _problems.encode(answer),
        status_code=status,
        media_type=_problems.MEDIA_TYPE,
        headers=headers,
    )


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "malformed-request")
    detail = (
        f"no route {request.method} {request.url.path}"
        if exc.status_code in (404, 405)
        else str(exc.detail)
    )
    answer = _problems.body(exc.status_code, kind, detail, request.url.path)
    return Response(
        _problems.encode(answer),
        status_code=exc.status_code,
        media_type=_problems.MEDIA_TYPE,
        headers=exc.headers,
    )


class Gate:
    """The outermost ASGI layer: the protocol version and the headers the service refuses
    (`_headers`) are checked, public paths pass, the rest goes through `BearerAuth` (with its 401
    as problem+json)."""

    def __init__(self, app: Starlette, guarded: BearerAuth, parts: Service) -> None:
        self.app = app
        self.guarded = guarded
        self.service = parts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        version = _header(scope, PROTOCOL_HEADER.encode())
        if version is not None and version != PROTOCOL_VERSION:
            await _send_problem(
                send,
                426,
                "unsupported-protocol-version",
                f"this server speaks {PROTOCOL_VERSION}, the request asked for {version}",
                scope.get("path", ""),
            )
            return
        path = scope.get("path", "")
        refused = _headers.refusal(scope.get("headers", ()))
        if refused is not None:
            extra = [(k.encode(), v.encode()) for k, v in refused.headers.items()]
            await _send_problem(send, refused.status, refused.kind, refused.detail, path, extra)
            return
        if path in PUBLIC_PATHS or (scope.get("method") == "GET" and viewer_file(path)):
            await self.app(scope, receive, send)
            return
        await self.guarded(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            text: str = value.decode("latin-1")
            return text
    return None


class _ProblemAuth(BearerAuth):
    """`BearerAuth` whose 401 is problem+json (its challenge header kept). Overriding the refusal,
    rather than wrapping `send`, keeps every streamed chunk free of an extra layer."""

    async def _refuse(self, scope: Scope, send: Send) -> None:
        if scope["type"] != "http":
            await super()._refuse(scope, send)
            return
        captured: list[Message] = []

        async def keep(message: Message) -> None:
            captured.append(message)

        await super()._refuse(scope, keep)
        challenge = [(k, v) for k, v in captured[0]["headers"] if k.lower() == b"www-authenticate"]
        detail = "a valid API key or bearer token is needed"
        await _send_problem(send, 401, "unauthorized", detail, scope.get("path", ""), challenge)


async def _send_problem(
    send: Send,
    status: int,
    kind: str,
    detail: str,
    path: str,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = _problems.encode(_problems.body(status, kind, detail, path))
    headers = [
        (b"content-type", _problems.MEDIA_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *(extra_headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
