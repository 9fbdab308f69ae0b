"""One subscription to the log, fanned out to every open event stream of this process.

The log's callback runs on the committing thread (or the follower thread, when several worker
processes share the store); it encodes each event once and hands it to the event loop, which
offers it to the streams that want it. Each stream keeps at most `stream_buffer_events_max`
events; past that it is marked overflowed and its reader ends it with a resumable cursor, so a
slow consumer costs a bounded amount of memory. Must never block the committing thread.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

from eventlog import Envelope, Subscription, to_builtins
from eventlog.limits import check_at_most
from service import _limits
from sessions import SessionStore


def event_dict(envelope: Envelope, replayed: bool) -> dict[str, Any]:
    """An event as the API shows it (the Agents Protocol's Event shape)."""
    kind = "bearer_session" if type(envelope.data).stream_kind == "bearer" else "session"
    return {
        "id": envelope.position,
        "event": envelope.type,
        "resource": {"object": kind, "id": envelope.stream},
        "created_at": envelope.recorded_at.isoformat(),
        "sequence": envelope.version,
        "payload": to_builtins(envelope.data),
        "meta": to_builtins(envelope.meta),
        "hash": envelope.hash.hex(),
        "replayed": replayed,
    }


def frame(envelope: Envelope, replayed: bool) -> bytes:
    """One Server-Sent Events frame: `id` the position, `event` the kind, `data` the event."""
    data = json.dumps(event_dict(envelope, replayed), ensure_ascii=False, separators=(",", ":"))
    return f"id: {envelope.position}\nevent: {envelope.type}\ndata: {data}\n\n".encode()


def control_frame(kind: str, data: dict[str, Any], position: int | None = None) -> bytes:
    """A frame the service adds (error, overflow, shutdown): no log event behind it."""
    head = f"id: {position}\n" if position is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


class Stream:
    """The receiving end of one SSE connection."""

    __slots__ = ("buffer", "heartbeat_due", "overflowed", "session_id", "wake")

    def __init__(self, session_id: str | None) -> None:
        self.session_id = session_id
        self.buffer: deque[tuple[int, bytes]] = deque()
        self.wake = asyncio.Event()
        self.overflowed = False
        self.heartbeat_due = False

    def offer(self, position: int, data: bytes) -> None:
        if self.overflowed:
            return
        if len(self.buffer) >= _limits.stream_buffer_events_max:
            self.overflowed = True
            self.buffer.clear()  # the reader resumes from the log instead
        else:
            self.buffer.append((position, data))
        self.wake.set()


class Hub:
    """`hub.open(session_id or None)` registers a stream; `hub.close(stream)` drops it."""

    def __init__(
        self,
        store: SessionStore,
        *,
        follow: bool,
        poll_interval_s: float,
        heartbeat_interval_s: float = _limits.heartbeat_interval_s,
    ) -> None:
        self.store = store
        self.heartbeat_interval_s = heartbeat_interval_s
        self.follow = follow
        self.poll_interval_s = poll_interval_s
        self.draining = False
        self._by_session: dict[str, set[Stream]] = {}
        self._whole: set[Stream] = set()
        self._count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subscription: Subscription | None = None
        self._heartbeats: asyncio.Task[None] | None = None

    @property
    def open_count(self) -> int:
        return self._count

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._subscription = self.store.log.subscribe(
            self._on_commit, follow=self.follow, poll_interval_s=self.poll_interval_s
        )
        self._heartbeats = self._loop.create_task(self._beat())

    def stop(self) -> None:
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            self._heartbeats = None

    async def _beat(self) -> None:
        """One timer for every stream (a timer per stream costs on every event it waits for):
        each stream is asked for a heartbeat comment every `heartbeat_interval_s`."""
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            for stream in self._streams():
                stream.heartbeat_due = True
                stream.wake.set()

    def _streams(self) -> list[Stream]:
        return [*self._whole, *(s for group in self._by_session.values() for s in group)]

    def drain(self) -> None:
        """The server is stopping: every stream ends with a final event."""
        self.draining = True
        for stream in self._streams():
            stream.wake.set()

    def open(self, session_id: str | None) -> Stream:
        check_at_most(
            self._count + 1,
            _limits.streams_per_process_max,
            "streams_per_process_max",
            "open event streams",
        )
        stream = Stream(session_id)
        if session_id is None:
            self._whole.add(stream)
        else:
            self._by_session.setdefault(session_id, set()).add(stream)
        self._count += 1
        return stream

    def close(self, stream: Stream) -> None:
        group = (
            self._whole if stream.session_id is None else self._by_session.get(stream.session_id)
        )
        if group is not None and stream in group:
            group.discard(stream)
            self._count -= 1
            if stream.session_id is not None and not group:
                del self._by_session[stream.session_id]

    def _on_commit(self, envelope: Envelope) -> None:
        """On the committing thread: encode once, hand over, return at once."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if not self._whole and envelope.stream not in self._by_session:
            return  # a racy read of a dict is fine here: a stream opened meanwhile replays it
        loop.call_soon_threadsafe(
            self._fanout, envelope.stream, envelope.position, frame(envelope, False)
        )

    def _fanout(self, stream_name: str, position: int, data: bytes) -> None:
        for stream in self._whole:
            stream.offer(position, data)
        for stream in self._by_session.get(stream_name, ()):
            stream.offer(position, data)
