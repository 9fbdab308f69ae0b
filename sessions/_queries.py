"""Read verbs of `SessionStore`, mixed into it: a session's state, messages, snapshot, family
and the pages of sessions. None of them writes; each reads one consistent view of the log.
"""

from __future__ import annotations

from typing import Any

import projections as pj
from eventlog import (
    InvalidArgumentError,
    LogView,
    limits,
    to_builtins,
)
from eventlog import events as ev
from eventlog.errors import ForgottenError
from sessions._checks import check_count, client_dict, iso
from sessions._host import SessionHost, readable
from sessions._hot import Hot
from sessions._ids import check_session_id, possible_id
from sessions._messages import to_dicts
from sessions._seal import SEALED_TEXT, Sealer


class QueryVerbs(SessionHost):
    """The queries; `SessionStore` fills the cache of hot transcripts."""

    def exists(self, session_id: object) -> bool:
        """Whether `session_id` names an open session (never raises for unknown ids)."""
        sid = possible_id(session_id)
        if sid is None:
            return False
        with self.log.view() as view:
            state = pj.load_state(view, sid)
        return state is not None and state.status == pj.ACTIVE

    def length(self, session_id: str) -> int:
        """Number of messages; raises `UnknownSessionError` for an unknown id."""
        with self.log.view() as view:
            state = self._state(view, session_id, "length", closed=True)
            transcript = pj.load_transcript(view, state.session_id)
        return transcript.length if transcript else 0

    def messages(
        self,
        session_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        last: int | None = None,
    ) -> list[dict[str, Any]]:
        """The transcript as fresh message dicts; raises for an unknown id. `after` and `limit`
        give a page: up to `limit` messages following the first `after`, read without the rest.
        `last` gives the last `last` messages (of that page), read without the ones before."""
        found, fresh = self.message_structs(session_id, after=after, limit=limit, last=last)
        return to_dicts(found, fresh=fresh)

    def message_structs(
        self,
        session_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        last: int | None = None,
    ) -> tuple[list[ev.Message], bool]:
        """What `messages` reads, as the log's `Message` structs, and whether they are fresh
        (decoded for this call alone; the whole transcript or a page may come from the cache,
        and its structs' items must then be copied before anyone may change them). For callers
        that want a field or two of each message without building every dict."""
        skip = check_count(after, "after", "messages")
        count = None if limit is None else check_count(limit, "limit", "messages")
        tail = None if last is None else check_count(last, "last", "messages")
        with self.log.view() as view:
            state = self._state(view, session_id, "messages", closed=True)
            if skip == 0 and count is None and tail is None:
                return self._messages(view, state, "messages"), False
            transcript = pj.load_transcript(view, state.session_id) or pj.Transcript()
            if tail is not None:
                end = transcript.length if count is None else min(transcript.length, skip + count)
                first = max(skip, end - tail)
                skip, count = first, max(end - first, 0)
            return self._page(view, state, transcript, skip, count)

    def _page(
        self,
        view: LogView,
        state: pj.SessionState,
        transcript: pj.Transcript,
        skip: int,
        count: int | None,
    ) -> tuple[list[ev.Message], bool]:
        """Messages `skip` .. `skip + count` of the transcript, and whether they are fresh: cut
        from the session's cached transcript when that is current, else the page kept from the
        last read of the same page, else read (see `HotTranscripts.page`)."""
        window = pj.ranges_window(transcript.ranges, skip, count)
        hot, session_id = self._hot, state.session_id
        keep = False
        if self._keeps_reads():  # what is cached is asked whether it may be shown once found
            whole = hot.get(session_id)
            if whole is not None and whole.ranges == transcript.ranges:
                if self._cache_usable(view, state):
                    end = None if count is None else skip + count
                    return whole.messages[skip:end], False
            else:
                kept, keep = hot.page(session_id, window)
                if kept is not None and self._cache_usable(view, state):
                    return kept, False
        opener = self._opener(view, state, "messages")
        found = pj.read_messages(view, transcript, ranges=window, opener=opener)
        if keep:
            hot.keep_page(session_id, window, found)
        return found, not keep

    def _messages(self, view: LogView, state: pj.SessionState, verb: str) -> list[ev.Message]:
        session_id = state.session_id
        opener = self._opener(view, state, verb)
        transcript = pj.load_transcript(view, session_id) or pj.Transcript()
        if not self._keeps_reads():
            return pj.read_messages(view, transcript, opener=opener)
        hot = self._hot
        own = hot.get(session_id)
        hit = hot.kin(transcript.ranges) if own is None else own
        messages: list[ev.Message] = []
        rest = transcript.ranges
        if hit is not None and self._cache_usable(view, state):
            if hit is own and hit.ranges == transcript.ranges:  # no message changed since
                return hit.messages
            shared, rest = pj.ranges_shared(hit.ranges, transcript.ranges)
            messages = hit.messages[:shared]
        if rest:
            messages += pj.read_messages(view, transcript, ranges=rest, opener=opener)
        hot.put(session_id, Hot(transcript.ranges, messages))
        return messages

    def snapshot(self, session_id: object) -> dict[str, Any] | None:
        """Everything about a session, transcript included; None for an unknown or deleted id. A
        closed session is still readable: its `status` says `closed`."""
        return self._described(session_id, "snapshot", with_transcript=True)

    def summary(self, session_id: object) -> dict[str, Any] | None:
        """The snapshot without its transcript: every other field, read from the projection
        without touching a message (O(1) in the transcript's length); None for an unknown or
        deleted id."""
        return self._described(session_id, "summary", with_transcript=False)

    def _described(
        self, session_id: object, verb: str, *, with_transcript: bool
    ) -> dict[str, Any] | None:
        with self.log.view() as view:
            state = _readable_state(view, session_id)
            if state is None:
                return None
            sid = state.session_id
            transcript = pj.load_transcript(view, sid) or pj.Transcript()
            messages = self._messages(view, state, verb) if with_transcript else []
            children = pj.child_ids(view, sid)
        described = _snapshot(self._opened(state, verb), transcript, messages, children)
        if not with_transcript:
            del described["transcript"]
        return described

    def ancestry(self, session_id: object) -> dict[str, Any] | None:
        """``{parent_id, child_ids, root_id}``; None for an unknown or deleted id (a closed session
        keeps its place in its family)."""
        with self.log.view() as view:
            state = _readable_state(view, session_id)
            if state is None:
                return None
            root = state.session_id
            parent_id = state.parent_id
            seen = {root}
            while parent_id is not None and parent_id not in seen:
                parent = pj.load_state(view, parent_id)
                if parent is None:
                    break
                seen.add(parent_id)
                root, parent_id = parent_id, parent.parent_id
            return {
                "parent_id": state.parent_id,
                "child_ids": pj.child_ids(view, state.session_id),
                "root_id": root,
            }

    def list_sessions(
        self, *, cursor: str | None = None, limit: int = 50, status: str | None = None
    ) -> dict[str, Any]:
        """A page of sessions in id order: ``{"sessions": [...], "next_cursor": id or None}``.

        `status` filters (`active`, `closed`, `deleted`); without it, deleted sessions are left out.
        """
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not (1 <= limit <= limits.list_page_sessions_max)
        ):
            raise InvalidArgumentError(
                f"list_sessions: `limit` must be an int from 1 to "
                f"{limits.list_page_sessions_max}, got {limit!r}"
            )
        if status not in (None, pj.ACTIVE, pj.CLOSED, pj.DELETED):
            raise InvalidArgumentError(
                f"list_sessions: `status` must be active, closed or deleted, got {status!r}"
            )
        if cursor is not None:
            if not isinstance(cursor, str):
                raise InvalidArgumentError(
                    "list_sessions: `cursor` must be a session id from a page"
                )
            cursor = check_session_id(cursor, where="list_sessions: `cursor`")
        page: list[dict[str, Any]] = []
        last: str | None = None
        more = False
        with self.log.view() as view:
            for state in pj.iter_states(view, after=cursor):
                if len(page) == limit:
                    more = True
                    break
                last = state.session_id
                wanted = state.status == status if status else state.status != pj.DELETED
                if wanted:
                    transcript = pj.load_transcript(view, state.session_id) or pj.Transcript()
                    page.append(_summary(state, transcript, self._sealer))
        return {"sessions": page, "next_cursor": last if more else None}


def _readable_state(view: LogView, session_id: object) -> pj.SessionState | None:
    """The state of a session the tolerant queries may read (a closed one too); None for an
    unknown or deleted id, or one no session can have."""
    sid = possible_id(session_id)
    if sid is None:
        return None
    state = pj.load_state(view, sid)
    return state if state is not None and readable(state, True) else None


def _summary(
    state: pj.SessionState, transcript: pj.Transcript, sealer: Sealer | None
) -> dict[str, Any]:
    title = state.title
    if sealer is not None and title is not None and title.startswith(SEALED_TEXT):
        # A page of sessions lists forgotten ones too: their titles went with their keys (a
        # view of the past shows one forgotten since as not forgotten yet, its key gone).
        try:
            title = None if state.forgotten else sealer.open_state(state, "list_sessions").title
        except ForgottenError:
            title = None
    return {
        "session_id": state.session_id,
        "title": title,
        "status": state.status,
        "length": transcript.length,
        "created_at": iso(state.created_at),
        "last_activity_at": iso(transcript.last_activity_at or state.last_activity_at),
        "parent_id": state.parent_id,
    }


def _snapshot(
    state: pj.SessionState,
    transcript: pj.Transcript,
    messages: list[ev.Message],
    children: list[str],
) -> dict[str, Any]:
    return {
        "session_id": state.session_id,
        "transcript": to_dicts(messages),
        "length": transcript.length,
        "created_at": iso(state.created_at),
        "last_activity_at": iso(transcript.last_activity_at or state.last_activity_at),
        "title": state.title,
        "agent_id": state.agent_id,
        "status": state.status,
        "system_prompt": state.system_prompt,
        "tool_format": state.tool_format,
        "scratchpad": to_builtins(state.scratchpad),
        "scratchpad_version": state.scratchpad_version,
        "parent_id": state.parent_id,
        "child_ids": children,
        "branched_at_event_index": state.branched_at_event_index,
        "live_clients": [client_dict(c) for c in state.clients],
        "live_controller_id": state.controller_id,
        "workspace_anchor": to_builtins(state.workspace_anchor),
        "workspace_policy": to_builtins(state.workspace_policy),
        "roots": to_builtins(state.roots),
        "metadata": to_builtins(state.metadata),
        "formation": to_builtins(state.formation),
        "scope": state.scope,
        "parent_spawn_ref": to_builtins(state.parent_spawn_ref),
        "version": transcript.version,
    }
