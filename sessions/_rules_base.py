"""What every rule of the `sessions.testing` state machine stands on: the store and the model it
drives side by side, picking an open session, and the checks that a call was refused, or changed
nothing, without writing. The rule mixins and `SessionMachine` share it; it holds no rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from hypothesis import strategies as st

from eventlog import InvalidArgumentError

if TYPE_CHECKING:
    from sessions._model import SessionModel
    from sessions._store import SessionStore

_T = TypeVar("_T")
PICK = st.integers(min_value=0, max_value=1_000)
"""Which open session a rule acts on, as an index taken modulo their number (see `pick_open`)."""


def has_open(machine: Any) -> bool:
    """A rule's precondition: the model has an open session to pick."""
    return bool(machine.model.open_ids())


class RulesBase:
    """The store under test and the model it must agree with, and the helpers rules use."""

    store: SessionStore
    model: SessionModel

    def pick_open(self, pick: int) -> str:
        open_ids = self.model.open_ids()
        if not open_ids:
            raise AssertionError("pick_open needs an open session: guard the rule with one")
        return open_ids[pick % len(open_ids)]

    def expect_refused(
        self,
        error: type[BaseException] | tuple[type[BaseException], ...],
        call: Callable[[], object],
    ) -> BaseException:
        """Run `call`, which must raise `error` and leave the log exactly as it was."""
        head = self.store.log.head
        try:
            call()
        except error as exc:
            if self.store.log.head != head:
                raise AssertionError(
                    f"refused call wrote: head {head} -> {self.store.log.head}"
                ) from exc
            return exc
        raise AssertionError(f"expected {error} to be raised")

    def _expect_no_write(self, call: Callable[[], _T]) -> _T:
        head = self.store.log.head
        result = call()
        if self.store.log.head != head:
            raise AssertionError(
                f"a call that changes nothing wrote: {head} -> {self.store.log.head}"
            )
        return result

    def expect_equal(self, what: str, got: object, expected: object) -> None:
        """`got`, what the store answered to `what`, must equal what the model expected."""
        if got != expected:
            raise AssertionError(f"{what} returned {got}, expected {expected}")

    def refuses_unknown_client(self, sid: str, client: str, call: Callable[[], object]) -> bool:
        """True when `client` is not attached to `sid` in the model, after checking that the store
        refuses `call` for it without writing."""
        if client in self.model.clients(sid):
            return False
        self.expect_refused(InvalidArgumentError, call)
        return True
