"""A Google ADK `BaseSessionService` on sessionlog: `SessionlogSessionService(store)`.

Give it to ADK's `Runner(session_service=...)`. Each ADK session is one sessionlog session; each
event is stored verbatim as one item (its content objects as plain data, bytes as bytes) and
comes back equal, but for its state delta: state values take the JSON-safe form ADK's SQL
services give them (a datetime as ISO text, a set or tuple as a list), in the event and in the
state alike. A session's state lives in its scratchpad; `app:` state in one holder session per
app and `user:` state in one per app and user, so they are shared as ADK shares them; `temp:`
state is never stored. An event and every state change it carries commit together; an event
re-delivered after its append committed (a retry) is not stored twice (where a commit's outcome
can be unknown, on PostgreSQL, the event's id is also its idempotency key), and a different event
under a stored event's id is refused with ADK's `AlreadyExistsError`. A writer holding a
superseded copy of the session is refused with ADK's `StaleSessionError`; appends through one
copy are taken in turn. `fork_session` branches a session in O(1) in its history (cut at an
event, its state is replayed from the events it keeps when later ones changed it). Needs
``pip install 'sessionlog-engine[adk]'``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import projections as pj
from eventlog import TruncatedError
from eventlog import events as ev
from integrations._adk_keys import (
    NAMES,
    app_key,
    check_name,
    list_prefixes,
    names_of,
    names_pad,
    session_key,
    user_key,
)
from integrations._adk_state import CREATED, branch_state, fitting, lasting
from integrations._common import async_store, require
from sessions import InvalidArgumentError, SessionStore, UnknownSessionError
from sessions._collector import collector_paused
from sessions._messages import check_item, item_copier

require("google.adk", "adk")

from google.adk.errors import StaleSessionError  # noqa: E402
from google.adk.errors.already_exists_error import AlreadyExistsError  # noqa: E402
from google.adk.errors.session_not_found_error import SessionNotFoundError  # noqa: E402
from google.adk.events import Event  # noqa: E402
from google.adk.platform import uuid as platform_uuid  # noqa: E402
from google.adk.sessions import (  # noqa: E402
    BaseSessionService,
    Session,
    _session_util,
)
from google.adk.sessions.base_session_service import (  # noqa: E402
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.state import State  # noqa: E402

if TYPE_CHECKING:
    from sessions.aio import AsyncSessionStore

_PAGE = 64  # entries read per step when looking back for a timestamp


class _SessionLock:
    """One session's append lock and how many appends hold or await it: the lock is dropped with
    the last of them, so a service serving many sessions keeps none it does not need."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class SessionlogSessionService(BaseSessionService):
    """ADK's session service on a sessionlog store (a `SessionStore`, its asyncio face, or a
    path). Blocking work runs on the store's worker thread, never on the event loop."""

    def __init__(self, store: SessionStore | AsyncSessionStore | str | os.PathLike[str]) -> None:
        self.store = async_store(store)
        self._locks: dict[tuple[str, str, str], _SessionLock] = {}

    # Sessions

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        where = "create_session"
        check_name(app_name, "app_name", where)
        check_name(user_id, "user_id", where)
        if session_id is not None:
            check_name(session_id, "session_id", where)
        if state is not None and not isinstance(state, Mapping):
            raise InvalidArgumentError(
                f"{where}: `state` must be a dict, got {type(state).__name__}", where=where
            )
        sid = (session_id or "").strip() or platform_uuid.new_uuid()
        stored = lasting(state or {}, where)  # refused here, before anything is written
        return await self.store.run_write(self._create, app_name, user_id, sid, stored)

    def _create(self, app_name: str, user_id: str, sid: str, state: dict[str, Any]) -> Session:
        store = self.store.store
        key = session_key(app_name, user_id, sid)
        deltas = _session_util.extract_state_delta(state)
        with store.transaction():
            if store.exists(key):
                raise AlreadyExistsError(f"Session with id {sid} already exists.")
            store.open_session(key, title=sid, metadata={"app": app_name, "user": user_id})
            _merge_into(store, app_key(app_name), deltas["app"])
            _merge_into(store, user_key(app_name, user_id), deltas["user"])
            own = deltas["session"]
            pad = names_pad(key, app_name, user_id, sid)
            if own:  # kept twice: as the state, and as where a branch's replay starts
                pad.update({"state": own, CREATED: own})
            if pad:
                store.set_scratchpad(key, fitting(pad))
            return self._load(store, app_name, user_id, sid, None)  # type: ignore[return-value]

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        check_name(app_name, "app_name", "get_session")
        check_name(user_id, "user_id", "get_session")
        given: object = session_id  # typed as a str, yet ADK's own services take None
        if given is None:  # and answer it so
            return None
        sid = check_name(given, "session_id", "get_session").strip()
        return await self.store.run(self._get, app_name, user_id, sid, config)

    def _get(
        self, app_name: str, user_id: str, sid: str, config: GetSessionConfig | None
    ) -> Session | None:
        return self._load(self.store.store, app_name, user_id, sid, config)

    def _load(
        self,
        store: SessionStore,
        app_name: str,
        user_id: str,
        sid: str,
        config: GetSessionConfig | None,
    ) -> Session | None:
        key = session_key(app_name, user_id, sid)
        summary = store.summary(key)
        if summary is None or summary["status"] != pj.ACTIVE:
            return None
        with collector_paused():  # thousands of events hold no cycle
            events = _events(store, key, summary["length"], config)
        pad = summary["scratchpad"] or {}
        session = Session(
            id=sid,
            app_name=app_name,
            user_id=user_id,
            state=_merged(store, app_name, user_id, pad.get("state", {})),
            events=events,
            last_update_time=_update_time(store, key, pad),
        )
        session._storage_update_marker = str(summary["version"])
        return session

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """Every session of the app (of `user_id`, when given), oldest update first, without
        events: read from the projection in one pass, never touching a transcript."""
        check_name(app_name, "app_name", "list_sessions")
        if user_id is not None:
            check_name(user_id, "user_id", "list_sessions")
        return await self.store.run(self._list, app_name, user_id)

    def _list(self, app_name: str, user_id: str | None) -> ListSessionsResponse:
        store = self.store.store
        rows: list[tuple[float, str, str, dict[str, Any]]] = []
        with collector_paused():  # thousands of sessions are built: none holds a cycle
            with store.log.view() as view:
                app_state = _scratch_state(store, app_key(app_name))
                shared: dict[str, dict[str, Any]] = {}  # per user: its app: and user: keys
                for prefix in list_prefixes(app_name, user_id):
                    transcripts = dict(pj.iter_transcripts(view, prefix=prefix))
                    for entry in pj.iter_scratchpads(view, prefix=prefix):
                        pad = entry.scratchpad or {}
                        names = names_of(entry.session_id, pad)
                        if entry.status != pj.ACTIVE or names is None or names[0] != app_name:
                            continue  # (a digest's names are compared: no collision is listed)
                        _, user, sid = names
                        if user_id is not None and user != user_id:
                            continue
                        common = shared.get(user)
                        if common is None:
                            user_state = _scratch_state(store, user_key(app_name, user))
                            common = shared[user] = _prefixed(app_state, user_state, {})
                        state = pad.get("state", {})  # decoded for this call alone: handed out
                        state.update(common)
                        updated = _updated(transcripts.get(entry.session_id), pad)
                        rows.append((updated, user, sid, state))
            rows.sort(key=_first_three)
            found = [
                _listed(
                    {
                        "id": sid,
                        "app_name": app_name,
                        "user_id": user,
                        "state": state,
                        "events": [],
                        "last_update_time": updated,
                    }
                )
                for updated, user, sid, state in rows
            ]
        return ListSessionsResponse.model_construct(sessions=found)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        check_name(app_name, "app_name", "delete_session")
        check_name(user_id, "user_id", "delete_session")
        given: object = session_id  # typed as a str, yet ADK's get_session takes None
        if given is None:  # no session has None for its id: nothing to delete
            return
        sid = check_name(given, "session_id", "delete_session").strip()
        try:
            await self.store.delete(session_key(app_name, user_id, sid))
        except UnknownSessionError:
            return

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        check_name(app_name, "app_name", "get_user_state")
        check_name(user_id, "user_id", "get_user_state")
        return await self.store.run(_scratch_state, self.store.store, user_key(app_name, user_id))

    async def fork_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        new_session_id: str | None = None,
        at_event: int | None = None,
        config: GetSessionConfig | None = None,
    ) -> Session:
        """A new session of the same user holding this one's events (its first `at_event`),
        shared, not copied: O(1) in the history's length. Its state is the parent's as of the
        last event it keeps (see `branch_state`: a cut reads the events after it, and the kept
        ones only when those changed the session's state); later events of either never reach
        the other. The session returned holds the events `config` asks for, as `get_session`
        gives them (all of them without one;
        ``GetSessionConfig(num_recent_events=0)`` reads none, keeping the fork O(1) end to end)."""
        where = "fork_session"
        check_name(app_name, "app_name", where)
        check_name(user_id, "user_id", where)
        check_name(session_id, "session_id", where)
        if new_session_id is not None:
            check_name(new_session_id, "new_session_id", where)
        child = (new_session_id or "").strip() or platform_uuid.new_uuid()
        return await self.store.run_write(
            self._fork, app_name, user_id, session_id, child, at_event, config
        )

    def _fork(
        self,
        app_name: str,
        user_id: str,
        sid: str,
        child: str,
        at_event: int | None,
        config: GetSessionConfig | None,
    ) -> Session:
        store = self.store.store
        source, target = session_key(app_name, user_id, sid), session_key(app_name, user_id, child)
        with store.transaction():
            summary = store.summary(source)
            if summary is None or summary["status"] != pj.ACTIVE:
                raise SessionNotFoundError(f"Session {sid} not found.")
            if store.exists(target):
                raise AlreadyExistsError(f"Session with id {child} already exists.")
            parent_pad = summary["scratchpad"] or {}
            pad = {k: v for k, v in parent_pad.items() if k != NAMES}  # the parent's names
            if at_event is None:
                store.fork(source, target)
            else:
                store.fork_at(source, at_event, target)
                length = summary["length"]
                pad["state"] = branch_state(store, source, min(at_event, length), length, pad)
            store.rename(target, child)
            names = names_pad(target, app_name, user_id, child)
            if at_event is not None or names or NAMES in parent_pad:
                store.set_scratchpad(target, fitting({**pad, **names}))
        # Read once committed: a fork's events are its parent's, which this process may hold
        # decoded already (a transaction's own reads are never kept).
        forked = self._load(store, app_name, user_id, child, config)
        if forked is None:  # deleted by another writer in the meantime
            raise SessionNotFoundError(f"Session {child} not found.")
        return forked

    # Events

    async def append_event(self, session: Session, event: Event) -> Event:
        """Store `event` and apply it to `session`. Appends through one session are taken in
        turn (as ADK's `DatabaseSessionService` takes them), so a session's copy shared by
        parallel branches of one invocation stays current between them, while another copy that
        did not see the events stored since is still refused as stale."""
        if event.partial:
            return event
        temp = {
            k: v
            for k, v in (event.actions.state_delta or {}).items()
            if isinstance(k, str) and k.startswith(State.TEMP_PREFIX)
        }
        event = self._trim_temp_delta_state(event)
        delta = lasting(event.actions.state_delta or {}, "append_event")
        item = event.model_dump(mode="python", exclude_none=True)
        if delta:  # stored, and read back, in the form its state takes
            item["actions"]["state_delta"] = delta
        check_item(item, where="append_event: the event")
        async with self._turn(session):
            # Cancelled once it is submitted, the append still commits or fails; it is applied
            # to `session` first, so that the caller's copy stays current for its next append.
            (marker, stored), cancelled = await self.store.run_write_outcome(
                self._append, session, event, item
            )
            if stored or not any(e.id == event.id for e in reversed(session.events)):
                # else a retry through a session that holds the event already
                session.state.update(temp)  # this invocation's own, never stored
                session.last_update_time = event.timestamp
                session._storage_update_marker = marker
                event = self._commit_event_to_session(session, event)
            if cancelled:
                raise asyncio.CancelledError
            return event

    @asynccontextmanager
    async def _turn(self, session: Session) -> AsyncIterator[None]:
        """Hold the append lock of `session`'s id, made on first use and dropped after its last
        user, so the marker a writer checks is the one the writer before it left."""
        key = (session.app_name, session.user_id, session.id)
        held = self._locks.get(key)
        if held is None:
            held = self._locks[key] = _SessionLock()
        held.users += 1
        try:
            async with held.lock:
                yield
        finally:
            held.users -= 1
            if held.users == 0:
                del self._locks[key]

    def _append(self, session: Session, event: Event, item: dict[str, Any]) -> tuple[str, bool]:
        """Store the event; returns the session's marker after it, and whether it was stored
        now (False for a retry of one stored already)."""
        store = self.store.store
        key = session_key(session.app_name, session.user_id, session.id)
        # An idempotency key only where a commit can end with its outcome unknown (PostgreSQL):
        # its index entry costs more bytes per event than anything else stored beside the event.
        idempotency_key = f"event:{event.id}" if store.log.outcome_may_be_unknown else None
        with store.transaction():
            summary = store.summary(key)
            if summary is None or summary["status"] != pj.ACTIVE:
                raise SessionNotFoundError(f"Session {session.id} not found.")
            before = _transcript(store, key)
            if _stored_already(store, key, before, item, idempotency_key):
                return str(summary["version"]), False
            pad = summary["scratchpad"] or {}
            _check_fresh(session, summary, _updated(before, pad))
            # The event's timestamp, the session's update time from now on, is kept by the
            # projection from the stored item (`Transcript.item_timestamp`): no record of its own.
            store.inject(key, {"item": item}, idempotency_key=idempotency_key)
            delta = item["actions"].get("state_delta") or {}
            deltas = _session_util.extract_state_delta(delta)
            _merge_into(store, app_key(session.app_name), deltas["app"])
            _merge_into(store, user_key(session.app_name, session.user_id), deltas["user"])
            # An encrypted session's items are sealed from the projection: there the scratchpad
            # keeps the update time, as it did for every session before.
            # Asked of the projection alone: a last activity equal to the timestamp is no keeping.
            kept = _transcript(store, key).item_timestamp == event.timestamp
            if deltas["session"] or not kept:
                state = {**pad.get("state", {}), **deltas["session"]}
                stamp = {} if kept else {"update_time": event.timestamp}
                rest = {k: v for k, v in pad.items() if k != "update_time"}  # names, CREATED
                store.set_scratchpad(key, fitting({**rest, "state": state, **stamp}))
            # The summary's `version`, read alone (the summary also lists children and clients).
            return str(_transcript(store, key).version), True


_PRIVATE_DEFAULTS = {
    name: attribute.get_default() for name, attribute in Session.__private_attributes__.items()
}


_ALL_FIELDS = set(Session.model_fields)
"""The fields set on a listed session: all of them. One set shared by every listed session (pydantic
only ever adds a field name to it, and each is in it already), so a listing of 10,000 sessions
does not make 10,000 more objects for the garbage collector to walk."""


def _listed(fields: dict[str, Any]) -> Session:
    """A `Session` of already valid fields, built as pydantic's `model_construct` builds one
    without its per-field bookkeeping: listing 10,000 sessions is mostly building them."""
    session = Session.__new__(Session)
    object.__setattr__(session, "__dict__", fields)
    object.__setattr__(session, "__pydantic_fields_set__", _ALL_FIELDS)
    object.__setattr__(session, "__pydantic_extra__", None)
    object.__setattr__(session, "__pydantic_private__", dict(_PRIVATE_DEFAULTS))
    return session


def _first_three(row: tuple[float, str, str, dict[str, Any]]) -> tuple[float, str, str]:
    return row[0], row[1], row[2]


def _stored_already(
    store: SessionStore,
    key: str,
    transcript: pj.Transcript,
    item: dict[str, Any],
    idempotency_key: str | None,
) -> bool:
    """Whether this event (as `item`) is a re-delivery of one already stored: the session's
    newest event (a retried append, whose first try committed), or, under an idempotency key,
    any of them. An event newer than every event stored so far (the projection keeps the newest
    timestamp) is none of them, and the newest is then not read. A different event under the id
    of the one found is refused: dropping it would leave the caller's session ahead of storage."""
    if idempotency_key is not None:
        found = store.injected_with(key, idempotency_key)
        if found is not None:
            with store.log.view() as view:  # the transaction's view
                _same_event(_item_at(view, found), item)
            return True
    if transcript.length == 0:
        return False
    newest_at = transcript.item_timestamp
    if newest_at is not None and item["timestamp"] > newest_at:
        return False
    newest = store.messages(key, last=1)[0].get("item")
    if not (isinstance(newest, Mapping) and newest.get("id") == item["id"]):
        return False
    _same_event(newest, item)
    return True


def _item_at(view: Any, position: int) -> object:
    """The item the event at `position` of the log stored (None when it holds none readable:
    sealed, or truncated away)."""
    try:
        [envelope] = view.read(after=position - 1, limit=1)
    except (TruncatedError, ValueError):  # ValueError: not exactly one envelope read
        return None
    data = envelope.data
    return data.message.item if isinstance(data, ev.MessageInjected) else None


def _same_event(stored: object, item: dict[str, Any]) -> None:
    """Refuse `item` unless it is the event stored under its id (or that one cannot be read)."""
    if isinstance(stored, Mapping) and dict(stored) != item:
        raise AlreadyExistsError(
            f"append_event: another event with id {item['id']!r} is stored already; "
            "an event is stored once, under an id of its own"
        )


def _check_fresh(session: Session, summary: Mapping[str, Any], updated: float) -> None:
    """Refuse a writer whose copy of the session is older than what is stored (`updated`)."""
    marker = session._storage_update_marker
    stale = (
        marker != str(summary["version"])
        if marker is not None
        else updated > session.last_update_time
    )
    if stale:
        raise StaleSessionError(
            f"append_event: session {session.id} changed since this copy was read "
            "(another writer appended); read it again with get_session"
        )


def _update_time(store: SessionStore, key: str, pad: Mapping[str, Any]) -> float:
    return _updated(_transcript(store, key), pad)


def _transcript(store: SessionStore, key: str) -> pj.Transcript:
    """The session's transcript projection (an empty one for a session never opened); inside a
    transaction, as the transaction sees it, from its cache after the first read."""
    with store.log.view() as view:
        return pj.load_transcript(view, key) or pj.Transcript()


def _updated(transcript: pj.Transcript | None, pad: Mapping[str, Any]) -> float:
    """A session's update time as ADK keeps it: the timestamp of its newest event, which the
    projection keeps from the stored events; for a session written before it did, the time the
    older code kept in the scratchpad; for one with no event yet, when it last changed."""
    if transcript is not None and transcript.item_timestamp is not None:
        return transcript.item_timestamp
    legacy = pad.get("update_time")
    if isinstance(legacy, (int, float)) and not isinstance(legacy, bool):
        return float(legacy)
    at = None if transcript is None else transcript.last_activity_at
    return 0.0 if at is None else at.timestamp()


def _events(
    store: SessionStore, key: str, length: int, config: GetSessionConfig | None
) -> list[Event]:
    """The session's events a `GetSessionConfig` asks for, reading no more than it needs."""
    last = None if config is None else config.num_recent_events
    after = None if config is None else config.after_timestamp
    if last == 0:
        return []
    if after is None:
        return _built(*store.message_structs(key, last=last))
    window = length if last is None else min(last, length)
    # Events are appended in time order: read back from the end until one is older than `after`.
    kept: list[Event] = []
    end = length
    while end > length - window:
        start = max(end - _PAGE, length - window)
        page, fresh = store.message_structs(key, after=start, limit=end - start)
        newer = [m for m in page if m.item is not None and m.item.get("timestamp", 0.0) >= after]
        kept[:0] = _built(newer, fresh)
        if len(newer) < len(page):
            break
        end = start
    return kept


def _built(stored: list[ev.Message], fresh: bool) -> list[Event]:
    """ADK's events of the stored items, straight from the structs the store read, without the
    message dicts around them. Items from the store's cache are shared with other readers, and
    an `Event` keeps the values of its free-form fields (a state delta's) as it is given them,
    so those items are copied first; items decoded for this read alone are not. A message that
    holds no item (written into the session by other code) is no event of ADK's."""
    copy = item_copier(fresh)
    return [Event.model_validate(copy(m.item)) for m in stored if m.item is not None]


def _scratch_state(store: SessionStore, key: str) -> dict[str, Any]:
    summary = store.summary(key)
    pad = (summary or {}).get("scratchpad") or {}
    return dict(pad.get("state", {}))


def _merge_into(store: SessionStore, key: str, delta: dict[str, Any]) -> None:
    """Merge `delta` into the shared state held by session `key` (opened on first use)."""
    if not delta:
        return
    if not store.exists(key):
        store.open_session(key)
    state = {**_scratch_state(store, key), **delta}
    store.set_scratchpad(key, {"state": state})


def _merged(
    store: SessionStore, app_name: str, user_id: str, session_state: dict[str, Any]
) -> dict[str, Any]:
    app_state = _scratch_state(store, app_key(app_name))
    return _prefixed(app_state, _scratch_state(store, user_key(app_name, user_id)), session_state)


def _prefixed(
    app_state: dict[str, Any], user_state: dict[str, Any], session_state: dict[str, Any]
) -> dict[str, Any]:
    merged = dict(session_state)
    merged.update({State.APP_PREFIX + k: v for k, v in app_state.items()})
    merged.update({State.USER_PREFIX + k: v for k, v in user_state.items()})
    return merged
