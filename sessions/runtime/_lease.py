"""One runtime per store: the `runtime` lease a runtime holds on its stores while it runs.

A second runtime on a store whose runtime still lives is refused (`LeaseHeldError`) before it
touches anything, so it can never fail the first one's live prompts as interrupted. The lease
ends with its holder's process however that ends (`EventLog.lease`), so a runtime that gets it
knows that every prompt still recorded in flight has no one left to finish it.

On PostgreSQL a lease can also end under a live holder: its connection drops and the server lets
the lock go, and another runtime may take it and fail this one's prompts as interrupted. So while
it runs, the runtime asks every `CHECK_S` seconds whether it still holds its leases; once one is
lost it cancels its prompts and refuses every write (`LeaseLostError`). Stop it; a new `Runtime`
on the store starts once the lease is free, and fails the cancelled prompts as interrupted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from eventlog import Lease, LeaseLostError
from sessions._store import SessionStore

LEASE_NAME = "runtime"
CHECK_S = 5.0
"""How often a running runtime asks whether it still holds its leases. With the lease
connection's keepalives (about 25 s to notice a vanished peer), a runtime that lost its lease
stops within about half a minute, and within `CHECK_S` of a drop the server reported."""
ANSWER_S = 15.0
"""How long a check may go unanswered before the runtime takes its leases for lost. A check on a
connection whose peer vanished (a network partition) waits until TCP gives up, many minutes,
while the server lets the lease go about 25 s after the connection fell silent; the runtime must
stop before that, not after."""
logger = logging.getLogger("sessionlog.runtime")


class _Prompt(Protocol):
    def cancel(self, reason: str) -> None: ...


class RuntimeLease:
    """The `runtime` leases of a runtime's stores: taken all together or not at all."""

    def __init__(self) -> None:
        self.held: list[Lease] = []
        self._watcher: asyncio.Task[None] | None = None

    def hold(self, *stores: SessionStore) -> None:
        if self.held:
            return
        try:
            for store in stores:
                self.held.append(store.log.lease(LEASE_NAME))
        except BaseException:
            self.release()
            raise

    def watch(self, prompts: Mapping[str, _Prompt]) -> None:
        """Check the leases every `CHECK_S` seconds, off the event loop; once one is lost, cancel
        every prompt of `prompts` then in flight (reason ``lease_lost``) and stop checking."""
        if self._watcher is None and self.held:
            self._watcher = asyncio.create_task(self._watch(prompts))

    async def _watch(self, prompts: Mapping[str, _Prompt]) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                await asyncio.wait_for(asyncio.to_thread(self.check), ANSWER_S)
                continue
            except TimeoutError:  # no answer: the connection, and the lease, may be gone
                exc = self._unanswered()
            except LeaseLostError as lost:
                exc = lost
            logger.error("%s: cancelling every prompt and refusing writes", exc)
            for prompt in list(prompts.values()):
                prompt.cancel("lease_lost")
            return

    def _unanswered(self) -> LeaseLostError:
        """Take every held lease for lost: a check of them went unanswered for `ANSWER_S`."""
        for lease in self.held:
            lease.lost = True
        return LeaseLostError(self.held[0].name, self.held[0].where)

    def check(self) -> None:
        """`LeaseLostError` once any held lease is lost (a round trip per PostgreSQL lease)."""
        for lease in list(self.held):
            lease.check()

    def lost(self) -> None:
        """`LeaseLostError` when a lease was found lost already (asks nothing)."""
        for lease in self.held:
            if lease.lost:
                raise LeaseLostError(lease.name, lease.where)

    def release(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        while self.held:
            self.held.pop().release()
