"""The transcripts this process read last, kept decoded so the next read of one costs nothing.

An entry is a session's transcript ranges (which slots of which segments it is made of) and its
messages. Filled slots of a segment never change, so an entry also serves any other
transcript whose ranges start the same way: the same session after messages were appended or taken
back, a fork of it, its parent, a sibling fork. Each such reader takes the messages the two share
and reads only the rest from the log. Entries are filled only from committed views (see
`QueryVerbs._messages`), so nothing here ever holds what a rolled-back transaction wrote.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, NamedTuple, TypeVar

from eventlog import events as ev

Ranges = tuple[tuple[int, int, int], ...]
_V = TypeVar("_V")


class Hot(NamedTuple):
    ranges: Ranges
    messages: list[ev.Message]


class HotTranscripts:
    """A least-recently-used map of session id to `Hot`, holding at most `cap` entries, with an
    index from where a transcript starts (its first segment and slot) to the session cached
    last whose transcript starts there. Beside it, per session, the page of it read last (its
    ranges, and its messages once the same page was asked for twice in a row: a reader polling
    a session's tail keeps it, a reader paging through once never fills the cache, nor pushes
    a kept page out of it).

    Safe to share between threads: each method holds a lock for its few dictionary steps (an
    uncontended lock costs a fraction of a microsecond; a read costs tens)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Hot] = OrderedDict()
        self._starts: dict[tuple[int, int], str] = {}
        self._pages: OrderedDict[str, tuple[Ranges, list[ev.Message]]] = OrderedDict()
        """Session id -> the page of it kept (asked for twice in a row) and its messages."""
        self._asked: OrderedDict[str, Ranges] = OrderedDict()
        """Session id -> the page of it asked for last, not kept: a reader that asks once for a
        page of each of many sessions churns this map, never the kept pages."""

    def get(self, session_id: str) -> Hot | None:
        with self._lock:
            found = self._entries.get(session_id)
            if found is not None:
                self._entries.move_to_end(session_id)
            return found

    def kin(self, ranges: Ranges) -> Hot | None:
        """The entry cached last of a transcript starting where `ranges` starts; None if none."""
        if not ranges:
            return None
        start = ranges[0][:2]
        with self._lock:
            session_id = self._starts.get(start)
            found = None if session_id is None else self._entries.get(session_id)
            if found is None or not found.ranges or found.ranges[0][:2] != start:
                return None
            self._entries.move_to_end(session_id)  # type: ignore[arg-type]
            return found

    def put(self, session_id: str, entry: Hot) -> None:
        with self._lock:
            was = self._entries.pop(session_id, None)
            if was is not None:
                self._unindex(session_id, was)
            self._entries[session_id] = entry
            if entry.ranges:
                self._starts[entry.ranges[0][:2]] = session_id
            while len(self._entries) > self.cap:
                self._unindex(*self._entries.popitem(last=False))

    def _unindex(self, session_id: str, entry: Hot) -> None:
        if entry.ranges and self._starts.get(entry.ranges[0][:2]) == session_id:
            del self._starts[entry.ranges[0][:2]]

    def page(self, session_id: str, window: Ranges) -> tuple[list[ev.Message] | None, bool]:
        """The messages of the page `window` of the session when they are kept, else None; and
        whether to keep them once read (the session's last page asked for was this one)."""
        with self._lock:
            found = self._pages.get(session_id)
            if found is not None and found[0] == window:
                self._pages.move_to_end(session_id)
                return found[1], True
            asked = self._asked
            if asked.get(session_id) == window:
                del asked[session_id]  # asked twice in a row: kept once read (`keep_page`)
                return None, True
            _put_bounded(asked, session_id, window, self.cap)
            return None, False

    def keep_page(self, session_id: str, window: Ranges, messages: list[ev.Message]) -> None:
        with self._lock:
            _put_bounded(self._pages, session_id, (window, messages), self.cap)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._starts.clear()
            self._pages.clear()
            self._asked.clear()


class Kept(Generic[_V]):
    """A least-recently-used map of session id to a value derived from its transcript (a
    context view), holding at most `cap`; safe to share between threads, as `HotTranscripts`."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _V] = OrderedDict()

    def get(self, session_id: str) -> _V | None:
        with self._lock:
            return self._entries.get(session_id)

    def put(self, session_id: str, value: _V) -> None:
        with self._lock:
            _put_bounded(self._entries, session_id, value, self.cap)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def _put_bounded(entries: OrderedDict[str, _V], key: str, value: _V, cap: int) -> None:
    """Set `key` as the most recently used entry, dropping the least recently used past `cap`."""
    entries[key] = value
    entries.move_to_end(key)
    while len(entries) > cap:
        entries.popitem(last=False)
