"""The service under many streams and several processes: 1,000 concurrent SSE streams on one
server process all receive a commit; with `--workers 2` a stream sees the commits of both workers;
a consumer that stops reading is ended with an `overflow` event and its cursor, and the server's
buffer for it stays bounded."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sessions import SessionStore
from tests._service import Server

STREAMS = 1_000


def stream_request(server: Server, path: str) -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {server.admin_key}\r\n"
        "accept: text/event-stream\r\n\r\n"
    ).encode()


async def many_streams_receive_one_commit(server: Server, sid: str) -> list[bytes]:
    request = stream_request(server, f"/v1/sessions/{sid}/events/stream")
    opened = []
    for _ in range(STREAMS):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request)
        opened.append((reader, writer))
    for reader, _ in opened:
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    async with httpx.AsyncClient(
        base_url=server.url, headers={"authorization": f"Bearer {server.admin_key}"}
    ) as http:
        assert (await http.get("/v1/health")).json()["streams_open"] == STREAMS
        response = await http.post(
            f"/v1/sessions/{sid}/messages", json={"message": {"role": "user", "content": "to all"}}
        )
        assert response.status_code == 201

    async def until_message(reader: asyncio.StreamReader) -> bytes:
        while True:
            chunk = await reader.readuntil(b"\n\n")
            if b"to all" in chunk:
                return chunk

    got = await asyncio.wait_for(asyncio.gather(*(until_message(r) for r, _ in opened)), 120)
    for _, writer in opened:
        writer.close()
    return got


@pytest.mark.slow
def test_a_thousand_streams_on_one_process(tmp_path: Path) -> None:
    server = Server(tmp_path / "store").start()
    try:
        with server.client() as admin:
            sid = admin.open_session("fanout")
        frames = asyncio.run(many_streams_receive_one_commit(server, sid))
        assert len(frames) == STREAMS
        assert all(b"event: message_injected" in frame and b"id: 2\n" in frame for frame in frames)
        deadline = time.monotonic() + 30
        with server.client() as admin:
            while admin.health()["streams_open"] and time.monotonic() < deadline:
                time.sleep(0.2)
            assert admin.health()["streams_open"] == 0  # closed streams are forgotten
    finally:
        server.kill()


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[Server]:
    server = Server(tmp_path / "store", workers=2).start()
    yield server
    server.stop()


def test_a_stream_on_any_worker_sees_every_worker(two_workers: Server) -> None:
    streams_see_every_worker(two_workers)


@pytest.mark.needs("POSTGRES")
def test_workers_over_one_postgresql_database(tmp_path: Path) -> None:
    from tests import _pg

    url = _pg.fresh_schema_url()
    server = Server(url, workers=2, log_path=tmp_path / "server.log").start()
    try:
        streams_see_every_worker(server)
    finally:
        server.stop()


def streams_see_every_worker(server: Server) -> None:
    from tests.test_service_log import Tail

    with server.client() as admin, server.client() as watcher:
        sid = admin.open_session("shared")
        tail = Tail(watcher, sid)
        assert tail.take(1)[0]["event"] == "session_opened"
        for i in range(20):  # a fresh connection each: the kernel spreads them over the workers
            with server.client() as one:
                one.inject(sid, {"role": "user", "content": f"w{i}"})
        got = tail.take(20)
        assert [e["payload"]["message"]["content"] for e in got] == [f"w{i}" for i in range(20)]
        assert admin.length(sid) == 20


def test_a_consumer_that_stops_reading_is_cut_off_with_its_cursor(
    two_workers: Server, tmp_path: Path
) -> None:
    server = two_workers
    with server.client() as admin:
        sid = admin.open_session("slow")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(stream_request(server, f"/v1/sessions/{sid}/events/stream"))
    time.sleep(1.0)  # the stream is registered and has replayed its first event
    # Write from this process: the workers follow the log, so they hear these commits too.
    with SessionStore.open(tmp_path / "store") as store:
        for _ in range(6):
            with store.transaction():
                for i in range(4_000):
                    store.inject(sid, {"role": "user", "content": f"bulk {i} " + "x" * 200})
    received = b""
    sock.settimeout(60)
    try:
        while b"\n\n" not in received.partition(b"event: overflow")[2]:
            chunk = sock.recv(1 << 20)
            assert chunk, "the server closed the stream without an overflow event"
            received += chunk
    finally:
        sock.close()
    text = received.decode()
    frames = [f for f in text.split("\n\n") if "event: " in f]
    overflow = json.loads(frames[-1].split("data: ", 1)[1].split("\n")[0])
    assert "event: overflow" in frames[-1]
    ids = [int(f.split("id: ", 1)[1].split("\n")[0]) for f in frames[:-1]]
    assert ids == list(range(1, len(ids) + 1))  # in order, none missing, none twice
    assert overflow["after"] == ids[-1] and len(ids) < 24_001  # cut off before the end
    with server.client() as admin:  # the cursor resumes exactly after the last delivered event
        rest = admin.events(sid, after=overflow["after"], limit=5)
        assert rest[0]["id"] == ids[-1] + 1
