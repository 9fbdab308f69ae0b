"""The log routes of `sessionlog serve` over real HTTP: event pages, live SSE tails with resume
(Last-Event-ID) across a server restart, the cursor past the head, the final event on SIGTERM,
bundles, seeding, verify and health."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.client import Client, ServiceError, parse_sse
from tests._service import Server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "store").start()
    yield running
    running.kill()


class Tail:
    """`client.follow(...)` on a thread, its events in a queue."""

    def __init__(self, client: Client, session_id: str | None, after: int = 0) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.error: BaseException | None = None
        self._iterator = client.follow(session_id, after=after, reconnect_delay_s=0.1)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for event in self._iterator:
                self.events.put(event)
        except BaseException as exc:  # reported to the test through `error`
            self.error = exc

    def take(self, count: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        return [self.events.get(timeout=timeout_s) for _ in range(count)]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_event_pages(server: Server) -> None:
    with server.client() as admin:
        sid = admin.open_session("paged")
        admin.inject_many(sid, [user("a")])
        for text in "bcd":
            admin.inject(sid, user(text))
        events = admin.events(sid, limit=10)
        assert [e["event"] for e in events] == ["session_opened"] + ["messages_injected"] + [
            "message_injected"
        ] * 3
        assert [e["sequence"] for e in events] == [1, 2, 3, 4, 5]
        after_two = admin.events(sid, after=events[1]["id"], limit=2)
        assert [e["id"] for e in after_two] == [events[2]["id"], events[3]["id"]]
        whole = admin.events(limit=1000)
        assert [e["id"] for e in whole] == list(range(1, len(whole) + 1))
        assert events[0]["resource"] == {"object": "session", "id": sid}


def test_live_tail_replays_then_follows(server: Server) -> None:
    with server.client() as admin, server.client() as watcher:
        sid = admin.open_session("tail")
        admin.inject(sid, user("before"))
        tail = Tail(watcher, sid)
        replayed = tail.take(2)
        assert [e["event"] for e in replayed] == ["session_opened", "message_injected"]
        assert all(e["replayed"] for e in replayed)
        admin.inject(sid, user("live"))
        (live,) = tail.take(1)
        assert live["replayed"] is False and live["payload"]["message"]["content"] == "live"
        other = admin.open_session("elsewhere")
        admin.inject(other, user("not for this tail"))
        admin.inject(sid, user("again"))
        (next_one,) = tail.take(1)
        assert next_one["payload"]["message"]["content"] == "again"
        assert tail.events.empty()


def test_last_event_id_resumes_exactly(server: Server) -> None:
    with server.client() as admin:
        sid = admin.open_session("resume")
        acks = [admin.inject(sid, user(f"m{i}")) for i in range(5)]
        cursor = acks[1]["last_event_id"]
        headers = {
            "authorization": f"Bearer {server.admin_key}",
            "last-event-id": str(cursor),
        }
        url = f"{server.url}/v1/sessions/{sid}/events/stream"
        with httpx.stream("GET", url, headers=headers, timeout=10) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            frames = parse_sse(response.iter_lines())
            got = [next(frames) for _ in range(3)]
        assert [data["id"] for _, data in got] == [a["last_event_id"] for a in acks[2:]]
        assert [kind for kind, _ in got] == ["message_injected"] * 3


def test_a_cursor_beyond_the_head_is_an_error_event(server: Server) -> None:
    with server.client() as admin:
        with pytest.raises(ServiceError) as beyond:
            next(iter(admin.follow(after=10**6)))
        assert beyond.value.status == 400 and "beyond" in str(beyond.value)
        response = httpx.get(
            server.url + "/v1/events/stream",
            headers={"authorization": f"Bearer {server.admin_key}", "last-event-id": "x1"},
        )
        assert response.status_code == 422


def test_sigterm_ends_streams_and_follow_resumes_after_restart(server: Server) -> None:
    with server.client() as admin:
        sid = admin.open_session("restart")
        admin.inject(sid, user("one"))
    raw = httpx.stream(
        "GET",
        f"{server.url}/v1/sessions/{sid}/events/stream",
        headers={"authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    response = raw.__enter__()
    watcher = server.client()
    tail = Tail(watcher, sid)
    assert len(tail.take(2)) == 2
    frames = parse_sse(response.iter_lines())
    assert [next(frames)[0] for _ in range(2)] == ["session_opened", "message_injected"]
    server.stop()
    kind, data = next(frames)
    assert kind == "shutdown" and data == {"after": 2}
    raw.__exit__(None, None, None)
    server.start()
    with server.client() as admin:
        for text in ("two", "three"):
            admin.inject(sid, user(text))
    resumed = tail.take(2)
    assert [e["payload"]["message"]["content"] for e in resumed] == ["two", "three"]
    assert [e["id"] for e in resumed] == [3, 4]  # nothing twice, nothing missed
    assert tail.events.empty() and tail.error is None
    watcher.close()


def test_whole_log_stream_sees_every_stream(server: Server) -> None:
    with server.client() as admin, server.client() as watcher:
        tail = Tail(watcher, None)
        admin.open_session("w1")
        admin.open_session("w2")
        token = admin.create_token("someone", "2099-01-01T00:00:00Z")
        got = tail.take(3)
        assert [e["resource"]["object"] for e in got] == ["session", "session", "bearer_session"]
        assert token["token"] not in json.dumps(got)  # only the handle ever travels


def seed_lines(*texts: str) -> bytes:
    lines = [{"type": "message", "message": user(text)} for text in texts]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_bundles_and_seeding(server: Server, tmp_path: Path) -> None:
    with server.client() as admin:
        seeded = admin.seed(seed_lines("a", "b", "c"), id="seeded")
        assert seeded == {"ok": True, "session_id": "seeded", "messages_loaded": 3, "error": None}
        assert [m["content"] for m in admin.messages("seeded")] == ["a", "b", "c"]
        with pytest.raises(ServiceError) as bad:
            admin.seed(b"{not json\n", id="broken")
        assert bad.value.status == 422 and admin.snapshot("broken") is None
        with pytest.raises(ServiceError) as unknown:
            admin.seed(seed_lines("a"), colour="red")
        assert unknown.value.status == 422 and "colour" in str(unknown.value)
        withheld = admin.export_bundle("seeded", mode="replay_only")
        assert "[withheld]" in json.dumps(withheld) and '"a"' not in json.dumps(withheld)
        bundle = admin.export_bundle("seeded", mode="local")
        assert bundle["_type"] == "harn_session_bundle" and bundle["schema_version"] == 1
        second = Server(tmp_path / "other").start()
        try:
            with second.client() as other:
                assert other.import_bundle(bundle) == "seeded"
                assert other.import_bundle(bundle) == "seeded"  # the same bundle again: no change
                assert [m["content"] for m in other.messages("seeded")] == ["a", "b", "c"]
                with pytest.raises(ServiceError) as invalid:
                    other.import_bundle({"format": "nothing"})
                assert invalid.value.status == 422 and invalid.value.kind == "invalid-bundle"
        finally:
            second.kill()
        with pytest.raises(ServiceError) as mode:
            admin.export_bundle("seeded", mode="everything")
        assert mode.value.status == 422


def test_verify_and_health(server: Server) -> None:
    with server.client() as admin:
        admin.open_session("v")
        report = admin.verify(projections=True)
        assert report["ok"] is True and report["events_checked"] == admin.health()["head"]
        assert report["projection_keys_checked"] and report["projection_keys_checked"] > 0
        headers = {"authorization": f"Bearer {server.admin_key}", "accept": "text/event-stream"}
        with httpx.stream("GET", server.url + "/v1/verify", headers=headers, timeout=30) as r:
            frames = list(parse_sse(r.iter_lines()))
        assert frames[-1][0] == "result" and frames[-1][1]["ok"] is True
        assert all(kind == "progress" for kind, _ in frames[:-1])


def test_principals_cannot_seed_import_or_read_the_whole_log(server: Server) -> None:
    with server.client() as admin:
        token = admin.create_token("pat", "2099-01-01T00:00:00Z")["token"]
        bundle = admin.export_bundle(admin.open_session("b"), mode="local")
    with server.client(token) as pat:
        for call in (
            lambda: pat.seed(seed_lines("a")),
            lambda: pat.import_bundle(bundle),
            pat.events,
            lambda: next(iter(pat.follow(reconnects_max=0))),
        ):
            with pytest.raises(ServiceError) as denied:
                call()
            assert denied.value.status == 403 and denied.value.kind == "forbidden"


def test_past_states_and_their_bounds(server: Server) -> None:
    with server.client() as admin:
        sid = admin.open_session("then")
        head = admin.health()["head"]
        with pytest.raises(ServiceError) as future:
            admin.snapshot(sid, as_of=head + 100)
        assert future.value.status == 422 and f"from 0 to {head}" in str(future.value)
        assert admin.snapshot(sid, as_of=head - 1) is None  # it did not exist yet


def test_past_states_are_bounded(server: Server) -> None:
    from service import _limits

    with server.client() as admin:
        sid = admin.open_session("far")
        with pytest.raises(ServiceError) as far:
            admin.snapshot(sid, as_of=_limits.as_of_position_max + 1)
        assert far.value.status == 413 and far.value.problem["limit_name"] == "as_of_position_max"
    viewer = httpx.get(  # the viewer's past states keep the same bound
        f"{server.url}/v1/viewer/sessions/{sid}/messages",
        params={"as_of": _limits.as_of_position_max + 1},
        headers={"authorization": f"Bearer {server.admin_key}"},
    )
    assert viewer.status_code == 413 and viewer.json()["limit_name"] == "as_of_position_max"
