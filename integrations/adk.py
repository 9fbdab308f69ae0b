"""A Google ADK `BaseSessionService` on sessionlog: `SessionlogSessionService(store)`.

Give it to ADK's `Runner(session_service=...)`. Each ADK session is one sessionlog session; each
event is stored verbatim as one item (its content objects as plain data, bytes as bytes) and
comes back equal. A session's state lives in its scratchpad; `app:` state in one holder session
per app and `user:` state in one per app and user, so they are shared as ADK shares them;
`temp:` state is never stored. An event and every state change it carries commit together; an
event re-delivered after its append committed (a retry) is not stored twice (where a commit's
outcome can be unknown, on PostgreSQL, the event's id is also its idempotency key). A writer
holding a superseded copy of the session is refused with ADK's `StaleSessionError`.
`fork_session` branches a session in O(1). Needs ``pip install 'sessionlog-engine[adk]'``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import projections as pj
from eventlog import events as ev
from integrations._common import async_store, require
from sessions import SessionStore, UnknownSessionError
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

SESSION_PREFIX = "adk:"
APP_PREFIX = "adk-app:"
USER_PREFIX = "adk-user:"
_PAGE = 64  # entries read per step when looking back for a timestamp


def session_key(app_name: str, user_id: str, session_id: str) -> str:
    """The sessionlog id of an ADK session: its three names, each percent-encoded."""
    return f"{SESSION_PREFIX}{_part(app_name)}/{_part(user_id)}/{_part(session_id)}"


def _part(name: str) -> str:
    return quote(name, safe="")


def _app_key(app_name: str) -> str:
    return APP_PREFIX + _part(app_name)


def _user_key(app_name: str, user_id: str) -> str:
    return f"{USER_PREFIX}{_part(app_name)}/{_part(user_id)}"


class SessionlogSessionService(BaseSessionService):
    """ADK's session service on a sessionlog store (a `SessionStore`, its asyncio face, or a
    path). Blocking work runs on the store's worker thread, never on the event loop."""

    def __init__(self, store: SessionStore | AsyncSessionStore | str | os.PathLike[str]) -> None:
        self.store = async_store(store)

    # Sessions

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        sid = (session_id or "").strip() or platform_uuid.new_uuid()
        return await self.store.run(self._create, app_name, user_id, sid, dict(state or {}))

    def _create(self, app_name: str, user_id: str, sid: str, state: dict[str, Any]) -> Session:
        store = self.store.store
        key = session_key(app_name, user_id, sid)
        deltas = _session_util.extract_state_delta(state)
        with store.transaction():
            if store.exists(key):
                raise AlreadyExistsError(f"Session with id {sid} already exists.")
            store.open_session(key, title=sid, metadata={"app": app_name, "user": user_id})
            _merge_into(store, _app_key(app_name), deltas["app"])
            _merge_into(store, _user_key(app_name, user_id), deltas["user"])
            if deltas["session"]:
                store.set_scratchpad(key, {"state": _storable(deltas["session"])})
            return self._load(store, app_name, user_id, sid, None)  # type: ignore[return-value]

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        sid = session_id.strip() if session_id else session_id
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
        return await self.store.run(self._list, app_name, user_id)

    def _list(self, app_name: str, user_id: str | None) -> ListSessionsResponse:
        store = self.store.store
        prefix = f"{SESSION_PREFIX}{_part(app_name)}/"
        if user_id is not None:
            prefix += _part(user_id) + "/"
        rows: list[tuple[float, str, str, dict[str, Any]]] = []
        with collector_paused():  # thousands of sessions are built: none holds a cycle
            with store.log.view() as view:
                app_state = _scratch_state(store, _app_key(app_name))
                shared: dict[str, dict[str, Any]] = {}  # per user: its app: and user: keys
                transcripts = dict(pj.iter_transcripts(view, prefix=prefix))
                for entry in pj.iter_scratchpads(view, prefix=prefix):
                    if entry.status != pj.ACTIVE:
                        continue
                    user, sid = entry.session_id[len(SESSION_PREFIX) :].split("/")[1:3]
                    user = unquote(user)
                    common = shared.get(user)
                    if common is None:
                        user_state = _scratch_state(store, _user_key(app_name, user))
                        common = shared[user] = _prefixed(app_state, user_state, {})
                    pad = entry.scratchpad or {}
                    state = pad.get("state", {})  # decoded for this call alone: handed out as it is
                    state.update(common)
                    updated = _updated(transcripts.get(entry.session_id), pad)
                    rows.append((updated, user, unquote(sid), state))
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
        key = session_key(app_name, user_id, session_id.strip())
        try:
            await self.store.delete(key)
        except UnknownSessionError:
            return

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await self.store.run(_scratch_state, self.store.store, _user_key(app_name, user_id))

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
        shared, not copied: O(1) in the history's length. Its state starts as the parent's;
        later events of either never reach the other. The session returned holds the events
        `config` asks for, as `get_session` gives them (all of them without one;
        ``GetSessionConfig(num_recent_events=0)`` reads none, keeping the fork O(1) end to end)."""
        child = (new_session_id or "").strip() or platform_uuid.new_uuid()
        return await self.store.run(
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
            if not store.exists(source):
                raise SessionNotFoundError(f"Session {sid} not found.")
            if store.exists(target):
                raise AlreadyExistsError(f"Session with id {child} already exists.")
            if at_event is None:
                store.fork(source, target)
            else:
                store.fork_at(source, at_event, target)
            store.rename(target, child)
        # Read once committed: a fork's events are its parent's, which this process may hold
        # decoded already (a transaction's own reads are never kept).
        forked = self._load(store, app_name, user_id, child, config)
        if forked is None:  # deleted by another writer in the meantime
            raise SessionNotFoundError(f"Session {child} not found.")
        return forked

    # Events

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        item = event.model_dump(mode="python", exclude_none=True)
        check_item(item, where="append_event: the event")
        marker = await self.store.run(self._append, session, event, item)
        session.last_update_time = event.timestamp
        session._storage_update_marker = marker
        return self._commit_event_to_session(session, event)

    def _append(self, session: Session, event: Event, item: dict[str, Any]) -> str:
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
            if _stored_already(store, key, before, event, idempotency_key):
                return str(summary["version"])
            pad = summary["scratchpad"] or {}
            _check_fresh(session, summary, _updated(before, pad))
            # The event's timestamp, the session's update time from now on, is kept by the
            # projection from the stored item (`Transcript.item_timestamp`): no record of its own.
            store.inject(key, {"item": item}, idempotency_key=idempotency_key)
            deltas = _session_util.extract_state_delta(dict(event.actions.state_delta or {}))
            _merge_into(store, _app_key(session.app_name), deltas["app"])
            _merge_into(store, _user_key(session.app_name, session.user_id), deltas["user"])
            # An encrypted session's items are sealed from the projection: there the scratchpad
            # keeps the update time, as it did for every session before.
            # Asked of the projection alone: a last activity equal to the timestamp is no keeping.
            kept = _transcript(store, key).item_timestamp == event.timestamp
            if deltas["session"] or not kept:
                state = {**pad.get("state", {}), **_storable(deltas["session"])}
                stamp = {} if kept else {"update_time": event.timestamp}
                store.set_scratchpad(key, {"state": state, **stamp})
            # The summary's `version`, read alone (the summary also lists children and clients).
            return str(_transcript(store, key).version)


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
    event: Event,
    idempotency_key: str | None,
) -> bool:
    """Whether this event is a re-delivery of one already stored: the session's newest event
    (a retried append, whose first try committed), or, under an idempotency key, any of them.
    An event newer than every event stored so far (the projection keeps the newest timestamp)
    is none of them, and the newest is then not read."""
    if idempotency_key is not None:
        with store.log.view() as view:  # the transaction's view
            if view.kv_get(pj.idempotency_key(key, idempotency_key)) is not None:
                return True
    if transcript.length == 0:
        return False
    newest_at = transcript.item_timestamp
    if newest_at is not None and event.timestamp > newest_at:
        return False
    newest = store.messages(key, last=1)[0].get("item")
    return isinstance(newest, Mapping) and newest.get("id") == event.id


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
    state = {**_scratch_state(store, key), **_storable(delta)}
    store.set_scratchpad(key, {"state": state})


def _merged(
    store: SessionStore, app_name: str, user_id: str, session_state: dict[str, Any]
) -> dict[str, Any]:
    app_state = _scratch_state(store, _app_key(app_name))
    return _prefixed(app_state, _scratch_state(store, _user_key(app_name, user_id)), session_state)


def _prefixed(
    app_state: dict[str, Any], user_state: dict[str, Any], session_state: dict[str, Any]
) -> dict[str, Any]:
    merged = dict(session_state)
    merged.update({State.APP_PREFIX + k: v for k, v in app_state.items()})
    merged.update({State.USER_PREFIX + k: v for k, v in user_state.items()})
    return merged


def _storable(state: dict[str, Any]) -> dict[str, Any]:
    """State values as stored: kept as they are when they can be, else in ADK's own JSON-safe
    form (as ADK's SQL services store them)."""
    try:
        check_item(state, where="state")
    except ValueError:
        return _session_util.make_json_safe_state(state)
    return state
