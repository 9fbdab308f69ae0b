"""A gate for resizing a memory map: only when no transaction of this process is open.

LMDB requires that `mdb_env_set_mapsize` run while this process has no transaction open. The gate
counts them; `exclusive` waits for the count to drop to the caller's own and keeps new ones out
while it runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


class Gate:
    """Counts this process's open transactions so the map is only resized when there are none,
    which is what LMDB requires of `mdb_env_set_mapsize`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._resizing = False

    def enter(self) -> None:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._active += 1

    def leave(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def exclusive(self, action: Callable[[], _T], *, own: int = 0) -> _T:
        """Run `action` when only `own` transactions (the caller's) are open."""
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            try:
                while self._active > own:
                    self._cond.wait()
                return action()
            finally:
                self._resizing = False
                self._cond.notify_all()
