"""One runtime per store: the `runtime` lease a runtime holds on its stores while it runs.

A second runtime on a store whose runtime still lives is refused (`LeaseHeldError`) before it
touches anything, so it can never fail the first one's live prompts as interrupted. The lease
ends with its holder's process however that ends (`EventLog.lease`), so a runtime that gets it
knows that every prompt still recorded in flight has no one left to finish it.
"""

from __future__ import annotations

from eventlog import Lease
from sessions._store import SessionStore

LEASE_NAME = "runtime"


class RuntimeLease:
    """The `runtime` leases of a runtime's stores: taken all together or not at all."""

    def __init__(self) -> None:
        self.held: list[Lease] = []

    def hold(self, *stores: SessionStore) -> None:
        if self.held:
            return
        try:
            for store in stores:
                self.held.append(store.log.lease(LEASE_NAME))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        while self.held:
            self.held.pop().release()
