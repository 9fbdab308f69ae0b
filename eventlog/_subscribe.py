"""Subscriptions: committed events delivered to callbacks in commit order, and the tail.

`Subscriptions` keeps the subscribers of one log and delivers each commit to them after it is
durable, in commit order, even when a subscriber appends; a `Subscription` with `follow` reads
every commit of every process on a thread of its own through `tail`. Neither holds the log: they
are handed the reads and the wake-up they need.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator

from eventlog import limits
from eventlog._codec import Envelope
from eventlog.errors import LogClosedError, SessionLogError

logger = logging.getLogger("sessionlog.eventlog")

ReadPage = Callable[[int, int], list[Envelope]]
"""`read(after, limit)`: up to `limit` committed events after position `after`."""


class Subscription:
    """A live feed of committed events to one callback; `close()` (or `with`) unsubscribes."""

    def __init__(
        self,
        callback: Callable[[Envelope], object],
        stream: str | None,
        on_error: Callable[[BaseException, Envelope], object] | None,
        read: ReadPage,
        wait: Callable[[float], None],
        on_close: Callable[[Subscription], None],
    ) -> None:
        self._read = read
        self._wait = wait
        self._on_close = on_close
        self._callback = callback
        self._stream = stream
        self._on_error = on_error
        self.last_position = 0
        self.errors = 0
        self.active = True
        self._thread: threading.Thread | None = None

    def _offer(self, envelope: Envelope) -> None:
        if not self.active or envelope.position <= self.last_position:
            return
        self.last_position = envelope.position
        if self._stream is not None and envelope.stream != self._stream:
            return
        try:
            self._callback(envelope)
        except Exception as exc:  # a subscriber's bug must not break the log or other subscribers
            self.errors += 1
            if self._on_error is not None:
                try:
                    self._on_error(exc, envelope)
                except Exception:  # the same: the commit is durable, the others must still hear
                    logger.exception(
                        "on_error of subscriber %r failed on event %d",
                        self._callback,
                        envelope.position,
                    )
            else:
                logger.exception(
                    "subscriber %r failed on event %d", self._callback, envelope.position
                )

    def _follow(self, poll_interval_s: float) -> None:
        """Start a thread that reads every commit, by any process or machine, in position order
        and hands each to the callback: the log is the source, a wake-up only shortens the wait."""

        def run() -> None:
            try:
                for envelope in tail(
                    self._read,
                    self._wait,
                    after=self.last_position,
                    follow=True,
                    poll_interval_s=poll_interval_s,
                    stop=lambda: not self.active,
                ):
                    if not self.active:
                        return
                    self._offer(envelope)
            except LogClosedError:
                self.active = False  # the log was closed under the subscription: it ends
            except Exception:  # reported: a follower must not die silently
                self.active = False
                logger.exception("following subscription of %r stopped", self._callback)

        self._thread = threading.Thread(target=run, name="sessionlog-subscription", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self.active:
            self.active = False
            self._on_close(self)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tail(
    read: ReadPage,
    wait: Callable[[float], None],
    *,
    after: int = 0,
    stream: str | None = None,
    follow: bool = False,
    poll_interval_s: float = 0.05,
    stop: Callable[[], bool] | None = None,
) -> Iterator[Envelope]:
    """Events after `after` (of `stream`, or all), a page at a time; with `follow`, waits for new
    ones with `wait(poll_interval_s)` until `stop()` is true."""
    while True:
        page = read(after, limits.read_page_events_default)
        for envelope in page:
            if stream is None or envelope.stream == stream:
                yield envelope
        if page:
            after = page[-1].position
            continue
        if not follow or (stop is not None and stop()):
            return
        # A server backend wakes us when any machine commits; the interval stays the bound.
        wait(poll_interval_s)


class Subscriptions:
    """The subscribers of one log, and the delivery of its commits to them in commit order."""

    def __init__(self, read: ReadPage) -> None:
        self.live: list[Subscription] = []
        self.followers: list[Subscription] = []  # subscriptions with a reading thread
        self._read = read
        self._queue: deque[Envelope | range] = deque()
        self._delivering = False

    def remove(self, subscription: Subscription) -> None:
        for kept in (self.live, self.followers):
            if subscription in kept:
                kept.remove(subscription)

    def deliver(self, pending: list[Envelope], count: int, head: int) -> None:
        """Offer the `count` events a commit ending at `head` appended to every live subscriber:
        `pending` when it holds them all, else read back from the log when their turn comes."""
        if not self.live or not count:
            return
        if len(pending) == count:
            self._queue.extend(pending)
        else:  # too many to have kept: read back from the log, a page at a time
            self._queue.append(range(head - count + 1, head + 1))
        if self._delivering:  # a subscriber appended: the outer loop delivers in order
            return
        self._delivering = True
        try:
            while self._queue:
                item = self._queue.popleft()
                if isinstance(item, range):
                    try:
                        self._queue.extendleft(reversed(self._read_back(item)))
                    except SessionLogError:  # the commit is durable: report, never undo it
                        logger.exception("committed events %s could not be read back", item)
                    continue
                for subscription in list(self.live):
                    subscription._offer(item)
        finally:
            self._delivering = False

    def _read_back(self, positions: range) -> list[Envelope | range]:
        """The first page of committed `positions`, then the rest of them."""
        limit = min(len(positions), limits.read_page_events_default)
        page: list[Envelope | range] = list(self._read(positions.start - 1, limit))
        if len(positions) > limit:
            page.append(positions[limit:])
        return page
