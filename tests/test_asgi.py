"""The bearer ASGI middleware, driven through a real server (uvicorn on loopback) with httpx.

Times are passed in: the middleware's clock is fixed by each test, and expiry is reached by
creating sessions whose lifetime ended before that clock, never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import uvicorn

from sessions import BearerSession, InvalidArgumentError, SessionStore
from sessions.asgi import (
    AUTH_METHOD,
    PRINCIPAL,
    SESSION,
    SESSION_HANDLE,
    UNAUTHORIZED_BODY,
    BearerAuth,
    Message,
    Scope,
)

NOW = datetime(2026, 5, 10, 12, 0, tzinfo=UTC)
API_KEY = "ak_" + "Zq3Ls9Vx0Kd7Rt2MwPb8Ny5Hf1GcJe6AuTy4"
SERVER_START_TIMEOUT_S = 10


async def echo_app(scope: Scope, receive: Any, send: Any) -> None:
    """Answers with what the middleware put into the scope."""
    session = scope.get(SESSION)
    body = json.dumps(
        {
            "principal": scope.get(PRINCIPAL),
            "handle": scope.get(SESSION_HANDLE),
            "method": scope.get(AUTH_METHOD),
            "attributes": session.attributes if isinstance(session, BearerSession) else None,
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


@dataclass
class Server:
    url: str
    store: SessionStore

    def get(self, headers: list[tuple[str, str]] | None = None) -> httpx.Response:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            return client.get("/whoami", headers=headers or [])

    def bearer(self, token: str) -> httpx.Response:
        return self.get([("Authorization", f"Bearer {token}")])


def serve(app: Any) -> Iterator[str]:
    """Runs `app` under uvicorn in a thread on a free loopback port; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, lifespan="off", ws="none", http="h11", log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    poll = threading.Event()  # never set: its wait is a short pause between looks
    for _ in range(SERVER_START_TIMEOUT_S * 100):
        if server.started:
            break
        poll.wait(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(SERVER_START_TIMEOUT_S)
        sock.close()


ServerFactory = Callable[..., Server]


@pytest.fixture
def make_server(store: SessionStore) -> Iterator[ServerFactory]:
    stops: list[Any] = []

    def make(**options: Any) -> Server:
        options.setdefault("clock", lambda: NOW)
        options.setdefault("api_keys", {API_KEY: "ops-robot"})
        running = contextlib.contextmanager(serve)(BearerAuth(echo_app, store, **options))
        url = running.__enter__()
        stops.append(running)
        return Server(url, store)

    yield make
    for running in stops:
        running.__exit__(None, None, None)


def live(store: SessionStore, **options: Any) -> BearerSession:
    return store.tokens.create(
        "user_123", NOW + timedelta(days=7), created_at=NOW - timedelta(days=1), **options
    )


def assert_refused(response: httpx.Response, *, error: bool = True) -> None:
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="sessionlog"')
    assert ('error="invalid_token"' in challenge) == error
    assert response.content == UNAUTHORIZED_BODY
    assert response.headers["cache-control"] == "no-store"


# Through the server


def test_a_live_token_passes_and_is_touched(make_server: ServerFactory) -> None:
    server = make_server()
    made = live(server.store, attributes={"role": "operator"})
    assert made.token is not None
    response = server.bearer(made.token)
    assert response.status_code == 200
    assert response.json() == {
        "principal": "user_123",
        "handle": made.handle,
        "method": "bearer_session",
        "attributes": {"role": "operator"},
    }
    assert made.token not in response.text
    found = server.store.tokens.get(made.token, now=NOW)
    assert found is not None
    assert found.last_seen_at == NOW.isoformat()
    assert found.expires_at == made.expires_at  # touching never extends a session


def test_the_scheme_is_case_insensitive(make_server: ServerFactory) -> None:
    server = make_server()
    made = live(server.store)
    assert made.token is not None
    assert server.get([("Authorization", f"bearer  {made.token}")]).status_code == 200


def test_a_missing_header_is_refused_without_an_error_code(make_server: ServerFactory) -> None:
    server = make_server()
    assert_refused(server.get(), error=False)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "Bearer",
        "Bearer =",
        "Basic dXNlcjpwYXNzd29yZA==",
        "Bearer short",
        "Bearer two " + secrets.token_urlsafe(32),
        "Bearer " + secrets.token_urlsafe(32) + "!",
        "Bearer " + "A" * 5_000,
        "Token " + secrets.token_urlsafe(32),
    ],
)
def test_malformed_headers_are_refused(make_server: ServerFactory, value: str) -> None:
    server = make_server()
    assert_refused(server.get([("Authorization", value)]))


def test_two_authorization_headers_are_refused(make_server: ServerFactory) -> None:
    server = make_server()
    made = live(server.store)
    assert made.token is not None
    headers = [("Authorization", f"Bearer {made.token}")] * 2
    assert_refused(server.get(headers))


def test_unknown_expired_and_revoked_tokens_get_the_same_answer(
    make_server: ServerFactory,
) -> None:
    server = make_server()
    store = server.store
    expired = store.tokens.create(
        "user_123", NOW - timedelta(seconds=1), created_at=NOW - timedelta(days=2)
    )
    at_expiry = store.tokens.create("user_123", NOW, created_at=NOW - timedelta(days=2))
    revoked = live(store)
    assert expired.token and at_expiry.token and revoked.token
    store.tokens.expire(revoked.token, now=NOW - timedelta(hours=1))
    head = store.log.head
    answers = [
        server.bearer(token)
        for token in (secrets.token_urlsafe(32), expired.token, at_expiry.token, revoked.token)
    ]
    for response in answers:
        assert_refused(response)
    first = answers[0]
    for response in answers[1:]:
        assert response.content == first.content
        assert response.headers["www-authenticate"] == first.headers["www-authenticate"]
        assert sorted(response.headers.keys()) == sorted(first.headers.keys())
    assert store.log.head == head  # a refused token touches nothing


def test_static_keys_are_checked_first(make_server: ServerFactory) -> None:
    server = make_server()
    # A bearer session whose token is also a static key: the key wins and the session is not
    # touched.
    shadowed = live(server.store, id=API_KEY)
    head = server.store.log.head
    response = server.bearer(API_KEY)
    assert response.status_code == 200
    assert response.json() == {
        "principal": "ops-robot",
        "handle": None,
        "method": "api_key",
        "attributes": None,
    }
    assert server.store.log.head == head
    found = server.store.tokens.get(API_KEY, now=NOW)
    assert found is not None
    assert found.last_seen_at == shadowed.last_seen_at


def test_the_event_loop_keeps_serving_while_a_touch_waits(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_server()
    made = live(server.store)
    assert made.token is not None
    release = threading.Event()
    entered = threading.Event()
    touch = server.store.tokens.touch

    def slow_touch(token: str, now: Any = None) -> BearerSession | None:
        entered.set()
        assert release.wait(30), "the test never released the touch"
        return touch(token, now)

    monkeypatch.setattr(server.store.tokens, "touch", slow_touch)
    results: dict[str, int] = {}
    waiting = threading.Thread(
        target=lambda: results.update(slow=server.bearer(made.token or "").status_code)
    )
    waiting.start()
    try:
        assert entered.wait(30)
        # The touch is parked in a worker thread; the loop must still answer other requests.
        assert server.bearer(API_KEY).status_code == 200
        assert_refused(server.get(), error=False)
        assert "slow" not in results
    finally:
        release.set()
        waiting.join(30)
    assert results == {"slow": 200}


def test_a_long_write_does_not_hold_up_refusals_or_seen_tokens(make_server: ServerFactory) -> None:
    """Bearer checks read first: a 401 for an unknown token, and a pass for a token already
    touched at this clock, are answered while another thread holds the write transaction."""
    server = make_server()
    made = live(server.store)
    assert made.token is not None
    assert server.bearer(made.token).status_code == 200  # touched at NOW: nothing left to write
    holding, release = threading.Event(), threading.Event()
    order: list[str] = []

    def long_write() -> None:
        with server.store.log.transaction():
            holding.set()
            released = release.wait(5)  # only a check that queues behind us runs this out
            order.append("writer done" if released else "writer timed out")

    writer = threading.Thread(target=long_write)
    writer.start()
    try:
        assert holding.wait(30)
        assert_refused(server.bearer(secrets.token_urlsafe(32)))
        order.append("401 answered")
        assert server.bearer(made.token).status_code == 200
        order.append("200 answered")
    finally:
        release.set()
        writer.join(30)
    assert order == ["401 answered", "200 answered", "writer done"]


# The middleware called directly (scopes uvicorn is not started for here)


def run_app(app: BearerAuth, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def test_lifespan_passes_through(store: SessionStore) -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        seen.append(scope["type"])
        await send({"type": "lifespan.startup.complete"})

    sent = run_app(BearerAuth(app, store), {"type": "lifespan"})
    assert seen == ["lifespan"]
    assert sent == [{"type": "lifespan.startup.complete"}]


def test_a_websocket_without_a_token_is_closed_before_the_app(store: SessionStore) -> None:
    seen: list[Scope] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        seen.append(scope)

    auth = BearerAuth(app, store, clock=lambda: NOW)
    sent = run_app(auth, {"type": "websocket", "headers": []})
    assert sent == [{"type": "websocket.close", "code": 1008}]
    assert seen == []
    made = live(store)
    assert made.token is not None
    header = [(b"authorization", f"Bearer {made.token}".encode())]
    assert run_app(auth, {"type": "websocket", "headers": header}) == []
    assert seen[0][SESSION_HANDLE] == made.handle


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"a" * 40: "robot"}, "not high-entropy"),
        ({"short": "robot"}, "a key must be 32 to 512"),
        ({API_KEY: ""}, "principal must be a non-empty str"),
    ],
)
def test_weak_static_keys_are_refused_without_naming_them(
    store: SessionStore, keys: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        BearerAuth(echo_app, store, api_keys=keys)
    for key in keys:
        assert key not in str(caught.value)
