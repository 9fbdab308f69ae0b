"""The read endpoints the viewer needs beyond the session API: a searchable list with each
session's source and owner, a session's header without its transcript (now or as it was at one
of its versions), message pages of a past state, the pruned results of the context view, the
family tree (forks and sub-agent sessions), the diff of two branches, and the log's head.

Every handler checks who may see what exactly as the session routes do (an unseen session is
unknown); none of them writes. Past states are rebuilt under the service's one bound
(`service._past`): a request past it is refused at once (503), never queued behind the others.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from eventlog import ForgottenError, InvalidArgumentError, UnknownSessionError
from eventlog.limits import check_at_most
from service import _limits
from service._access import OWNER_KEY, Caller, check_visible, may_see, owner_of
from service._past import PastRebuilds
from service._request import caller, read, respond, service
from service._routes import SessionScan, _int_query, _visible
from sessions import SessionStore

T = TypeVar("T")

SOURCES = ("seeded", "imported", "runtime", "api")
"""Where a session came from: `seed_from_jsonl`, an imported agent log, the runtime (its metadata
names a provider), or anything else (made through the API or the library)."""

_TREE_NODES_MAX = 500
"""A family larger than this is cut (the answer says so): the picture would be unreadable."""
_TREE_VISITS_MAX = 4 * _TREE_NODES_MAX
"""Candidates the tree looks at before it is cut, shown or not: a session's metadata may name
any number of sub-agent sessions that do not exist or that the caller may not see, and each
costs reads; without this bound one request could hold a worker for minutes."""
_DIFF_MESSAGES_MAX = 200
_COMPARE_PAGE_MESSAGES = 1_000
_PRUNED_MAX = 2_000
_PAST_STORES_MAX = 2
"""Past states kept built, so moving the slider back and forth rebuilds nothing it saw last. Each
is the log up to its position held in memory (`SessionStore.as_of`): keep few."""
_RECENT_MAX = 16


PRIVATE = {"cache-control": "no-store"}
"""Every answer holds session data read with a credential: no browser or proxy may keep it (the
page's own fetches say so too, but a cache must not depend on the client asking)."""


def _private(data: Any) -> Response:
    return respond(data, headers=PRIVATE)


def source_of(summary: dict[str, Any]) -> str:
    metadata = summary.get("metadata") or {}
    if isinstance(metadata.get("agent_log"), dict):
        return "imported"
    if "seeded_from" in metadata:
        return "seeded"
    if isinstance(metadata.get("provider"), str):
        return "runtime"
    return "api"


# The list


async def list_sessions(request: Request) -> Response:
    store, who, scan = service(request).store, caller(request), SessionScan.of(request)
    query = request.query_params
    source = query.get("source") or None
    if source is not None and source not in SOURCES:
        raise InvalidArgumentError(f"query `source`: expected one of {', '.join(SOURCES)}")
    text = (query.get("q") or "").strip().lower()

    def page() -> dict[str, Any]:
        found, after = scan.run(store, lambda item: _row(store, who, item, text, source))
        return {"data": found, "next_cursor": after}

    return _private(await read(page))


def _row(
    store: SessionStore, who: Caller, item: dict[str, Any], text: str, source: str | None
) -> dict[str, Any] | None:
    sid = item["session_id"]
    if text and text not in sid.lower() and text not in (item.get("title") or "").lower():
        return None
    if not who.all_sessions and not may_see(store, who, sid):
        return None
    summary = store.summary(sid) or {}
    kind = source_of(summary)
    if source is not None and kind != source:
        return None
    return {**item, "source": kind, "principal": owner_of(store, sid)}


# One session


def _header(store: SessionStore, sid: str) -> dict[str, Any]:
    summary = store.summary(sid)
    if summary is None:
        raise UnknownSessionError(sid, "read")
    summary["source"] = source_of(summary)
    summary["principal"] = (summary.get("metadata") or {}).get(OWNER_KEY) or owner_of(store, sid)
    summary["events"] = store.log.stream_version(sid)
    return summary


async def get_session(request: Request) -> Response:
    store, _, sid = await _visible(request, "read")
    version = _int_query(request, "version", None, 1, 2**62)

    def header() -> dict[str, Any]:
        events = store.log.stream_version(sid)
        if version is None:
            answer = _header(store, sid)
            answer["as_of"] = None
        else:
            position = _position_of(store, sid, version, events)
            answer = _header(_past(request, store, position, "viewer: `version`"), sid)
            answer["as_of"] = position
            answer["as_of_version"] = version
        answer["events"] = events
        answer["head"] = store.log.head
        return answer

    return _private(await read(header))


def _position_of(store: SessionStore, sid: str, version: int, events: int) -> int:
    if version > events:
        raise InvalidArgumentError(
            f"query `version`: session `{sid}` has {events} events, got {version}"
        )
    page = store.log.read_stream(sid, after=version - 1, limit=1)
    return page[0].position


class _PastStores:
    """The few past states the viewer looked at last, by log position. A state not among them
    is rebuilt under the service's one bound (`Service.past`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stores: OrderedDict[int, SessionStore] = OrderedDict()

    def get(
        self, rebuilds: PastRebuilds, store: SessionStore, position: int, what: str
    ) -> SessionStore:
        with self.lock:
            hit = self.stores.get(position)
            if hit is not None:
                self.stores.move_to_end(position)
                return hit
        past = rebuilds.rebuild(store, position, what)
        with self.lock:
            self.stores[position] = past
            while len(self.stores) > _PAST_STORES_MAX:
                self.stores.popitem(last=False)
        return past


def _past(request: Request, store: SessionStore, position: int, what: str) -> SessionStore:
    """The store as of `position`, within the limit the service's own `as_of` keeps: a past
    state is rebuilt from the log up to there, in memory, no more than `past_rebuilds_max` at
    once across the API and the viewer (past that, a 503 `busy` problem)."""
    check_at_most(position, _limits.as_of_position_max, "as_of_position_max", what)
    pasts = _cache(request, "viewer_past", _PastStores)
    return pasts.get(service(request).past, store, position, what)


async def list_messages(request: Request) -> Response:
    """A page of messages, of now or (with `as_of`, a log position) of a past state."""
    store, _, sid = await _visible(request, "messages")
    after = _int_query(request, "after", 0, 0, 2**62) or 0
    limit = _int_query(
        request, "limit", _limits.page_messages_default, 1, _limits.page_messages_max
    )
    as_of = _int_query(request, "as_of", None, 0, 2**62)

    def page() -> dict[str, Any]:
        source = store if as_of is None else _past(request, store, as_of, "viewer: `as_of`")
        if source.summary(sid) is None:
            raise UnknownSessionError(sid, "messages")
        data = source.messages(sid, after=after, limit=limit)
        return {"data": data, "after": after, "length": source.length(sid), "as_of": as_of}

    return _private(await read(page))


async def pruned(request: Request) -> Response:
    """The messages the context view shows pruned (by transcript index) with what it shows. The
    answer is kept per transcript version: finding it reads the whole context view."""
    store, _, sid = await _visible(request, "context")
    cache = _cache(request, "viewer_pruned", _Recent)

    def find() -> dict[str, Any]:
        summary = store.summary(sid) or {}
        key = (sid, summary.get("version"), summary.get("length"))
        hit: dict[str, Any] | None = cache.get(key)
        if hit is None:
            hit = _pruned(store, sid)
            cache.put(key, hit)
        return hit

    return _private(await read(find))


def _pruned(store: SessionStore, sid: str) -> dict[str, Any]:
    for _ in range(3):  # the transcript may grow between the two reads: read again
        length = store.length(sid)
        try:
            shown = store.context(sid)
        except UnknownSessionError:  # a closed session has no context view
            return {"data": [], "start": length}
        start = length - len(shown)
        if start < 0:
            continue
        recorded = store.messages(sid, after=start, limit=len(shown))
        if len(recorded) != len(shown):
            continue
        data = [
            {"index": start + i, "shown": view.get("content")}
            for i, (view, kept) in enumerate(zip(shown, recorded, strict=True))
            if view != kept and not view.get("summary")
        ]
        return {"data": data[:_PRUNED_MAX], "start": start}
    return {"data": [], "start": None}


class _Recent:
    """A few recent answers by key."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any) -> Any:
        with self.lock:
            return self.items.get(key)

    def put(self, key: Any, value: Any) -> None:
        with self.lock:
            self.items[key] = value
            while len(self.items) > _RECENT_MAX:
                self.items.popitem(last=False)


_CACHES_LOCK = threading.Lock()
"""Held while a cache is looked up or made: handlers run on many threads, and two first requests
at once must not each make one (two bounds on rebuilds would allow twice as many)."""


def _cache(request: Request, name: str, make: Callable[[], T]) -> T:
    state = request.app.state
    with _CACHES_LOCK:
        found: T | None = getattr(state, name, None)
        if found is None:
            found = make()
            setattr(state, name, found)
    return found


# The family tree


def _up(store: SessionStore, sid: str) -> str | None:
    summary = store.summary(sid) or {}
    parent = summary.get("parent_id")
    if parent is None:
        ref = summary.get("parent_spawn_ref") or {}
        parent = ref.get("session_id") if isinstance(ref.get("session_id"), str) else None
    return parent


def _spawned(store: SessionStore, summary: dict[str, Any]) -> list[tuple[str, Any]]:
    """Sub-agent sessions started from this one: ``(session id, tool call id)`` each."""
    about = (summary.get("metadata") or {}).get("agent_log") or {}
    found: list[tuple[str, Any]] = [
        (child, None) for child in about.get("children") or () if isinstance(child, str)
    ]
    if isinstance((summary.get("metadata") or {}).get("provider"), str):
        from sessions.runtime._recorder import read_record

        with store.log.view() as view:  # with the store's keys, an encrypted child's call id
            record = read_record(view, summary["session_id"], store._sealer)
        for loop in record.loops if record is not None else ():
            found += [
                (ref["session_id"], ref.get("tool_call_id")) for ref in loop["child_loop_refs"]
            ]
    return found


def _node(summary: dict[str, Any], kind: str, parent: str | None, at: Any) -> dict[str, Any]:
    return {
        "id": summary["session_id"],
        "title": summary.get("title"),
        "status": summary.get("status"),
        "length": summary.get("length"),
        "created_at": summary.get("created_at"),
        "parent_id": parent,
        "kind": kind,
        "at": at,
    }


def _fork_point(store: SessionStore, summary: dict[str, Any]) -> int:
    """Where a fork leaves its parent's timeline: the index it was forked at, or for a fork of
    the whole transcript (which records none) how many first messages the two still share."""
    at = summary.get("branched_at_event_index")
    if at is not None:
        return int(at)
    parent, child = summary["parent_id"], summary["session_id"]
    if store.summary(parent) is None:
        return 0
    shortest = min(store.length(parent), summary.get("length") or 0)
    return _probe_prefix(store, parent, child, shortest)


def _probe_prefix(store: SessionStore, a: str, b: str, most: int) -> int:
    """How many first messages `a` and `b` share, by bisection on single messages: O(log n)
    reads, for the picture (a coincidence of equal messages past the fork can mislead it; the
    diff compares every message)."""
    low, high = 0, most
    while low < high:
        middle = (low + high + 1) // 2
        left = store.messages(a, after=middle - 1, limit=1)
        if left and left == store.messages(b, after=middle - 1, limit=1):
            low = middle
        else:
            high = middle - 1
    return low


def _seen_summary(store: SessionStore, who: Caller, sid: str) -> dict[str, Any] | None:
    """The summary of a session of the tree the caller may see; None for one they may not (or
    gone). A forgotten one is a node with nothing to show but its id and that it was forgotten:
    its key is destroyed, and the rest of the tree must still be drawn."""
    try:
        return store.summary(sid) if may_see(store, who, sid) else None
    except ForgottenError:
        return {"session_id": sid, "status": "forgotten"}


def family(store: SessionStore, who: Caller, sid: str) -> dict[str, Any]:
    root = sid
    for _ in range(64):
        parent = _up(store, root)
        if parent is None:
            break
        above = _seen_summary(store, who, parent)
        if above is None or above.get("status") == "forgotten":  # drawn from below it
            break
        root = parent
    nodes: list[dict[str, Any]] = []
    queue: deque[tuple[str, str, str | None, Any]] = deque([(root, "root", None, None)])
    seen: set[str] = set()
    visits = 0
    while queue and len(nodes) < _TREE_NODES_MAX and visits < _TREE_VISITS_MAX:
        node_id, kind, parent, at = queue.popleft()
        visits += 1
        if node_id in seen:
            continue
        summary = _seen_summary(store, who, node_id)
        if summary is None:
            continue
        seen.add(node_id)
        nodes.append(_node(summary, kind, parent, at))
        if kind == "fork" and summary.get("status") != "forgotten":
            nodes[-1]["at"] = _fork_point(store, summary)
            nodes[-1]["whole"] = summary.get("branched_at_event_index") is None
        queue += [(child, "fork", node_id, None) for child in summary.get("child_ids") or ()]
        queue += [(c, "subagent", node_id, call) for c, call in _spawned(store, summary)]
    return {"root_id": root, "nodes": nodes, "cut": bool(queue)}


async def tree(request: Request) -> Response:
    store, who, sid = await _visible(request, "ancestry")
    return _private(await read(family, store, who, sid))


# Two branches


def _common_prefix(store: SessionStore, a: str, b: str, hint: int) -> int:
    """How many first messages `a` and `b` share: `hint` (where the fork tree says they part)
    when the messages there agree, else found by comparing them page by page."""
    la, lb = store.length(a), store.length(b)
    hint = min(hint, la, lb)
    if hint > 0:
        left = store.messages(a, after=hint - 1, limit=2)
        right = store.messages(b, after=hint - 1, limit=2)
        if left[0] == right[0] and (len(left) < 2 or len(right) < 2 or left[1] != right[1]):
            return hint
    shared = 0
    while shared < min(la, lb):
        left = store.messages(a, after=shared, limit=_COMPARE_PAGE_MESSAGES)
        right = store.messages(b, after=shared, limit=_COMPARE_PAGE_MESSAGES)
        for x, y in zip(left, right, strict=False):
            if x != y:
                return shared
            shared += 1
        if len(left) < _COMPARE_PAGE_MESSAGES or len(right) < _COMPARE_PAGE_MESSAGES:
            break
    return shared


def _hint(store: SessionStore, a: str, b: str) -> int:
    """The fork point of `a` and `b` by their ancestry: the smallest branch index on the way
    from their nearest common ancestor down to either."""

    def chain(sid: str) -> list[tuple[str, int | None]]:
        out: list[tuple[str, int | None]] = []
        current: str | None = sid
        while current is not None and len(out) < 64:
            summary = store.summary(current) or {}
            out.append((current, summary.get("branched_at_event_index")))
            current = summary.get("parent_id")
        return out

    up_a, up_b = chain(a), chain(b)
    ids_b = [s for s, _ in up_b]
    for depth, (sid, _) in enumerate(up_a):
        if sid in ids_b:
            below = up_a[:depth] + up_b[: ids_b.index(sid)]
            marks = [at for _, at in below if at is not None]
            return min(marks) if marks else store.length(sid)
    return 0


def diff(store: SessionStore, a: str, b: str) -> dict[str, Any]:
    shared = _common_prefix(store, a, b, _hint(store, a, b))

    def side(sid: str) -> dict[str, Any]:
        return {
            "id": sid,
            "length": store.length(sid),
            "messages": store.messages(sid, after=shared, limit=_DIFF_MESSAGES_MAX),
        }

    return {"shared": shared, "a": side(a), "b": side(b), "limit": _DIFF_MESSAGES_MAX}


async def diff_route(request: Request) -> Response:
    store, who = service(request).store, caller(request)
    ids = [request.query_params.get(name) for name in ("a", "b")]
    for name, sid in zip(("a", "b"), ids, strict=True):
        if not sid:
            raise InvalidArgumentError(f"query `{name}`: a session id is needed")
        await read(check_visible, store, who, sid, "diff")
    a, b = ids
    assert a is not None and b is not None
    return _private(await read(diff, store, a, b))


# The log


async def status(request: Request) -> Response:
    store, who = service(request).store, caller(request)

    def head() -> dict[str, Any]:
        with store.log.view() as view:
            position = view.head
            page = view.read(after=position - 1, limit=1) if position else []
        return {
            "head": position,
            "head_hash": page[0].hash.hex() if page else None,
            "principal": who.principal,
            "admin": who.admin,
        }

    return _private(await read(head))


_S = "/v1/viewer/sessions/{session_id}"

ROUTES = [
    Route("/v1/viewer/status", status, methods=["GET"]),
    Route("/v1/viewer/sessions", list_sessions, methods=["GET"]),
    Route("/v1/viewer/diff", diff_route, methods=["GET"]),
    Route(_S, get_session, methods=["GET"]),
    Route(_S + "/messages", list_messages, methods=["GET"]),
    Route(_S + "/pruned", pruned, methods=["GET"]),
    Route(_S + "/tree", tree, methods=["GET"]),
]
