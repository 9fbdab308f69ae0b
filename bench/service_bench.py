"""HTTP service benchmarks (`python -m bench --suite service`), against the in-process engine in the
same run. The server is `sessionlog serve` in a child process on loopback; clients are in this one.

- ``http_inject_1``: durable inject over HTTP from one client (sequential requests on one kept-alive
  connection), vs `store.inject` in process on a durable store, one commit per call.
- ``http_inject_64``: the same from 64 concurrent clients (asyncio), vs the same in-process single
  writer. The writer commits concurrent requests together; target: at least the in-process rate.
- ``stream_delivery``: 1,000 SSE streams on one session; the time from sending an inject to its
  frame arriving on every stream, p50 and p99 over all deliveries, vs the in-process subscription
  callback's delay after the commit. Shown as time per delivery; target p99 under 100 ms.
- ``stream_memory``: the server's resident memory per idle open stream (1,000 of them), vs per idle
  kept-alive HTTP connection (1,000 that made one request). Target under 64 KiB per stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench import _scaffold
from bench._timing import Result, Sample, Stopwatch, Target, compare
from sessions import SessionStore

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    injects: int  # sequential injects per round
    concurrent_injects: int  # injects per round, spread over 64 clients
    streams: int
    deliveries: int  # injects whose delivery to every stream is timed


FULL = Sizes(
    rounds=5, injects=300, concurrent_injects=2_000, streams=1_000, deliveries=20, budget_s=120
)
QUICK = Sizes(rounds=3, injects=50, concurrent_injects=256, streams=200, deliveries=5, budget_s=30)


Context = _scaffold.Context[Sizes]


class _Server:
    """`sessionlog serve` in a child process, an admin key, and its pid for memory readings."""

    def __init__(self, store: Path) -> None:
        self.key = secrets.token_urlsafe(32)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "SESSIONLOG_API_KEYS": f"bench={self.key}", "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-m", "sessionlog", "--store", str(store), "serve"]
        command += ["--port", str(self.port)]
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.headers = {"authorization": f"Bearer {self.key}"}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError("the server did not start")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def _message(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"message {i} " + "x" * 64}


def _in_process(store: SessionStore, sid: str, count: int) -> Sample:
    with Stopwatch() as watch:
        for i in range(count):
            store.inject(sid, _message(i))
    return watch.sample(count)


def http_inject(ctx: Context, clients: int) -> list[Result]:
    sizes = ctx.sizes
    name = f"http_inject_{clients}"
    server = _Server(ctx.tmp / name / "served")
    store = SessionStore.open(ctx.tmp / name / "local")
    try:
        store.open_session("local")
        with httpx.Client(base_url=server.url, headers=server.headers) as http:
            http.post("/v1/sessions", json={"id": "served"}).raise_for_status()
        count = sizes.injects if clients == 1 else sizes.concurrent_injects

        def over_http() -> Sample:
            with Stopwatch() as watch:
                asyncio.run(_inject_concurrently(server, "served", count, clients))
            return watch.sample(count)

        result = compare(
            name=name,
            description=f"durable inject over HTTP, {clients} client{'s' if clients > 1 else ''}",
            unit="injects/s",
            baseline=lambda: _in_process(store, "local", sizes.injects),
            subject=over_http,
            baseline_description="store.inject in process, durable, one commit per call",
            rounds=sizes.rounds,
            target=Target("ratio", 1.0) if clients > 1 else None,
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )
        result.notes = {"injects_per_round": count, "clients": clients}
        return [result]
    finally:
        server.close()
        store.close()
        shutil.rmtree(ctx.tmp / name, ignore_errors=True)


async def _inject_concurrently(server: _Server, sid: str, count: int, clients: int) -> None:
    """`count` injects from `clients` kept-alive connections, each sending its next request when
    the last is answered. A bare HTTP/1.1 client: the load generator must not be what is measured
    (a general-purpose async client costs more CPU per request than the server does)."""
    numbers = iter(range(count))
    head = (
        f"POST /v1/sessions/{sid}/messages HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"authorization: Bearer {server.key}\r\ncontent-type: application/json\r\n"
    ).encode()

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            for i in numbers:
                body = json.dumps({"message": _message(i)}).encode()
                writer.write(head + f"content-length: {len(body)}\r\n\r\n".encode() + body)
                answer = await reader.readuntil(b"\r\n\r\n")
                if not answer.startswith(b"HTTP/1.1 201"):
                    raise RuntimeError(f"inject failed: {answer[:200]!r}")
                await reader.readexactly(_content_length(answer))
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise RuntimeError("an answer without content-length")


async def _open_streams(
    server: _Server, path: str, count: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    opened = []
    request = (
        f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {server.key}\r\n"
        "accept: text/event-stream\r\n\r\n"
    ).encode()
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request)
        opened.append((reader, writer))
    for reader, _ in opened:
        await reader.readuntil(b"\r\n\r\n")  # the response head: the stream is registered
    return opened


async def _deliveries(server: _Server, sid: str, streams: int, injects: int) -> list[float]:
    """Seconds from sending each inject to its frame on each stream."""
    opened = await _open_streams(server, f"/v1/sessions/{sid}/events/stream", streams)
    delays: list[float] = []
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers) as http:
        # Let each stream replay what is already there before timing anything.
        head = (await http.get(f"/v1/sessions/{sid}/events", params={"limit": 1000})).json()["data"]
        for reader, _ in opened:
            for _ in range(len(head)):
                await reader.readuntil(b"\n\n")
        for i in range(injects):
            marker = f"probe-{i}".encode()
            sent = time.perf_counter()
            response = await http.post(
                f"/v1/sessions/{sid}/messages",
                json={"message": {"role": "user", "content": f"probe-{i}"}},
            )
            response.raise_for_status()

            waits = (_wait_for(reader, marker, sent) for reader, _ in opened)
            delays.extend(await asyncio.gather(*waits))
    for _, writer in opened:
        writer.close()
    return delays


async def _wait_for(reader: asyncio.StreamReader, marker: bytes, sent: float) -> float:
    while True:
        chunk = await reader.readuntil(b"\n\n")
        if marker in chunk:
            return time.perf_counter() - sent


def _in_process_delays(store: SessionStore, sid: str, count: int) -> list[float]:
    delays: list[float] = []
    sent = 0.0

    def heard(_: object) -> None:
        delays.append(time.perf_counter() - sent)

    with store.subscribe(sid, heard):
        for i in range(count):
            sent = time.perf_counter()
            store.inject(sid, _message(i))
    return delays


def stream_delivery(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    server = _Server(ctx.tmp / "delivery" / "served")
    store = SessionStore.open(ctx.tmp / "delivery" / "local")
    try:
        store.open_session("local")
        httpx.post(
            server.url + "/v1/sessions", json={"id": "watched"}, headers=server.headers
        ).raise_for_status()
        delays = asyncio.run(_deliveries(server, "watched", sizes.streams, sizes.deliveries))
        local = _in_process_delays(store, "local", sizes.deliveries * 10)
        rows = []
        for label, quantile in (("p50", 0.50), ("p99", 0.99)):
            ours = _quantile(delays, quantile)
            theirs = _quantile(local, quantile)
            rows.append(
                Result(
                    name=f"stream_delivery_{label}",
                    description=f"inject sent -> frame on each of {sizes.streams:,} SSE streams, {label}",
                    unit="deliveries/s",
                    ours=1 / ours,
                    baseline=1 / theirs,
                    baseline_description="in-process subscription callback after a durable inject",
                    target=Target("absolute", 1 / 0.100) if label == "p99" else None,
                    rounds=sizes.deliveries,
                    ours_rounds=[1 / ours],
                    baseline_rounds=[1 / theirs],
                    notes={"streams": sizes.streams, "deliveries": len(delays), "seconds": ours},
                    per="delivery",
                )
            )
        return rows
    finally:
        server.close()
        store.close()
        shutil.rmtree(ctx.tmp / "delivery", ignore_errors=True)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def stream_memory(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    server = _Server(ctx.tmp / "memory" / "served")
    try:
        httpx.post(
            server.url + "/v1/sessions", json={"id": "idle"}, headers=server.headers
        ).raise_for_status()
        per_stream, per_connection = asyncio.run(_memory(server, sizes.streams))
        result = Result(
            name="stream_memory",
            description=f"server memory per idle SSE stream ({sizes.streams:,} open)",
            unit="streams/MiB",
            ours=2**20 / per_stream,
            baseline=2**20 / per_connection,
            baseline_description="per idle kept-alive HTTP connection after one request",
            target=Target("absolute", 2**20 / (64 * 1024)),
            rounds=1,
            ours_rounds=[2**20 / per_stream],
            baseline_rounds=[2**20 / per_connection],
            notes={
                "bytes_per_stream": round(per_stream),
                "bytes_per_connection": round(per_connection),
            },
        )
        return [result]
    finally:
        server.close()
        shutil.rmtree(ctx.tmp / "memory", ignore_errors=True)


async def _memory(server: _Server, count: int) -> tuple[float, float]:
    # Warm the server up (first requests allocate caches) before any reading.
    await _settle()
    before = server.rss_bytes()
    idle = []
    request = b"GET /v1/health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request)
        idle.append((reader, writer))
    for reader, _ in idle:
        await reader.readuntil(b"\r\n\r\n")
    await _settle()
    per_connection = (server.rss_bytes() - before) / count
    for _, writer in idle:
        writer.close()
    await _settle()
    before = server.rss_bytes()
    streams = await _open_streams(server, "/v1/sessions/idle/events/stream", count)
    await _settle()
    per_stream = (server.rss_bytes() - before) / count
    for _, writer in streams:
        writer.close()
    return max(per_stream, 1.0), max(per_connection, 1.0)


async def _settle() -> None:
    await asyncio.sleep(1.0)


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "http_inject_1": lambda ctx: http_inject(ctx, 1),
    "http_inject_64": lambda ctx: http_inject(ctx, 64),
    "stream_delivery": stream_delivery,
    "stream_memory": stream_memory,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    return _scaffold.run(BENCHMARKS, ctx, names)


def summary(results: Sequence[Result]) -> str:
    lines = []
    for row in results:
        if row.name.startswith("stream_delivery"):
            ms, count = row.notes["seconds"] * 1000, row.notes["deliveries"]
            lines.append(f"{row.name}: {ms:.1f} ms over {count:,} deliveries")
        if row.name == "stream_memory":
            lines.append(
                f"stream_memory: {row.notes['bytes_per_stream'] / 1024:.1f} KiB per idle stream, "
                f"{row.notes['bytes_per_connection'] / 1024:.1f} KiB per idle connection"
            )
    return "\n".join(lines)
