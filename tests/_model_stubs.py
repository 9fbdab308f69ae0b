"""Model API stub servers for the provider tests: a small HTTP/1.1 server on loopback, run on the
test's own event loop, that answers each request with the next scripted `Reply` and records what
it received.

Replies are written from the APIs' published shapes: Chat Completions (whole JSON, or server-sent
`data:` chunks ending in `[DONE]`) and Anthropic Messages (whole JSON, or named events from
`message_start` to `message_stop`). A reply can also be an error status with `Retry-After`, a
slow or silent answer (timeouts, cancellation), or a stream that drops its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    """Sent as JSON (a str is sent as it is)."""
    events: list[tuple[str | None, Any]] | None = None
    """A server-sent event stream: (event name or None, data as JSON or a str)."""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Silence before the status line."""
    event_delay_s: float = 0.0
    """Silence before each event after the first."""
    drop_after: int | None = None
    """Close the connection after this many events, without ending the stream."""
    hang: bool = False
    """Never answer: wait for the client to go away."""
    raw: list[bytes | float] | None = None
    """An event-stream body written as these exact bytes (a float is a pause in seconds), then
    the connection closes: comments only, an event cut in half."""


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


class StubServer:
    """`replies` are answered in order; when empty, `default(request)` answers (or a 500)."""

    def __init__(self, default: Callable[[Request], Reply] | None = None) -> None:
        self.replies: deque[Reply] = deque()
        self.default = default
        self.requests: list[Request] = []
        self.disconnects = 0
        self.disconnected = asyncio.Event()
        self.streaming = asyncio.Event()
        """Set once the first event of a stream has been written."""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> StubServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                self.requests.append(request)
                reply = self.replies.popleft() if self.replies else self._fallback(request)
                keep = await self._answer(reply, reader, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _fallback(self, request: Request) -> Reply:
        if self.default is not None:
            return self.default(request)
        return Reply(status=500, body={"error": {"message": "no reply scripted"}})

    async def _gone(self, reader: asyncio.StreamReader, seconds: float | None) -> bool:
        """Wait `seconds` (forever if None); True if the client closed the connection."""
        try:
            data = await asyncio.wait_for(reader.read(1), seconds)
        except TimeoutError:
            return False
        if data:
            return False
        self.disconnects += 1
        self.disconnected.set()
        return True

    async def _answer(
        self, reply: Reply, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if reply.hang:
            await self._gone(reader, None)
            return False
        if reply.delay_s and await self._gone(reader, reply.delay_s):
            return False
        reason = {200: "OK", 400: "Bad Request", 429: "Too Many Requests"}.get(reply.status, "X")
        head = [f"HTTP/1.1 {reply.status} {reason}"]
        head += [f"{name}: {value}" for name, value in reply.headers.items()]
        if reply.events is None and reply.raw is None:
            body = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
            data = body.encode()
            head += ["content-type: application/json", f"content-length: {len(data)}"]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
            await writer.drain()
            return True
        head += ["content-type: text/event-stream", "connection: close"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        for piece in reply.raw or ():
            if isinstance(piece, bytes):
                writer.write(piece)
                await writer.drain()
            elif await self._gone(reader, piece):
                return False
        for index, (name, payload) in enumerate(reply.events or ()):
            if reply.drop_after is not None and index >= reply.drop_after:
                return False
            if index and reply.event_delay_s and await self._gone(reader, reply.event_delay_s):
                return False
            text = payload if isinstance(payload, str) else json.dumps(payload)
            line = (f"event: {name}\n" if name else "") + f"data: {text}\n\n"
            writer.write(line.encode())
            await writer.drain()
            self.streaming.set()
        return False


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    size = int(headers.get("content-length", "0"))
    raw = await reader.readexactly(size) if size else b""
    return Request(method=method, path=path, headers=headers, raw=raw)


# Chat Completions shapes


def openai_whole(
    text: str = "",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str = "stop",
    usage: tuple[int, int] = (11, 7),
    model: str = "gpt-stub",
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
            }
            for call in tool_calls
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        },
    }


def openai_stream(
    pieces: list[str],
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str = "stop",
    usage: tuple[int, int] = (11, 7),
    model: str = "gpt-stub",
) -> list[tuple[str | None, Any]]:
    """Text in `pieces`, then each tool call's arguments split in two fragments, the fragments
    of different calls interleaved, then the finish chunk, a usage chunk and `[DONE]`."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> tuple[None, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return None, {"id": "c1", "object": "chat.completion.chunk", "model": model,
                      "choices": [choice]}  # fmt: skip

    events: list[tuple[str | None, Any]] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in pieces]
    calls = tool_calls or []
    for index, call in enumerate(calls):
        head = {"index": index, "id": call["id"], "type": "function",
                "function": {"name": call["name"], "arguments": ""}}  # fmt: skip
        events.append(chunk({"tool_calls": [head]}))
    for half in (0, 1):
        for index, call in enumerate(calls):
            text = json.dumps(call["arguments"])
            part = text[: len(text) // 2] if half == 0 else text[len(text) // 2 :]
            events.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
            )
    events.append(chunk({}, finish))
    events.append(
        (
            None,
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [],
                "usage": {
                    "prompt_tokens": usage[0],
                    "completion_tokens": usage[1],
                    "total_tokens": sum(usage),
                },
            },
        )
    )
    events.append((None, "[DONE]"))
    return events


# Anthropic Messages shapes


def anthropic_whole(
    text: str = "",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    stop: str = "end_turn",
    usage: tuple[int, int] = (13, 5),
    model: str = "claude-stub",
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [
        {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["arguments"]}
        for c in tool_calls or []
    ]
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def anthropic_stream(
    pieces: list[str],
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    stop: str = "end_turn",
    usage: tuple[int, int] = (13, 5),
    model: str = "claude-stub",
) -> list[tuple[str | None, Any]]:
    def event(name: str, **data: Any) -> tuple[str, Any]:
        return name, {"type": name, **data}

    start = {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
             "content": [], "usage": {"input_tokens": usage[0], "output_tokens": 1}}  # fmt: skip
    events = [event("message_start", message=start), ("ping", {"type": "ping"})]
    index = 0
    if pieces:
        events.append(
            event("content_block_start", index=0, content_block={"type": "text", "text": ""})
        )
        for piece in pieces:
            delta = {"type": "text_delta", "text": piece}
            events.append(event("content_block_delta", index=0, delta=delta))
        events.append(event("content_block_stop", index=0))
        index = 1
    for call in tool_calls or []:
        block = {"type": "tool_use", "id": call["id"], "name": call["name"], "input": {}}
        events.append(event("content_block_start", index=index, content_block=block))
        text = json.dumps(call["arguments"])
        for part in (text[: len(text) // 2], text[len(text) // 2 :]):
            delta = {"type": "input_json_delta", "partial_json": part}
            events.append(event("content_block_delta", index=index, delta=delta))
        events.append(event("content_block_stop", index=index))
        index += 1
    events.append(
        event(
            "message_delta",
            delta={"stop_reason": stop, "stop_sequence": None},
            usage={"output_tokens": usage[1]},
        )
    )
    events.append(event("message_stop"))
    return events
