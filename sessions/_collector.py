"""Pausing the cyclic garbage collector around work that builds many objects and no cycles."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Build without the cyclic garbage collector: while many objects are made and kept (an
    export's copy, an agent log's batches, a listing of thousands of sessions) it walks them again
    and again, and every heap object besides once they count as long-lived, to find nothing to
    free, since nothing built there holds a cycle. It is restored as it was, whatever happens."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
