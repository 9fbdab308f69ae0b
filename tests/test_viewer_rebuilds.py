"""Past states under load, over real HTTP against a real `sessionlog serve`: rebuilds running at
once are bounded, for the viewer's routes and the API's own (`?as_of=`, a fork's `at_event_id`)
by one bound, and a request past it is answered 503 with `Retry-After` at once instead of
pinning another core. `--past-rebuilds-max` sets the bound of a server.

No browser: these are the data routes only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventlog import InvalidArgumentError
from service import _limits, create_app
from sessions import SessionStore
from tests._service import Server, new_key, serving

EVENTS = 40_000
"""Enough that rebuilding a past state near the head takes a good part of a second, so requests
sent together overlap."""
REQUESTS = 3 * _limits.past_rebuilds_max


def _build(path: Path) -> None:
    with SessionStore.open(path) as store:
        for batch in range(EVENTS // 2_000):
            with store.transaction():
                for n in range(2_000):
                    if n % 100 == 0:
                        sid = store.open_session(f"s{batch}-{n}")
                    store.inject(sid, {"role": "user", "content": f"message {n}"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    path = tmp_path_factory.mktemp("viewer-rebuilds") / "store"
    _build(path)
    running = Server(path).start()
    yield running
    running.kill()


ROUTES = ("viewer", "api")


def _get(server: Server, position: int, route: str = "viewer") -> httpx.Response:
    path = "/v1/viewer/sessions/s0-0/messages" if route == "viewer" else "/v1/sessions/s0-0"
    return httpx.get(
        server.url + path,
        params={"as_of": position, "limit": 5} if route == "viewer" else {"as_of": position},
        headers={"authorization": f"Bearer {server.admin_key}"},
        timeout=120.0,
    )


def _contents(answer: httpx.Response, route: str) -> list[str]:
    messages = answer.json()["data" if route == "viewer" else "transcript"]
    return [m["content"] for m in messages[:5]]


def _at_once(server: Server, positions: list[int], route: str) -> dict[int, httpx.Response]:
    """A request for each of `positions`, all sent together."""
    answers: dict[int, httpx.Response] = {}
    start = threading.Barrier(len(positions))

    def ask(position: int) -> None:
        start.wait()
        answers[position] = _get(server, position, route)

    threads = [threading.Thread(target=ask, args=(p,)) for p in positions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    return answers


@pytest.mark.parametrize("route", ROUTES)
def test_past_states_rebuilt_at_once_are_bounded(server: Server, route: str) -> None:
    """Requests for as many different past states at once, three times the bound: the ones
    over it are refused with a problem saying when to come back, the others answer, and once
    they are done every one of those states can be had."""
    shift = ROUTES.index(route) * REQUESTS  # distinct from the other route's: none is cached
    positions = [EVENTS - 100 - shift - n for n in range(REQUESTS)]
    answers = _at_once(server, positions, route)
    statuses = sorted(answer.status_code for answer in answers.values())
    assert len(statuses) == REQUESTS and set(statuses) == {200, 503}, statuses
    refused = next(a for a in answers.values() if a.status_code == 503)
    assert refused.headers["content-type"] == "application/problem+json"
    assert int(refused.headers["retry-after"]) >= 1
    problem: dict[str, Any] = refused.json()
    assert problem["type"] == "urn:sessionlog:problem:busy" and problem["status"] == 503
    assert problem["limit_name"] == "past_rebuilds_max"
    assert problem["limit"] == _limits.past_rebuilds_max
    for position in positions:  # the slots were given back, refused or not
        answer = _get(server, position, route)
        assert answer.status_code == 200, answer.text
        assert _contents(answer, route) == [f"message {n}" for n in range(5)]


@pytest.mark.parametrize("value", [0, -1, 1.5, True, None])
def test_the_bound_is_set_by_create_app_and_checked(value: object) -> None:
    with SessionStore.memory() as store:
        with pytest.raises(InvalidArgumentError, match="past_rebuilds_max"):
            create_app(store, past_rebuilds_max=value)  # type: ignore[arg-type]
        assert create_app(store, past_rebuilds_max=1).service.past_rebuilds_max == 1


def test_the_api_and_the_viewer_share_one_bound(tmp_path: Path) -> None:
    """While every slot of the one bound is taken (as a rebuild in flight holds it), each route
    that rebuilds a past state answers 503 `busy`, the API's as the viewer's; once it is free,
    each answers."""
    key = new_key()
    with SessionStore.open(tmp_path / "store", hot_sessions=0) as store:
        store.open_session("s")
        for n in range(3):
            store.inject("s", {"role": "user", "content": f"m{n}"})
        app = create_app(store, api_keys={key: "admin"}, past_rebuilds_max=1)
        asks = [
            ("GET", "/v1/sessions/s", {"params": {"as_of": 3}}),
            ("POST", "/v1/sessions/s/fork", {"json": {"at_event_id": 3}}),
            ("GET", "/v1/viewer/sessions/s/messages", {"params": {"as_of": 2}}),
            ("GET", "/v1/viewer/sessions/s", {"params": {"version": 2}}),
        ]
        with serving(app) as url, httpx.Client(base_url=url) as http:
            http.headers["authorization"] = f"Bearer {key}"
            slots = app.service.past.slots
            assert slots.acquire(blocking=False)  # the only slot, as a rebuild would hold it
            try:
                head = store.log.head
                for method, path, how in asks:
                    refused = http.request(method, path, **how)
                    assert refused.status_code == 503, (path, refused.text)
                    assert refused.headers["retry-after"] == str(_limits.past_rebuild_retry_after_s)
                    problem = refused.json()
                    assert problem["type"] == "urn:sessionlog:problem:busy"
                    assert (problem["limit_name"], problem["limit"]) == ("past_rebuilds_max", 1)
                assert store.log.head == head  # the refused fork wrote nothing
            finally:
                slots.release()
            for method, path, how in asks:
                answer = http.request(method, path, **how)
                assert answer.status_code in (200, 201), (path, answer.text)
            assert http.get("/v1/sessions/s", params={"as_of": 3}).json()["length"] == 2


def test_serve_takes_the_bound_as_a_flag(server: Server) -> None:
    """`sessionlog serve --past-rebuilds-max 1`: two different past states asked for at once on
    the big store, and only one is rebuilt while the other is refused naming the bound of 1."""
    log = Path(server.store + ".bound-of-one.log")
    one = Server(server.store, options=("--past-rebuilds-max", "1"), log_path=log).start()
    try:
        answers = _at_once(one, [EVENTS - 50 - n for n in range(REQUESTS)], "api")
    finally:
        one.kill()
    refused = [a for a in answers.values() if a.status_code == 503]
    assert refused and all(a.json()["limit"] == 1 for a in refused)
    assert any(a.status_code == 200 for a in answers.values())
