"""`service.create_app` as a library: the app on a uvicorn server in a thread of the test, over a
store the test holds, reached over real HTTP on loopback. Idle streams get heartbeat comments;
bad settings are refused before anything starts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

import projections as pj
from eventlog import InvalidArgumentError
from service import create_app
from service._serve import retention_policy
from sessions import DirectorySink, RetentionPolicy, SessionStore
from tests._service import new_key, serving


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[str, str, SessionStore]]:
    key = new_key()
    store = SessionStore.open(tmp_path / "store", hot_sessions=0)
    app = create_app(store, api_keys={key: "admin"}, heartbeat_interval_s=0.2)
    try:
        with serving(app) as url:
            yield url, key, store
    finally:
        store.close()


def test_idle_streams_get_heartbeats(running: tuple[str, str, SessionStore]) -> None:
    url, key, store = running
    store.open_session("quiet")  # written by the test's own handle on the store
    headers = {"authorization": f"Bearer {key}"}
    lines: list[str] = []
    with httpx.stream("GET", f"{url}/v1/sessions/quiet/events/stream", headers=headers) as r:
        for line in r.iter_lines():
            lines.append(line)
            if lines.count(": heartbeat") == 2:
                break
    assert lines[:2] == ["id: 1", "event: session_opened"]
    assert lines.count(": heartbeat") == 2


def test_commits_of_the_store_handle_reach_the_streams(
    running: tuple[str, str, SessionStore],
) -> None:
    url, key, store = running
    store.open_session("shared")
    headers = {"authorization": f"Bearer {key}", "last-event-id": "1"}
    with httpx.stream("GET", f"{url}/v1/sessions/shared/events/stream", headers=headers) as r:
        lines = r.iter_lines()
        assert next(lines) == ": heartbeat"  # the stream is live: nothing to replay after 1
        store.inject("shared", {"role": "user", "content": "from the library"})
        data = next(line for line in lines if line.startswith("data: "))
    assert "from the library" in data and '"replayed":false' in data


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "store") as store:
        with pytest.raises(InvalidArgumentError):
            create_app(store, heartbeat_interval_s=0)
        with pytest.raises(InvalidArgumentError):
            create_app(store, api_keys={"short": "admin"})
        with pytest.raises(InvalidArgumentError, match="retention"):
            create_app(store, retention=timedelta(days=1))  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="retention_interval_s"):
            create_app(store, retention_interval_s=0)
    # What `sessionlog serve --max-age-days --grace-days --archive` configures.
    with pytest.raises(InvalidArgumentError, match="max_age"):
        retention_policy(max_age_days=-1)
    assert retention_policy() is None
    policy = retention_policy(max_age_days=30, grace_days=2, archive=str(tmp_path / "archive"))
    assert policy is not None and policy.action == "archive"
    assert (policy.max_age, policy.grace) == (timedelta(days=30), timedelta(days=2))
    forget = retention_policy(max_age_days=1)
    assert forget is not None and forget.action == "forget" and forget.sink is None


def test_the_service_sweeps_by_its_retention_policy(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path / "archive")
    policy = RetentionPolicy(max_age=timedelta(0), action="archive", sink=sink)
    with SessionStore.open(tmp_path / "store", hot_sessions=0) as store:
        store.open_session("old")
        store.close_session("old")
        store.open_session("open")
        app = create_app(store, retention=policy, retention_interval_s=0.05)
        with serving(app):
            deadline = time.monotonic() + 20
            while not sink.names() and time.monotonic() < deadline:
                time.sleep(0.05)
        with store.log.view() as view:
            old, still_open = pj.load_state(view, "old"), pj.load_state(view, "open")
        assert old is not None and old.archive in sink.names()
        assert still_open is not None and still_open.archive is None


def test_serve_refuses_missing_or_weak_keys_before_it_starts(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests._service import ROOT

    command = [sys.executable, "-m", "sessionlog", "--store", str(tmp_path / "s"), "serve"]
    for keys, words in ((None, "no API key"), ("admin=password", "api_keys entry 0")):
        env = {k: v for k, v in os.environ.items() if k != "SESSIONLOG_API_KEYS"}
        if keys is not None:
            env["SESSIONLOG_API_KEYS"] = keys
        done = subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("sessionlog: serve: ") and words in done.stderr
        assert "password" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "s").exists()  # nothing was created


@given(st.lists(st.booleans(), max_size=60), st.integers(min_value=0, max_value=70))
def test_a_stream_cursor_is_found_by_binary_search(streams: list[bool], cursor: int) -> None:
    from service._routes_log import version_after

    store = SessionStore.memory()
    store.open_session("a")
    store.open_session("b")
    for to_a in streams:
        store.inject("a" if to_a else "b", {"role": "user", "content": "x"})
    events = store.log.read_stream("a", limit=1000)
    assert version_after(store, "a", cursor) == sum(1 for e in events if e.position <= cursor)


def test_a_retry_whose_answer_was_truncated_away_gets_a_typed_410(
    running: tuple[str, str, SessionStore], tmp_path: Path
) -> None:
    url, key, store = running
    headers = {"authorization": f"Bearer {key}", "idempotency-key": "req-1"}
    body = {"message": {"role": "user", "content": "once"}}
    with httpx.Client(base_url=url, headers=headers) as http:
        assert http.post("/v1/sessions", json={"id": "old"}).status_code == 201
        first = http.post("/v1/sessions/old/messages", json=body)
        assert first.status_code == 201
        store.close_session("old")
        head = store.log.head
        store.truncate_log(head + 1, sink=DirectorySink(tmp_path / "archive"))
        for sent in (body, {"message": {"role": "user", "content": "other"}}):
            again = http.post("/v1/sessions/old/messages", json=sent)
            assert again.status_code == 410, again.text
            problem = again.json()
            assert problem["type"] == "urn:sessionlog:problem:idempotency-result-truncated"
            assert problem["stream"] == "old" and problem["anchor"] == head
            assert problem["first_position"] == first.json()["first_event_id"]
            assert "no longer available" in problem["detail"]
    assert store.log.head == head  # nothing applied again


def test_a_read_of_truncated_history_gets_a_typed_410(
    running: tuple[str, str, SessionStore], tmp_path: Path
) -> None:
    url, key, store = running
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}) as http:
        assert http.post("/v1/sessions", json={"id": "old"}).status_code == 201
        body = {"message": {"role": "user", "content": "gone"}}
        assert http.post("/v1/sessions/old/messages", json=body).status_code == 201
        store.close_session("old")
        head = store.log.head
        store.truncate_log(head + 1, sink=DirectorySink(tmp_path / "archive"))
        past = http.get("/v1/sessions/old", params={"as_of": 1})
    assert past.status_code == 410, past.text
    problem = past.json()
    assert problem["type"] == "urn:sessionlog:problem:truncated"
    assert f"after position {head}" in problem["detail"]
    assert store.log.head == head
