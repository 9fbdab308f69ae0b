"""The logs this process has open, by path: what fork() carried over, and what is open here now.

LMDB allows one environment per path per process and none across fork(); the log asks here before
it opens a store (or compacts one) whether this process already has it. Nothing here opens a file.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eventlog._log import EventLog

open_logs: weakref.WeakSet[EventLog] = weakref.WeakSet()


def _mark_forked() -> None:
    for log in list(open_logs):
        log._forked = True


os.register_at_fork(after_in_child=_mark_forked)

FORK_ADVICE = (
    "LMDB cannot use it, nor open the same store again, in a child made by fork(): open the "
    "store in the child only if the parent did not have it open when it forked (close it "
    "before starting the child), or start the child with multiprocessing's 'spawn' or "
    "'forkserver' start method"
)
"""What works after fork(). Dropping the inherited handle in the child is not offered: closing an
LMDB environment in a forked child frees the parent's reader slots in the shared lock file, so a
read the parent had in flight would lose its protection from the writer."""


def open_on(path: str | os.PathLike[str], *, forked: bool) -> EventLog | None:
    """An open log of this process on `path`: with `forked`, only one that fork() carried over
    from the parent."""
    wanted = os.path.realpath(path)
    for log in list(open_logs):
        where = getattr(log._storage, "path", None)
        if where is None or log._closed or (forked and not log._forked):
            continue
        if os.path.realpath(where) == wanted:
            return log
    return None
