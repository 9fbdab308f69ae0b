"""Checking the stored projections against the log they are folded from.

The log carries a hash chain; the projection state beside it does not, so a changed, added or
deleted projection key (a revived token, a rewritten prompt, a flipped bit in a key) would pass the
chain check. `check` rebuilds every projection from the log into scratch space, on the same
snapshot, and compares the two key spaces key by key. It only reads the store.

`verify` is the log's check and this one together; on LMDB it runs as `python -m projections._check
PATH` in a child process (see `eventlog/_walk.py`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterator

from eventlog import (
    CLUSTER_PREFIX,
    EventLog,
    InvalidArgumentError,
    LogView,
    VerifyReport,
)
from eventlog._walk import child_main, walk_here
from projections import _keys as keys
from projections import _kv
from projections._queries import _rebuild_in, projected_position

# Keys compared per scan: bounds the memory of one step of the comparison.
_SCAN_KEYS = 4096


def check(
    log: EventLog, *, progress: Callable[[int, int], object] | None = None
) -> tuple[int, str | None]:
    """Rebuild the projections from the log and compare them with the stored ones. Returns the
    number of keys compared and the first difference (None when they are equal)."""
    with log.scratch() as (stored, rebuilt):
        _rebuild_in(rebuilt, progress)
        compared = 0
        expected_keys = _keys(rebuilt)
        for key, value in _keys(stored):
            expected = next(expected_keys, None)
            if expected is None or expected[0] > key:
                return (
                    compared,
                    f"projection key {_show(key)} is stored but not derived from the log",
                )
            if expected[0] < key:
                return compared, (
                    f"projection key {_show(expected[0])} is derived from the log but missing "
                    "from the store"
                )
            if expected[1] != value:
                return compared, _changed(stored, key, value, expected[1])
            compared += 1
        extra = next(expected_keys, None)
        if extra is not None:
            return compared, (
                f"projection key {_show(extra[0])} is derived from the log but missing from the "
                "store"
            )
    return compared, None


def _keys(view: LogView) -> Iterator[tuple[bytes, bytes]]:
    start = b""
    while True:
        page = _kv.scan(view, start=start, limit=_SCAN_KEYS)
        yield from page
        if len(page) < _SCAN_KEYS:
            return
        start = page[-1][0] + b"\x00"


def _changed(stored: LogView, key: bytes, value: bytes, expected: bytes) -> str:
    if key.startswith(CLUSTER_PREFIX) and key.endswith(b"\x00" + keys.FOLDED_SUFFIX):
        behind = projected_position(stored)
        return (
            f"projection key {_show(key)} differs: the projections reflect position {behind}, "
            f"the log's head is {stored.head}: they are behind the log (the next writable open "
            "catches them up) or were changed"
        )
    return (
        f"projection key {_show(key)} holds {len(value)} bytes that differ from the "
        f"{len(expected)} the log derives"
    )


def _show(key: bytes) -> str:
    return repr(key[:120]) + ("..." if len(key) > 120 else "")


def verify(log: EventLog, *, progress: Callable[[int, int], object] | None = None) -> VerifyReport:
    """`log.verify()`, then `check` of the projections: one report. An LMDB log is walked in a
    child process, where a damaged page that makes LMDB abort cannot take the caller down. A
    truncated log (`anchor_position` > 0) cannot rebuild them: they are left unchecked
    (`projection_keys_checked` None)."""
    where = log.path
    if where is not None:
        return EventLog.walk_isolated(_MODULE, [str(where)], progress, log.description)
    return _verify_here(log, progress)


def verify_files(
    path: str | os.PathLike[str], *, progress: Callable[[int, int], object] | None = None
) -> VerifyReport:
    """`verify` of the LMDB store in directory `path` without opening it in this process."""
    if not os.path.isdir(path):
        raise InvalidArgumentError(f"verify: no store at `{path}`")
    return EventLog.walk_isolated(_MODULE, [os.path.abspath(path)], progress, f"lmdb:{path}")


def _verify_here(log: EventLog, progress: Callable[[int, int], object] | None) -> VerifyReport:
    report = walk_here(log, progress)
    if not report.ok:
        return report
    if report.anchor_position:
        # A truncated log no longer holds what the projections were folded from: there is
        # nothing to rebuild them from, so they are not checked (projection_keys_checked None).
        return report
    compared, problem = check(log)
    return dataclasses.replace(
        report, ok=problem is None, problem=problem, projection_keys_checked=compared
    )


_MODULE = "projections._check"


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:], _verify_here))
