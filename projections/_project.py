"""The log's projector: `project(tx, envelopes)` folds each append into the projection state in
the same transaction (the fold itself is `projections/_fold.py`), after any committed events the
projection has not seen yet, and records the position the projection reflects."""

from __future__ import annotations

from eventlog import Envelope, IntegrityError, Transaction, limits
from projections import _keys as keys
from projections import _kv
from projections._fold import apply, apply_runs


def project(tx: Transaction, envelopes: list[Envelope]) -> None:
    """Apply `envelopes` (just appended, in order) to the projection state in `tx`, after any
    events before them that the projection has not seen (`_fold_gap`)."""
    done = _kv.cached(tx, keys.POSITION_KEY, _from_int8) or 0
    if done != envelopes[0].position - 1:
        _fold_gap(tx, done, envelopes[0].position)
    if len(envelopes) == 1:
        apply(tx, envelopes[0])
    else:
        apply_runs(tx, envelopes)
    _kv.defer(tx, keys.POSITION_KEY, envelopes[-1].position, _int8)


def _fold_gap(tx: Transaction, done: int, first: int) -> None:
    """Apply the committed events after `done` and before `first`: appended by a process that
    wrote to the log without this projector (a bare `EventLog`) while a store was open on it.
    The store's next commit lands here, and folds them before its own events, so the projection
    never skips them (nor marks them seen with its position). Only a transaction that starts
    from another process's commit reads the position to compare; one that follows this process's
    own commit has it cached."""
    if done > first - 1:
        raise IntegrityError(
            f"the projection reflects position {done}, but the log before this commit ends at "
            f"{first - 1}",
            first,
        )
    position = max(done, tx.anchor[0])  # what a truncation took away cannot be folded
    while position < first - 1:
        page = tx.read(after=position, limit=min(limits.read_page_events_max, first - 1 - position))
        before = [envelope for envelope in page if envelope.position < first]
        for envelope in before:
            apply(tx, envelope)
        if len(before) < len(page) or not before:
            return  # the rest of the log is this commit's (a truncated log starts past `done`)
        position = before[-1].position


def _from_int8(data: bytes) -> int:
    return int.from_bytes(data, "big")


def _int8(value: int) -> bytes:
    return value.to_bytes(8, "big")
