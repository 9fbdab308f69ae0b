"""The viewer's past states under load, over real HTTP against a real `sessionlog serve` (the
server the viewer's browser tests start): rebuilds running at once are bounded, and a request
past the bound is answered 503 with `Retry-After` at once instead of pinning another core.

No browser: these are the viewer's data routes only.
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
from tests._service import Server

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


def _get(server: Server, position: int) -> httpx.Response:
    return httpx.get(
        f"{server.url}/v1/viewer/sessions/s0-0/messages",
        params={"as_of": position, "limit": 5},
        headers={"authorization": f"Bearer {server.admin_key}"},
        timeout=120.0,
    )


def test_past_states_rebuilt_at_once_are_bounded(server: Server) -> None:
    """Requests for as many different past states at once, three times the bound: the ones
    over it are refused with a problem saying when to come back, the others answer, and once
    they are done every one of those states can be had."""
    positions = [EVENTS - 100 - n for n in range(REQUESTS)]  # distinct: none is a cached one
    answers: dict[int, httpx.Response] = {}
    start = threading.Barrier(REQUESTS)

    def ask(position: int) -> None:
        start.wait()
        answers[position] = _get(server, position)

    threads = [threading.Thread(target=ask, args=(p,)) for p in positions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
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
        answer = _get(server, position)
        assert answer.status_code == 200, answer.text
        assert answer.json()["as_of"] == position
        assert [m["content"] for m in answer.json()["data"]] == [f"message {n}" for n in range(5)]


@pytest.mark.parametrize("value", [0, -1, 1.5, True, None])
def test_the_bound_is_set_by_create_app_and_checked(value: object) -> None:
    with SessionStore.memory() as store:
        with pytest.raises(InvalidArgumentError, match="past_rebuilds_max"):
            create_app(store, past_rebuilds_max=value)  # type: ignore[arg-type]
        assert create_app(store, past_rebuilds_max=1).service.past_rebuilds_max == 1
