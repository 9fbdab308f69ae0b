"""The session routes: create, list, read, rename, close, delete, fork, messages, trim, compact,
reset, scratchpad and live clients. Each handler checks who may see the session, then calls one
verb of the store (reads in a worker thread, writes through the store's group commit) and shapes the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from eventlog import InvalidArgumentError, UnknownSessionError
from eventlog.limits import check_at_most
from service import _limits
from service import _schemas as sc
from service._access import (
    OWNER_KEY,
    Caller,
    check_new_id,
    check_visible,
    may_see,
    owned_metadata,
)
from service._past import PastRebuilds
from service._request import Answer, Found, caller, read, read_json, respond, service, write
from sessions import SessionStore

_SCAN_PAGES_MAX = 20
"""Pages of the engine's session list one filtered list (`GET /v1/sessions`, or the viewer's) reads
before answering with what it found and a cursor: a rare filter never makes one request scan the
whole store."""


def session_resource(summary: dict[str, Any]) -> dict[str, Any]:
    """The engine's summary as the API shows a session (with the Agents Protocol's fields)."""
    out = {
        "id": summary["session_id"],
        "object": "session",
        "state": "ACTIVE" if summary.get("status") == "active" else "CLOSED",
        "updated_at": summary.get("last_activity_at"),
        **summary,
    }
    out.pop("transcript", None)
    return out


def _resource(store: SessionStore, session_id: str) -> dict[str, Any]:
    summary = store.summary(session_id)
    if summary is None:
        raise UnknownSessionError(session_id, "read")
    return session_resource(summary)


def _sid(request: Request) -> str:
    value: str = request.path_params["session_id"]
    return value


def _int_query(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    digits = text[1:] if text[:1] == "-" else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
        # (int() would also take "+5", "1_0", " 5" and digits of other scripts)
        raise InvalidArgumentError(f"query `{name}`: expected an integer, got {text!r}")
    value = int(text)
    if not low <= value <= high:
        raise InvalidArgumentError(f"query `{name}`: expected {low} to {high}, got {value}")
    return value


async def _visible(request: Request, verb: str) -> tuple[SessionStore, Caller, str]:
    store, who, sid = service(request).store, caller(request), _sid(request)
    if not who.all_sessions:
        await read(check_visible, store, who, sid, verb)
    return store, who, sid


# Sessions


async def list_sessions(request: Request) -> Response:
    store, who, scan = service(request).store, caller(request), SessionScan.of(request)
    query = request.query_params
    parent, key, value = query.get("parent"), query.get("metadata_key"), query.get("metadata_value")

    def row(item: dict[str, Any]) -> dict[str, Any] | None:
        return session_resource(item) if _wanted(store, who, item, parent, key, value) else None

    def page() -> dict[str, Any]:
        found, after = scan.run(store, row)
        return {"object": "list", "data": found, "next_cursor": after}

    return respond(await read(page))


@dataclass(frozen=True)
class SessionScan:
    """A filtered walk of the engine's session list, as a list request's query asks for it: up
    to `limit` sessions (of `status`, when given) after `cursor`."""

    limit: int
    status: str | None
    cursor: str | None

    @classmethod
    def of(cls, request: Request) -> SessionScan:
        limit = _int_query(request, "limit", 50, 1, 200)
        assert limit is not None
        query = request.query_params
        return cls(limit, query.get("status") or None, query.get("cursor") or None)

    def run(
        self, store: SessionStore, row: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The rows `row` makes of the sessions it keeps (it answers None for the others), and
        the cursor to go on from (None at the end). Reads at most `_SCAN_PAGES_MAX` pages."""
        found: list[dict[str, Any]] = []
        after = self.cursor
        for _ in range(_SCAN_PAGES_MAX):
            page = store.list_sessions(cursor=after, limit=self.limit, status=self.status)
            for item in page["sessions"]:
                after = item["session_id"]
                kept = row(item)
                if kept is not None:
                    found.append(kept)
                if len(found) == self.limit:
                    more = item is not page["sessions"][-1] or page["next_cursor"] is not None
                    return found, after if more else None
            if page["next_cursor"] is None:
                return found, None
        return found, after


def _wanted(
    store: SessionStore,
    who: Caller,
    item: dict[str, Any],
    parent: str | None,
    key: str | None,
    value: str | None,
) -> bool:
    if parent is not None and item.get("parent_id") != parent:
        return False
    if not who.all_sessions and not may_see(store, who, item["session_id"]):
        return False
    if key is None:
        return True
    summary = store.summary(item["session_id"]) or {}
    metadata = summary.get("metadata") or {}
    return key in metadata and (value is None or str(metadata[key]) == value)


async def create_session(request: Request) -> Response:
    body, raw = await read_json(request, sc.CreateSession)
    store, who = service(request).store, caller(request)
    options = {
        name: getattr(body, name)
        for name in body.__struct_fields__
        if name != "id" and getattr(body, name) is not None
    }
    options["metadata"] = owned_metadata(who, body.metadata)
    if options["metadata"] is None:
        del options["metadata"]

    def act() -> Answer:
        check_new_id(store, who, body.id, "open_session")
        sid = store.open_session(body.id, **options)
        return 201, _resource(store, sid)

    def again(found: Found) -> Answer:
        return 201, _resource(store, found[0])

    return await write(request, act, again=again, raw=raw)


async def get_session(request: Request) -> Response:
    store, _, sid = await _visible(request, "snapshot")
    as_of = _int_query(request, "as_of", None, 0, 2**62)
    past = service(request).past

    def snap() -> dict[str, Any]:
        source = store if as_of is None else past.rebuild(store, as_of, "snapshot: `as_of`")
        summary = source.summary(sid)
        if summary is None:
            raise UnknownSessionError(sid, "snapshot")
        check_at_most(
            summary["length"],
            _limits.snapshot_messages_max,
            "snapshot_messages_max",
            f"snapshot of `{sid}`: transcript length (read it by pages from .../messages)",
        )
        snapshot = source.snapshot(sid) or {}
        answer = session_resource(snapshot)
        answer["transcript"] = snapshot.get("transcript", [])
        return answer

    return respond(await read(snap))


async def patch_session(request: Request) -> Response:
    store, who, sid = await _visible(request, "rename")
    body, raw = await read_json(request, sc.PatchSession)
    changes = {} if isinstance(body.metadata, msgspec.UnsetType) else body.metadata
    if OWNER_KEY in changes and not who.admin:
        raise InvalidArgumentError(f"metadata: `{OWNER_KEY}` is set by the service, not the caller")
    sets = {key: value for key, value in changes.items() if value is not None}
    removed = [key for key, value in changes.items() if value is None]

    def change() -> None:  # both changes in one savepoint: all of it or nothing
        if not isinstance(body.title, msgspec.UnsetType):
            store.rename(sid, body.title)
        if changes:
            store.update_metadata(sid, sets, remove=removed)

    return await _change(request, sid, change, lambda: _resource(store, sid), raw)


async def _change(
    request: Request,
    sid: str,
    change: Callable[[], object],
    answer: Callable[[], Any],
    raw: bytes = b"",
) -> Response:
    """Run `change` on the writer and answer 200 with `answer()`; a retry with the same
    `Idempotency-Key` answers `answer()` and changes nothing. `change` writes to session `sid`."""

    def act() -> Answer:
        change()
        return 200, answer()

    return await write(request, act, again=lambda _: (200, answer()), raw=raw, session_id=sid)


async def close_session(request: Request) -> Response:
    store, _, sid = await _visible(request, "close_session")
    body, raw = await read_json(request, sc.CloseSession)
    status: Any = body.status if body.status is not None else body.reason

    return await _change(
        request, sid, lambda: store.close_session(sid, status), lambda: _resource(store, sid), raw
    )


async def delete_session(request: Request) -> Response:
    store, _, sid = await _visible(request, "delete")
    reason = request.query_params.get("reason")

    def act() -> Answer:
        store.delete(sid, reason=reason)
        return 204, None

    return await write(request, act, again=lambda _: (204, None), session_id=sid)


async def fork_session(request: Request) -> Response:
    store, who, sid = await _visible(request, "fork")
    body, raw = await read_json(request, sc.ForkSession)
    if body.keep_first is not None and body.at_event_id is not None:
        raise InvalidArgumentError("fork: give `keep_first` or `at_event_id`, not both")
    keep = body.keep_first
    if body.at_event_id is not None:
        keep = await read(_length_at, service(request).past, store, sid, body.at_event_id)

    def act() -> Answer:
        check_new_id(store, who, body.child_id, "fork")
        child = (
            store.fork(sid, body.child_id)
            if keep is None
            else store.fork_at(sid, keep, body.child_id)
        )
        return 201, _resource(store, child)

    return await write(request, act, again=lambda f: (201, _resource(store, f[0])), raw=raw)


def _length_at(pasts: PastRebuilds, store: SessionStore, session_id: str, position: int) -> int:
    """The transcript's length right after the log position `position`."""
    if isinstance(position, bool) or position < 1:
        raise InvalidArgumentError(
            f"fork: `at_event_id` must be a log position >= 1, got {position}"
        )
    past = pasts.rebuild(store, position, "fork: `at_event_id`")
    if past.summary(session_id) is None:
        raise InvalidArgumentError(
            f"fork: session `{session_id}` did not exist at event {position}"
        )
    return past.length(session_id)


async def ancestry(request: Request) -> Response:
    store, _, sid = await _visible(request, "ancestry")
    found = await read(store.ancestry, sid)
    if found is None:
        raise UnknownSessionError(sid, "ancestry")
    return respond({"session_id": sid, **found})


# Messages


async def list_messages(request: Request) -> Response:
    store, _, sid = await _visible(request, "messages")
    after = _int_query(request, "after", 0, 0, 2**62) or 0
    limit = _int_query(
        request, "limit", _limits.page_messages_default, 1, _limits.page_messages_max
    )

    def page() -> dict[str, Any]:
        data = store.messages(sid, after=after, limit=limit)
        length = store.length(sid)
        end = after + len(data)
        return {
            "object": "list",
            "data": data,
            "after": after,
            "next_after": end if end < length else None,
            "length": length,
        }

    return respond(await read(page))


async def inject(request: Request) -> Response:
    store, _, sid = await _visible(request, "inject")
    body, raw = await read_json(request, sc.InjectMessages)
    if (body.message is None) == (body.messages is None):
        raise InvalidArgumentError("inject: give exactly one of `message` or `messages`")
    if body.messages is not None:
        check_at_most(
            len(body.messages),
            _limits.messages_per_request_max,
            "messages_per_request_max",
            "inject: messages",
        )

    def act() -> Answer:
        with store.log.transaction(join=True) as tx:
            before = tx.head
            expected = body.expected_length
            if body.message is not None:
                store.inject(sid, body.message, expected_length=expected)
                count = 1
            else:
                assert body.messages is not None
                count = store.inject_many(sid, body.messages, expected_length=expected)
            after = tx.head
            length = store.length(sid)
        first, last = (before + 1, after) if after > before else (None, None)
        return 201, _injected(sid, count, length, first, last)

    def again(found: Found) -> Answer:
        with store.log.view() as view:
            events = view.events_at(range(found[1], found[2] + 1))
        count = sum(len(getattr(e.data, "messages", ())) or 1 for e in events)
        return 201, _injected(sid, count, store.length(sid), found[1], found[2])

    return await write(request, act, again=again, raw=raw, session_id=sid)


def _injected(sid: str, count: int, length: int, first: int | None, last: int | None) -> Any:
    return {
        "session_id": sid,
        "appended": count,
        "length": length,
        "first_event_id": first,
        "last_event_id": last,
    }


async def trim(request: Request) -> Response:
    store, _, sid = await _visible(request, "trim")
    body, raw = await read_json(request, sc.TrimSession)

    def act() -> Answer:
        return 200, {"session_id": sid, "kept": store.trim(sid, body.keep_last)}

    def again(found: Found) -> Answer:
        with store.log.view() as view:
            event = view.event_at(found[1])
        return 200, {"session_id": sid, "kept": getattr(event and event.data, "kept_count", 0)}

    return await write(request, act, again=again, raw=raw, session_id=sid)


async def compact(request: Request) -> Response:
    store, _, sid = await _visible(request, "compact")
    options, raw = await read_json(request, dict[str, Any])

    def act() -> Answer:
        return 200, {"session_id": sid, "kept": store.compact(sid, **options)}

    def again(_: Found) -> Answer:
        return 200, {"session_id": sid, "kept": store.length(sid)}

    return await write(request, act, again=again, raw=raw, session_id=sid)


async def reset(request: Request) -> Response:
    store, _, sid = await _visible(request, "reset")
    return await _change(request, sid, lambda: store.reset(sid), lambda: _resource(store, sid))


# Scratchpad


def _picked(store: SessionStore, sid: str, verb: str, **names: str) -> dict[str, Any]:
    """The session's id and the summary fields `names` maps to, under the API's names."""
    summary = store.summary(sid)
    if summary is None:
        raise UnknownSessionError(sid, verb)
    return {"session_id": sid, **{name: summary[field] for name, field in names.items()}}


async def _get(
    request: Request, verb: str, answer: Callable[[SessionStore, str], dict[str, Any]]
) -> Response:
    """A read of one visible session: `answer(store, sid)`, run in a worker thread."""
    store, _, sid = await _visible(request, verb)
    return respond(await read(answer, store, sid))


def _scratchpad(store: SessionStore, sid: str) -> dict[str, Any]:
    return _picked(store, sid, "scratchpad", scratchpad="scratchpad", version="scratchpad_version")


async def get_scratchpad(request: Request) -> Response:
    return await _get(request, "scratchpad", _scratchpad)


async def put_scratchpad(request: Request) -> Response:
    store, _, sid = await _visible(request, "set_scratchpad")
    body, raw = await read_json(request, sc.PutScratchpad)
    opts = {
        name: value
        for name in ("source", "reason", "metadata")
        if (value := getattr(body, name)) is not None
    }

    def change() -> None:
        if body.scratchpad is None:
            store.clear_scratchpad(sid, opts)
        else:
            store.set_scratchpad(sid, body.scratchpad, opts)

    return await _change(request, sid, change, lambda: _scratchpad(store, sid), raw)


# Live clients


def _clients(store: SessionStore, sid: str) -> dict[str, Any]:
    return _picked(
        store, sid, "live_clients", clients="live_clients", controller_id="live_controller_id"
    )


async def get_clients(request: Request) -> Response:
    return await _get(request, "live_clients", _clients)


async def client_action(request: Request) -> Response:
    action = request.url.path.rsplit("/", 1)[-1]
    store, _, sid = await _visible(request, action)
    client_id: str = request.path_params["client_id"]
    verb = {
        "attach": store.attach,
        "heartbeat": store.heartbeat,
        "detach": store.detach,
        "takeover": store.takeover,
    }[action]
    options, raw = await read_json(request, dict[str, Any])

    return await _change(
        request, sid, lambda: verb(sid, client_id, options), lambda: _clients(store, sid), raw
    )


async def client_prompt(request: Request) -> Response:
    store, _, sid = await _visible(request, "client_inject_prompt")
    client_id: str = request.path_params["client_id"]
    body, raw = await read_json(request, sc.ClientPrompt)

    def act() -> Answer:
        with store.log.transaction(join=True) as tx:
            before = tx.head
            store.client_inject_prompt(sid, client_id, body.content, body.options)
            after = tx.head
        return 201, _injected(sid, 1, store.length(sid), before + 1, after)

    def again(found: Found) -> Answer:
        return 201, _injected(sid, 1, store.length(sid), found[1], found[2])

    return await write(request, act, again=again, raw=raw, session_id=sid)


async def client_permission(request: Request) -> Response:
    store, _, sid = await _visible(request, "route_permission")
    client_id: str = request.path_params["client_id"]
    body, raw = await read_json(request, sc.ClientPermission)

    def act() -> Answer:
        routed = store.route_permission(sid, client_id, body.request, body.options)
        return 200, {"session_id": sid, **routed}

    return await write(
        request,
        act,
        again=lambda _: (200, {"session_id": sid, "ok": True}),
        raw=raw,
        session_id=sid,
    )


_S = "/v1/sessions/{session_id}"

ROUTES = [
    Route("/v1/sessions", list_sessions, methods=["GET"]),
    Route("/v1/sessions", create_session, methods=["POST"]),
    Route(_S, get_session, methods=["GET"]),
    Route(_S, patch_session, methods=["PATCH"]),
    Route(_S, delete_session, methods=["DELETE"]),
    Route(_S + "/close", close_session, methods=["POST"]),
    Route(_S + "/fork", fork_session, methods=["POST"]),
    Route(_S + "/ancestry", ancestry, methods=["GET"]),
    Route(_S + "/messages", list_messages, methods=["GET"]),
    Route(_S + "/messages", inject, methods=["POST"]),
    Route(_S + "/trim", trim, methods=["POST"]),
    Route(_S + "/compact", compact, methods=["POST"]),
    Route(_S + "/reset", reset, methods=["POST"]),
    Route(_S + "/scratchpad", get_scratchpad, methods=["GET"]),
    Route(_S + "/scratchpad", put_scratchpad, methods=["PUT"]),
    Route(_S + "/clients", get_clients, methods=["GET"]),
    Route(_S + "/clients/{client_id}/prompt", client_prompt, methods=["POST"]),
    Route(_S + "/clients/{client_id}/permission", client_permission, methods=["POST"]),
    *(
        Route(_S + "/clients/{client_id}/" + action, client_action, methods=["POST"])
        for action in ("attach", "heartbeat", "detach", "takeover")
    ),
]
