"""Past states of the store (`SessionStore.as_of`) for the routes that show one: the API's
`?as_of=` and a fork's `at_event_id`, the viewer's `as_of` and `version`.

Owns the one bound on how many are rebuilt at once in this process (`past_rebuilds_max`), shared
by every such route: a rebuild folds the log up to its position in memory on a worker thread. A
request past the bound is refused at once (503 `busy`, `Retry-After`), never queued.
"""

from __future__ import annotations

import threading

from eventlog.limits import check_at_most
from service import _limits
from service._problems import HTTPProblem
from sessions import SessionStore


class PastRebuilds:
    """`rebuild(store, position, what)`: the store as it was right after `position`, within
    `as_of_position_max`, while fewer than `rebuilds_max` rebuilds run."""

    def __init__(self, rebuilds_max: int) -> None:
        self.rebuilds_max = rebuilds_max
        self.slots = threading.BoundedSemaphore(rebuilds_max)
        """One per rebuild running; taken without waiting, given back when it ends."""

    def rebuild(self, store: SessionStore, position: int, what: str) -> SessionStore:
        check_at_most(position, _limits.as_of_position_max, "as_of_position_max", what)
        if not self.slots.acquire(blocking=False):
            raise self._busy(position, what)
        try:
            return store.as_of(position)
        finally:
            self.slots.release()

    def _busy(self, position: int, what: str) -> HTTPProblem:
        wait_s = _limits.past_rebuild_retry_after_s
        return HTTPProblem(
            503,
            "busy",
            f"{what}: {self.rebuilds_max} past states are being rebuilt, as many as "
            f"past_rebuilds_max allows at once; ask for log position {position} again in "
            f"{wait_s} s",
            headers={"retry-after": str(wait_s)},
            limit_name="past_rebuilds_max",
            limit=self.rebuilds_max,
        )
