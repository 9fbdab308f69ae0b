"""The session engine: every verb validates, reads the projection, decides events and appends them.

The log's projector updates the projection inside the same write transaction, so a command's events
and their effect commit together or not at all. A refused command raises before it appends, and
nothing is written. This module owns the lifecycle verbs and the queries; live clients, workspace
and scratchpad verbs live in `_live.py`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import projections as pj
from eventlog import (
    ANY,
    Envelope,
    EventLog,
    ForgottenError,
    InvalidArgumentError,
    SessionExistsError,
    Subscription,
    Transaction,
    VerifyReport,
    limits,
    to_builtins,
)
from eventlog import events as ev
from sessions import _compact
from sessions._checks import check_dict, check_policy, check_text
from sessions._context import ContextVerbs, ContextView
from sessions._context_policy import ContextPolicy
from sessions._group import GroupCommit, grouped
from sessions._host import Command, append, transact
from sessions._hot import HotTranscripts, Kept
from sessions._ids import check_session_id, pop_current, push_current, uuid7
from sessions._keys import KeyProvider
from sessions._live import LiveVerbs
from sessions._messages import default_token_counter
from sessions._queries import QueryVerbs
from sessions._retention import RetentionVerbs
from sessions._seal import Sealer
from sessions._shred import ShredVerbs, finish_shredding, keyring_of
from sessions._tokens import BearerSessions
from sessions._transcript import TranscriptVerbs

logger = logging.getLogger("sessionlog.sessions")

OPEN_OPTIONS = frozenset(
    (
        "workspace_anchor",
        "workspace_policy",
        "system_prompt",
        "tool_format",
        "agent_id",
        "title",
        "metadata",
        "formation",
        "scope",
        "parent_spawn_ref",
    )
)


class SessionSubscription:
    """Handle returned by `SessionStore.subscribe`; `close()` unsubscribes."""

    def __init__(
        self,
        store: SessionStore,
        session_id: str,
        callback: Callable[[Envelope], object],
        on_error: Callable[[BaseException, Envelope], object] | None,
    ) -> None:
        self.session_id = session_id
        self._store = store
        self._callback = callback
        self._on_error = on_error
        self.errors: list[BaseException] = []
        self.active = True

    def _deliver(self, envelope: Envelope) -> None:
        token = push_current(self.session_id)
        try:
            self._callback(envelope)
        except Exception as exc:  # reported, never allowed to break the store or other subscribers
            self.errors.append(exc)
            if self._on_error is not None:
                self._on_error(exc, envelope)
            else:
                logger.exception(
                    "subscriber of `%s` failed at %d", self.session_id, envelope.position
                )
        finally:
            pop_current(token)

    def close(self) -> None:
        if self.active:
            self.active = False
            self._store._unsubscribe(self)

    def __enter__(self) -> SessionSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SessionStore(
    QueryVerbs, TranscriptVerbs, LiveVerbs, ContextVerbs, ShredVerbs, RetentionVerbs
):
    """Sessions as projections of one event log. Open with `SessionStore.open(path)`."""

    def __init__(
        self,
        log: EventLog,
        *,
        hot_sessions: int = limits.hot_sessions_default,
        max_sessions: int | None = None,
        token_counter: _compact.TokenCounter | None = None,
        summarizer: _compact.Summarizer | None = None,
        readonly_at: int | None = None,
        context_policy: ContextPolicy | None = None,
        readonly: bool = False,
        keys: KeyProvider | None = None,
    ) -> None:
        if isinstance(hot_sessions, bool) or not isinstance(hot_sessions, int) or hot_sessions < 0:
            raise InvalidArgumentError(f"hot_sessions must be an int >= 0, got {hot_sessions!r}")
        if max_sessions is not None and (
            isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1
        ):
            raise InvalidArgumentError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
        self.log = log
        self.max_sessions = max_sessions
        self.token_counter = token_counter or default_token_counter
        self.summarizer = summarizer
        self.context_policy = context_policy or ContextPolicy()
        """The default policy of `maintain_context` (see `sessions/_context.py`)."""
        self._context_views: Kept[ContextView] = Kept(hot_sessions)
        self.readonly_at = readonly_at
        self.readonly = readonly or readonly_at is not None
        self._hot = HotTranscripts(hot_sessions)
        self._subscribers: dict[str, list[SessionSubscription]] = {}
        self._log_subscription: Subscription | None = None
        self._group = GroupCommit(log)
        self._valid_ids: set[str] = set()
        self.tokens = BearerSessions(self)
        """Durable bearer sessions: `create`, `get`, `touch`, `expire` (see `sessions/_tokens.py`)."""
        log.set_projector(pj.project)
        self._keyring = keyring_of(log, keys)
        self._sealer = Sealer(self._keyring) if self._keyring.encrypted else None
        if readonly:
            pj.check_current(log)
        elif readonly_at is None:
            pj.catch_up(log)
            finish_shredding(log, self._keyring)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        sync: bool = True,
        hot_sessions: int = limits.hot_sessions_default,
        max_sessions: int | None = None,
        token_counter: _compact.TokenCounter | None = None,
        summarizer: _compact.Summarizer | None = None,
        context_policy: ContextPolicy | None = None,
        readonly: bool = False,
        keys: KeyProvider | None = None,
    ) -> SessionStore:
        """Open (creating if missing) the store in directory `path`, on the durable LMDB log, or
        in the PostgreSQL database a `postgresql://` URL names (see `EventLog.open`).

        `readonly=True` opens an existing store for reading only: nothing is created or written,
        and every command that would write raises `InvalidArgumentError`.

        `keys` (a `KeyProvider`, e.g. `LocalKeyProvider.from_file(path)`) encrypts every session
        opened from then on, each under a data key of its own (see `sessions/_seal.py`). A store
        with encrypted sessions opens without it too: `verify`, ancestry and paging need no key,
        and what does need one raises `MissingKeyError`."""
        log = EventLog.open(path, sync=sync, readonly=readonly)
        try:
            return cls(
                log,
                hot_sessions=hot_sessions,
                max_sessions=max_sessions,
                token_counter=token_counter,
                summarizer=summarizer,
                context_policy=context_policy,
                readonly=readonly,
                keys=keys,
            )
        except BaseException:
            log.close()
            raise

    @classmethod
    def memory(cls, **options: Any) -> SessionStore:
        """A store on the in-memory reference log (nothing survives the process)."""
        return cls(EventLog.memory(), **options)

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _forget_cached(self) -> None:
        """Drop the decrypted messages this process holds (after a `forget`)."""
        self._hot.clear()
        self._context_views.clear()

    def close(self) -> None:
        self._group.close()  # the queued writes are committed (or refused) first
        if self._log_subscription is not None:
            self._log_subscription.close()
        self.log.close()

    @contextmanager
    def transaction(self) -> Iterator[SessionStore]:
        """Run any number of commands as one atomic, durable commit."""
        self._writable("transaction")
        with self.log.transaction():
            yield self

    @contextmanager
    def driving(self, session_id: str) -> Iterator[str]:
        """Mark `session_id` as the session being driven: `sessions.current_id()` returns it."""
        sid = check_session_id(session_id, where="driving")
        token = push_current(sid)
        try:
            yield sid
        finally:
            pop_current(token)

    # Lifecycle

    @grouped
    def open_session(self, session_id: str | None = None, **options: Any) -> str:
        """Open a session, or return `session_id` unchanged if it is already open with the same
        options; an open session with different options is a `SessionExistsError`."""
        self._writable("open_session")
        unknown = sorted(set(options) - OPEN_OPTIONS)
        if unknown:
            raise InvalidArgumentError(
                f"open_session: unknown option {', '.join(map(repr, unknown))} "
                f"(expected one of: {', '.join(sorted(OPEN_OPTIONS))})"
            )
        event_fields = _open_fields(options)
        sid = uuid7() if session_id is None else check_session_id(session_id, where="open_session")

        def decide(tx: Transaction) -> str:
            existing = pj.load_state(tx, sid)
            if existing is not None and existing.status == pj.ACTIVE:
                _check_same_options(tx, existing, event_fields, self._sealer)
                return sid
            self._check_capacity(tx, "open_session")
            opened = ev.SessionOpened(
                session_id=sid,
                created_at=datetime.now(UTC),
                key_slot=self._new_key(tx, sid, "open_session"),
                **event_fields,
            )
            append(tx, sid, [opened], sealer=self._sealer)
            return sid

        return transact(self.log, decide)

    @grouped
    def close_session(self, session_id: str, status: str | Mapping[str, Any] | None = None) -> None:
        """Close a session: it no longer exists for queries or verbs; its history stays."""
        if status is None or isinstance(status, str):
            reason, detail = status, ({"reason": status} if status else {})
        else:
            detail = check_dict(status, "status", "close_session", optional=False)
            found = detail.get("reason")
            reason = found if isinstance(found, str) else None
        closed = ev.AgentSessionClosed(reason=reason, status=detail)
        self._command("close_session", session_id, lambda cmd: cmd.emit([closed]))

    @grouped
    def delete(self, session_id: str, *, reason: str | None = None) -> None:
        """Remove a session from every query; its events stay in the log."""
        check_text(reason, "reason", "delete")
        deleted = ev.SessionDeleted(reason=reason)
        self._command("delete", session_id, lambda cmd: cmd.emit([deleted]))

    @grouped
    def rename(self, session_id: str, title: str | None) -> None:
        check_text(title, "title", "rename")
        renamed = ev.SessionRenamed(title=title)
        self._command("rename", session_id, lambda cmd: cmd.emit([renamed]))

    @grouped
    def update_metadata(
        self,
        session_id: str,
        metadata: Mapping[str, Any] | None = None,
        *,
        remove: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Set the keys of `metadata` (merged over the session's) and drop the keys in `remove`,
        as one event; returns the metadata after. A key both set and removed is refused."""
        verb = "update_metadata"
        changes = check_dict(metadata, "metadata", verb)
        if isinstance(remove, (str, bytes)) or not all(isinstance(k, str) for k in remove):
            raise InvalidArgumentError(f"{verb}: `remove` must be a list of keys, got {remove!r}")
        both = sorted(set(changes) & set(remove))
        if both:
            raise InvalidArgumentError(f"{verb}: keys both set and removed: {', '.join(both)}")
        event = ev.SessionMetadataSet(metadata=changes, removed=list(remove))

        def decide(cmd: Command) -> dict[str, Any]:
            cmd.emit([event])
            after = pj.load_state(cmd.tx, cmd.session_id)
            assert after is not None, "the projection did not fold session_metadata_set"
            return dict(to_builtins(self._opened(after, verb).metadata))

        return self._command(verb, session_id, decide)

    # Subscriptions

    def subscribe(
        self,
        session_id: str,
        callback: Callable[[Envelope], object],
        *,
        on_error: Callable[[BaseException, Envelope], object] | None = None,
    ) -> SessionSubscription:
        """Call `callback(envelope)` after commit for each event of this session, in order.

        Inside the callback `sessions.current_id()` is the session. Forks do not inherit it; a
        reset keeps it; closing or deleting the session ends it after that last event.
        """
        if not callable(callback):
            raise InvalidArgumentError("subscribe: `callback` must be callable")
        with self.log.view() as view:
            state = self._state(view, session_id, "subscribe")
        handle = SessionSubscription(self, state.session_id, callback, on_error)
        if self._log_subscription is None:
            self._log_subscription = self.log.subscribe(self._dispatch)
        self._subscribers.setdefault(state.session_id, []).append(handle)
        return handle

    def _dispatch(self, envelope: Envelope) -> None:
        handles = self._subscribers.get(envelope.stream)
        if not handles:
            return
        for handle in list(handles):
            if handle.active:
                handle._deliver(envelope)
        if isinstance(envelope.data, (ev.AgentSessionClosed, ev.SessionDeleted)):
            for handle in self._subscribers.pop(envelope.stream, []):
                handle.active = False

    def _unsubscribe(self, handle: SessionSubscription) -> None:
        handles = self._subscribers.get(handle.session_id, [])
        if handle in handles:
            handles.remove(handle)

    # Whole-store operations

    def rebuild(self, *, progress: Callable[[int, int], object] | None = None) -> int:
        """Recompute every projection from the log; returns the position it reflects.
        `progress(done, head)` is called as pages of events are applied."""
        self._writable("rebuild")
        self._forget_cached()
        return pj.rebuild(self.log, progress=progress)

    def verify(
        self,
        *,
        projections: bool = False,
        progress: Callable[[int, int], object] | None = None,
    ) -> VerifyReport:
        """Check the log's hash chain and indexes (`EventLog.verify`) and, with `projections`,
        that every projection (transcripts, bearer-token records, ancestry, ...) is exactly what
        the log folds to: a rebuild into scratch space compared key by key, which catches state
        changed underneath the log. Never raises for damage; the report names it. On LMDB the
        walk runs in a child process, so a damaged page cannot abort this one."""
        if not projections:
            return self.log.verify(progress=progress)
        return pj.verify(self.log, progress=progress)

    def as_of(self, position: int) -> SessionStore:
        """A read-only store showing every session as it was right after `position`."""
        head = self.log.head
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position <= head:
            raise InvalidArgumentError(
                f"as_of: position must be an int from 0 to {head}, got {position!r}"
            )
        past = EventLog.memory()
        past.set_projector(pj.project)
        after = 0
        while after < position:
            page = self.log.read(
                after=after, limit=min(limits.read_page_events_max, position - after)
            )
            with past.transaction():
                for envelope in page:
                    past.append(
                        envelope.stream,
                        [envelope.data],
                        expected_version=ANY,
                        meta=envelope.meta,
                        recorded_at=envelope.recorded_at,
                    )
            after = page[-1].position
        view = SessionStore(past, hot_sessions=0, readonly_at=position)
        view._sealer = self._sealer  # the same positions, so the same ciphertexts open
        return view


def _check_same_options(
    tx: Transaction, state: pj.SessionState, fields: Mapping[str, Any], sealer: Sealer | None
) -> None:
    """Refuse to reuse an open session for a call that asked for something else: each option
    given is compared with what the session was opened (or forked) with."""
    first = tx.read_stream(state.session_id, after=state.opened_version - 1, limit=1)
    opened: ev.Event | None = first[0].data if first else None
    if sealer is not None and fields:
        if state.forgotten:
            raise ForgottenError(state.session_id, "open_session", state.forgotten_reason)
        state = sealer.open_state(state, "open_session")
        if opened is not None:
            opened = sealer.open_event(opened, state.key_slot, "open_session")
    differing = []
    for name, wanted in fields.items():
        held = getattr(opened if isinstance(opened, ev.SessionOpened) else state, name, None)
        if to_builtins(held) != to_builtins(wanted):
            differing.append(name)
    if differing:
        # Named, never quoted: what the session holds is its owner's (a prompt, metadata), and
        # the caller may be someone else, or the message may land in a log.
        raise SessionExistsError(
            f"open_session: session `{state.session_id}` is already open with another "
            f"{', '.join(differing)} (give no options to reuse it, or another id)"
        )


def _open_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    verb = "open_session"
    fields: dict[str, Any] = {}
    for name in ("system_prompt", "tool_format", "agent_id", "title"):
        if options.get(name) is not None:
            fields[name] = check_text(options[name], name, verb)
    for name in ("metadata", "formation"):
        if options.get(name) is not None:
            fields[name] = check_dict(options[name], name, verb)
    for name in ("workspace_anchor", "parent_spawn_ref"):
        if options.get(name) is not None:
            fields[name] = check_dict(options[name], name, verb)
    if options.get("workspace_policy") is not None:
        fields["workspace_policy"] = check_policy(options["workspace_policy"], verb)
    scope = options.get("scope")
    if scope is not None:
        if scope not in ("persistent", "ephemeral"):
            raise InvalidArgumentError(
                f"{verb}: `scope` must be persistent or ephemeral, got {scope!r}"
            )
        fields["scope"] = scope
    return fields
