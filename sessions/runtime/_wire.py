"""What both HTTP providers share on the wire: server-sent events, JSON bodies, the tool calls
and attached files of transcript messages in one canonical form.

A tool call in the transcript is ``{"id", "name", "arguments": {...}}`` as the runtime records
it; calls in the OpenAI shape (``{"id", "function": {"name", "arguments": "<json>"}}``) or the
Anthropic one (``{"id", "name", "input"}``), as seeded transcripts may hold, are read too.
Nothing here touches storage or the network.
"""

from __future__ import annotations

import base64
import itertools
import json
import mimetypes
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventlog import LimitExceededError
from sessions.runtime import _limits
from sessions.runtime._http import ProviderHTTPError

if TYPE_CHECKING:
    import httpx

FILE_BYTES_MAX = 32 * 1024 * 1024
"""One attached file read for a model call; the APIs refuse far smaller ones."""


_LINE_END = re.compile(rb"\r\n|\r|\n")


async def sse_lines(resp: httpx.Response, where: str) -> AsyncIterator[bytes]:
    """The lines of a response's body, each without its end (CRLF, CR or LF, as the SSE spec
    allows). A line longer than `sse_line_bytes_max` raises `LimitExceededError` as soon as
    that much of it has come: the rest is never read, and memory never holds more of it."""
    limit = _limits.sse_line_bytes_max
    held = bytearray()
    scanned = 0  # held[:scanned] holds no line end
    async for chunk in resp.aiter_bytes():
        held += chunk
        ends = [(m.start(), m.end()) for m in _LINE_END.finditer(held, scanned)]
        start = 0
        for first, after in ends:
            if after == len(held) and held[first:after] == b"\r":
                break  # a CR at the end of a chunk may be half of a CRLF: wait for more
            yield bytes(held[start:first])
            start = after
        del held[:start]
        scanned = len(held) - 1 if held.endswith(b"\r") else len(held)
        if len(held) > limit:
            raise LimitExceededError(
                f"{where}: a line of the event stream", "sse_line_bytes_max", limit, len(held)
            )
    if held:
        yield bytes(held.removesuffix(b"\r"))


async def sse_events(resp: httpx.Response, where: str) -> AsyncIterator[tuple[str | None, str]]:
    """Server-sent events of a response as ``(event name or None, data)``; multi-line data is
    joined with newlines, comments and other fields skipped. An event the body ends in before
    its blank line is discarded, as the SSE spec says: the stream was cut, and the caller's
    check for its last event reports the drop (a retry), not half an event as bad JSON. A line,
    or one event's data, past `sse_line_bytes_max` raises `LimitExceededError`."""
    limit = _limits.sse_line_bytes_max
    name: str | None = None
    data: list[bytes] = []
    size = 0
    async for line in sse_lines(resp, where):
        if not line:
            if data:
                yield name, b"\n".join(data).decode("utf-8", "replace")
            name, data, size = None, [], 0
            continue
        if line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        value = value.removeprefix(b" ")
        if field == b"event":
            name = value.decode("utf-8", "replace")
        elif field == b"data":
            data.append(value)
            size += len(value) + 1
            if size > limit:
                raise LimitExceededError(
                    f"{where}: the data of one event of the stream",
                    "sse_line_bytes_max",
                    limit,
                    size,
                )


def is_event_stream(resp: httpx.Response) -> bool:
    """Whether a response is a server-sent event stream by its content type. A server that
    ignores `stream` (some gateways) or sends an error object with 200 answers JSON instead;
    a response without a content type is taken at its word of being the stream asked for."""
    kind = resp.headers.get("content-type", "")
    media = kind.partition(";")[0].strip().lower()
    return not media or media == "text/event-stream"


def json_object(text: str, where: str) -> dict[str, Any]:
    """A JSON object from the API, or `ProviderHTTPError` saying what came instead."""
    try:
        value = json.loads(text)
    except ValueError:
        raise ProviderHTTPError(
            f"{where}: the API sent something that is not JSON: {text[:200]!r}"
        ) from None
    if not isinstance(value, dict):
        raise ProviderHTTPError(f"{where}: the API sent JSON that is not an object: {text[:200]!r}")
    return value


def arguments_of(raw: object, where: str) -> dict[str, Any]:
    """Tool-call arguments as a dict: a JSON text is parsed, empty means no arguments."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            raise ProviderHTTPError(
                f"{where}: tool-call arguments are not JSON: {raw[:200]!r}"
            ) from None
        if isinstance(value, dict):
            return value
    raise ProviderHTTPError(f"{where}: tool-call arguments are not a JSON object: {raw!r:.200}")


def call_parts(call: object, where: str) -> tuple[str, str, dict[str, Any]]:
    """(id, name, arguments) of a transcript tool call in any of the shapes read."""
    if not isinstance(call, Mapping):
        raise ProviderHTTPError(f"{where}: a tool call is not an object: {call!r:.120}")
    function = call.get("function")
    name = call.get("name")
    raw: object = call.get("arguments", call.get("input"))
    if isinstance(function, Mapping):
        name = name or function.get("name")
        raw = function.get("arguments") if raw is None else raw
    call_id = call.get("id")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise ProviderHTTPError(f"{where}: a tool call needs a str `id` and `name`: {call!r:.120}")
    return call_id, name, arguments_of(raw, where)


def finished_calls(
    calls: Iterable[object], truncated: bool, where: str, keep: str | None = None
) -> list[dict[str, Any]]:
    """Tool calls in the transcript's form. When the model ran out of tokens (`truncated`), a
    call whose arguments are not a whole JSON object was cut off and is dropped, never run: the
    reply is kept with its stop reason. Otherwise such a call is `ProviderHTTPError`. A call's
    field named `keep`, when it is a JSON object, stays on it (for the provider to take off).

    Ids are made unique within the reply: a call repeated word for word under one id is taken
    once, and another call under an id already used gets the id with ``#2``, ``#3``... after it.
    Each call's result answers its id, and an API refuses a turn whose calls share one."""
    out: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    for call in calls:
        try:
            call_id, name, arguments = call_parts(call, where)
        except ProviderHTTPError:
            if truncated:
                continue
            raise
        found: dict[str, Any] = {"id": call_id, "name": name, "arguments": arguments}
        if keep is not None and isinstance(call, Mapping) and isinstance(call.get(keep), Mapping):
            found[keep] = dict(call[keep])
        if call_id in seen:
            if seen[call_id] == found:
                continue
            found["id"] = next(
                f"{call_id}#{n}" for n in itertools.count(2) if f"{call_id}#{n}" not in seen
            )
        seen[found["id"]] = found
        out.append(found)
    return out


def text_of(content: object) -> str:
    """String content, or the text blocks of block content joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            block["text"]
            for block in content
            if isinstance(block, Mapping) and isinstance(block.get("text"), str)
        )
    return str(content)


def read_file(ref: Mapping[str, Any], where: str) -> tuple[str, str, bytes]:
    """(name, media type, bytes) of an attached file, read when the model is called."""
    path = Path(str(ref.get("path", "")))
    name = ref.get("name") or path.name
    mime = ref.get("mime_type") or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    try:
        size = path.stat().st_size
        if size > FILE_BYTES_MAX:
            raise ProviderHTTPError(
                f"{where}: attached file {name!r} is {size} bytes, over {FILE_BYTES_MAX}"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise ProviderHTTPError(
            f"{where}: cannot read attached file {name!r}: {exc.strerror}"
        ) from None
    return str(name), str(mime), data


def is_text(mime: str) -> bool:
    return mime.startswith("text/") or mime in ("application/json", "application/xml")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def usage_counts(**counts: object) -> dict[str, int]:
    """The counts that are ints >= 0 (what an API left out is left out)."""
    return {
        name: value
        for name, value in counts.items()
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0
    }
