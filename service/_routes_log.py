"""The log routes: event pages, live event streams (Server-Sent Events), bundles, seeding and
import, verify, health, and bearer sessions.

A stream first registers with the hub (so nothing committed from then on is missed), replays the
log after the client's cursor (frames marked `replayed`), then goes live, dropping what it already
sent. It ends with a final event when the server stops or the client reads too slowly; both carry
the cursor to resume from.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from importlib import metadata
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

import replay
from eventlog import Envelope, InvalidArgumentError, LimitExceededError, UnknownSessionError
from service import _limits
from service import _schemas as sc
from service._access import check_visible
from service._hub import control_frame, event_dict, frame
from service._problems import HTTPProblem, problem_of
from service._request import (
    Answer,
    Found,
    body_bytes,
    caller,
    read,
    read_json,
    respond,
    service,
    write,
)
from service._routes import _int_query, _visible
from sessions import SessionStore

SSE_HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}


# Event pages


async def session_events(request: Request) -> Response:
    store, _, sid = await _visible(request, "events")
    after = _int_query(request, "after_event_id", 0, 0, 2**62) or 0
    limit = _int_query(request, "limit", _limits.page_events_default, 1, _limits.page_events_max)
    assert limit is not None
    if await read(store.summary, sid) is None:
        raise UnknownSessionError(sid, "events")
    page = await read(_stream_page, store, sid, after, limit)
    return respond(_event_page(page, limit, store.log.head))


async def log_events(request: Request) -> Response:
    caller(request).require_all("the whole log")
    store = service(request).store
    after = _int_query(request, "after_event_id", 0, 0, 2**62) or 0
    limit = _int_query(request, "limit", _limits.page_events_default, 1, _limits.page_events_max)
    assert limit is not None
    page = await read(lambda: store.log.read(after=after, limit=limit))
    return respond(_event_page(page, limit, store.log.head))


def _event_page(page: list[Envelope], limit: int, head: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [event_dict(envelope, True) for envelope in page],
        "next_after": page[-1].position if len(page) == limit else None,
        "head": head,
    }


def _stream_page(store: SessionStore, sid: str, after: int, limit: int) -> list[Envelope]:
    """Up to `limit` events of session `sid` with positions after `after`."""
    version = version_after(store, sid, after)
    return store.log.read_stream(sid, after=version, limit=limit)


def version_after(store: SessionStore, sid: str, position: int) -> int:
    """The version of the last event of stream `sid` at or before log `position` (0 if none).

    Streams are indexed by version and positions grow with versions, so a binary search finds it
    in a few point reads, however long the stream: resuming near the end of a session of a
    million events reads about twenty events, not the million before the cursor."""
    with store.log.view() as view:
        low, high = 0, view.stream_version(sid)
        while low < high:  # invariant: versions <= low are at or before `position`
            middle = (low + high + 1) // 2
            (event,) = view.read_stream(sid, after=middle - 1, limit=1)
            if event.position <= position:
                low = middle
            else:
                high = middle - 1
        return low


# Live streams


async def session_stream(request: Request) -> Response:
    store, _, sid = await _visible(request, "subscribe")
    if await read(store.summary, sid) is None:
        raise UnknownSessionError(sid, "subscribe")
    return _sse(request, sid)


async def log_stream(request: Request) -> Response:
    caller(request).require_all("the whole log's stream")
    return _sse(request, None)


def _cursor(request: Request) -> int:
    text = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise InvalidArgumentError(
            f"the stream cursor (Last-Event-ID or ?after=) must be a log position, got {text!r}"
        )
    return int(text)


def _sse(request: Request, sid: str | None) -> Response:
    after = _cursor(request)
    return StreamingResponse(
        _frames(request, sid, after), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _frames(request: Request, sid: str | None, after: int) -> AsyncIterator[bytes]:
    svc = service(request)
    # Registered here, inside the generator, so that its `finally` always unregisters it.
    try:
        stream = svc.hub.open(sid)
    except LimitExceededError as exc:
        _, answer = problem_of(exc, request.url.path)
        yield control_frame("error", answer)
        return
    try:
        head = await read(lambda: svc.store.log.head)
        if after > head:
            yield control_frame("error", _beyond(request, after, head))
            return
        last = after
        async for position, data in _replay(svc.store, stream.session_id, after):
            last = position
            yield data
        while True:
            if stream.buffer:  # all that waits goes out as one chunk: one write, not one each
                fresh = [data for position, data in stream.buffer if position > last]
                last = max(last, stream.buffer[-1][0])
                stream.buffer.clear()
                if fresh:
                    yield b"".join(fresh)
            if stream.overflowed:
                yield control_frame("overflow", {"after": last, "reason": "slow consumer"}, last)
                return
            if svc.hub.draining:
                yield control_frame("shutdown", {"after": last}, last)
                return
            if stream.heartbeat_due:
                stream.heartbeat_due = False
                yield b": heartbeat\n\n"
            stream.wake.clear()
            await stream.wake.wait()
    finally:
        svc.hub.close(stream)


def _beyond(request: Request, after: int, head: int) -> dict[str, Any]:
    return {
        "type": "urn:sessionlog:problem:cursor-beyond-head",
        "title": "The cursor is beyond the head of the log",
        "status": 400,
        "detail": f"cursor {after} is beyond the log's head {head}",
        "instance": request.url.path,
        "code": "invalid_request",
        "head": head,
    }


async def _replay(
    store: SessionStore, sid: str | None, after: int
) -> AsyncIterator[tuple[int, bytes]]:
    """The events after `after` already in the log, a page at a time, each page read in a
    worker thread."""
    cursor = after
    version = 0 if sid is None else await read(version_after, store, sid, after)
    while True:
        page = await read(_replay_page, store, sid, cursor, version)
        if not page:
            return
        for envelope in page:
            if envelope.position > cursor:
                cursor = envelope.position
                yield envelope.position, frame(envelope, True)
        version = page[-1].version


def _replay_page(store: SessionStore, sid: str | None, after: int, version: int) -> list[Envelope]:
    if sid is None:
        return store.log.read(after=after, limit=_limits.page_events_max)
    return store.log.read_stream(sid, after=version, limit=_limits.page_events_max)


# Bundles, seeding, import


async def bundle(request: Request) -> Response:
    store, _, sid = await _visible(request, "export_bundle")
    mode = request.query_params.get("mode", "sanitized")
    return respond(await read(lambda: replay.export_bundle(store, sid, mode)))


async def import_bundle(request: Request) -> Response:
    caller(request).require_all("importing a bundle")
    store = service(request).store
    data, raw = await read_json(request, dict[str, Any], limit=_limits.upload_bytes_max)

    def act() -> Answer:
        return 201, {"session_id": replay.import_bundle(store, data)}

    return await write(
        request, act, again=lambda f: (201, {"session_id": f[0]}), raw=raw, solo=True
    )


_SEED_QUERY = {
    "id": "rename_session",
    "truncate_to_last": "truncate_to_last",
    "drop_tool_calls": "drop_tool_calls",
    "provider": "provider",
    "model": "model",
    "source_agent": "source_agent",
    "source_label": "source_label",
}


async def seed(request: Request) -> Response:
    caller(request).require_all("seeding a session")
    store = service(request).store
    options = _seed_options(request)
    raw = await body_bytes(request, _limits.upload_bytes_max)

    def act() -> Answer:
        with tempfile.TemporaryDirectory(prefix="sessionlog-seed-") as folder:
            path = os.path.join(folder, "llm_transcript.jsonl")
            with open(path, "wb") as out:
                out.write(raw)
            result = replay.seed_from_jsonl(store, path, **options)
            if not result.ok:  # the body is the file: name it as the caller knows it
                error = str(result.error).replace(path, "request body")
                raise HTTPProblem(422, "invalid-transcript", error)
        answer = {
            "ok": result.ok,
            "session_id": result.session_id,
            "messages_loaded": result.messages_loaded,
            "error": None,
        }
        return 201, answer

    def again(found: Found) -> Answer:
        return 201, {
            "ok": True,
            "session_id": found[0],
            "messages_loaded": store.length(found[0]),
            "error": None,
        }

    return await write(request, act, again=again, raw=raw, solo=True)


def _seed_options(request: Request) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for name, value in request.query_params.items():
        option = _SEED_QUERY.get(name)
        if option is None:
            raise InvalidArgumentError(
                f"sessions:seed: unknown query parameter `{name}` "
                f"(expected one of: {', '.join(sorted(_SEED_QUERY))})"
            )
        if option == "truncate_to_last":
            options[option] = _int_query(request, name, None, 0, 2**31)
        elif option == "drop_tool_calls":
            options[option] = _flag(name, value)
        else:
            options[option] = value
    return options


def _flag(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false", "1", "0"):
        raise InvalidArgumentError(f"query `{name}`: expected true or false, got {value!r}")
    return value.lower() in ("true", "1")


# Verify, health


async def verify(request: Request) -> Response:
    caller(request).require_admin("verify")
    store = service(request).store
    projections = _flag("projections", request.query_params.get("projections", "false"))
    if "text/event-stream" not in request.headers.get("accept", ""):
        report = await read(lambda: store.verify(projections=projections))
        return respond(report.as_json())
    return StreamingResponse(
        _verify_frames(store, projections), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _verify_frames(store: SessionStore, projections: bool) -> AsyncIterator[bytes]:
    """Progress events while the walk runs, then one `result` event."""
    loop = asyncio.get_running_loop()
    progress: asyncio.Queue[tuple[int, int]] = asyncio.Queue(maxsize=64)

    def report(done: int, head: int) -> None:
        def offer() -> None:
            if not progress.full():  # progress is advisory: a slow reader skips some
                progress.put_nowait((done, head))

        loop.call_soon_threadsafe(offer)

    task = asyncio.ensure_future(
        read(lambda: store.verify(projections=projections, progress=report))
    )
    while not task.done():
        try:
            done, head = await asyncio.wait_for(progress.get(), 1.0)
        except TimeoutError:
            continue
        yield control_frame("progress", {"done": done, "head": head})
    yield control_frame("result", task.result().as_json())


def _version() -> str:
    try:
        return metadata.version("sessionlog-engine")
    except metadata.PackageNotFoundError:
        return "unknown"


async def health(request: Request) -> Response:
    svc = service(request)
    head = await read(lambda: svc.store.log.head)
    return respond(
        {
            "ok": not svc.hub.draining,
            "head": head,
            "version": _version(),
            "streams_open": svc.hub.open_count,
        }
    )


# Bearer sessions


def _token(record: Any, token: str | None) -> dict[str, Any]:
    answer: dict[str, Any] = record.as_dict()
    answer.pop("last_seen_at", None)
    answer["token"] = token
    return answer


async def create_token(request: Request) -> Response:
    caller(request).require_admin("creating a bearer session")
    store = service(request).store
    body, raw = await read_json(request, sc.CreateToken)

    def act() -> Answer:
        record = store.tokens.create(body.principal, body.expires_at, attributes=body.attributes)
        return 201, _token(record, record.token)

    def again(found: Found) -> Answer:
        handle = found[0].rsplit("/", 1)[-1]  # the bearer stream is named by the handle
        # The token is shown once: a retry learns the handle, never the token again.
        return 200, {
            "handle": handle,
            "principal": body.principal,
            "created_at": None,
            "expires_at": body.expires_at,
            "attributes": body.attributes or {},
            "token": None,
        }

    return await write(request, act, again=again, raw=raw)


async def revoke_token(request: Request) -> Response:
    caller(request).require_admin("revoking a bearer session")
    store = service(request).store
    handle: str = request.path_params["handle"]

    def act() -> Answer:
        if not store.tokens.revoke(handle):
            raise HTTPProblem(404, "not-found", f"no live bearer session with handle `{handle}`")
        return 204, None

    return await write(request, act, again=lambda _: (204, None))


_S = "/v1/sessions/{session_id}"

ROUTES = [
    Route(_S + "/events", session_events, methods=["GET"]),
    Route(_S + "/events/stream", session_stream, methods=["GET"]),
    Route("/v1/events", log_events, methods=["GET"]),
    Route("/v1/events/stream", log_stream, methods=["GET"]),
    Route(_S + "/bundle", bundle, methods=["GET"]),
    Route("/v1/sessions:import", import_bundle, methods=["POST"]),
    Route("/v1/sessions:seed", seed, methods=["POST"]),
    Route("/v1/verify", verify, methods=["GET"]),
    Route("/v1/health", health, methods=["GET"]),
    Route("/v1/tokens", create_token, methods=["POST"]),
    Route("/v1/tokens/{handle}", revoke_token, methods=["DELETE"]),
]

__all__ = ["ROUTES", "check_visible"]
