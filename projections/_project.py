"""The log's projector: `project(tx, envelopes)` folds each append into the projection state in
the same transaction (the fold itself is `projections/_fold.py`), after any committed events the
projection has not seen yet, and records the position the projection reflects."""

from __future__ import annotations

from eventlog import Envelope, Transaction
from projections import _keys as keys
from projections import _kv
from projections._fold import apply, apply_runs
from projections._queries import catch_up_before, note_folded, projected_position


def project(tx: Transaction, envelopes: list[Envelope]) -> None:
    """Apply `envelopes` (just appended, in order) to the projection state in `tx`, after any
    events before them that the projection has not seen (`catch_up_before`). With none, as a
    write transaction starts after another writer's commit, only catch up: a command then decides
    on every committed event, those a bare `EventLog` appended included. Only a transaction that
    starts from another process's commit reads the position the projection reflects; one that
    follows this process's own commit has it cached."""
    first = envelopes[0].position if envelopes else tx.head + 1
    state = _kv.pending(tx)
    done = None if state is None else state.cache.get(keys.POSITION_KEY)
    if done is None:
        done = projected_position(tx, below=first - 1)
        _kv.remember(tx, keys.POSITION_KEY, done, 0)
    if done != first - 1:
        catch_up_before(tx, done, first)
    if not envelopes:
        # A fold of its own (`EventLog._begin_outermost` commits it apart when it wrote): its
        # deferred values are put now, so a command refused after it does not take it back.
        _kv.flush(tx)
        return
    if len(envelopes) == 1:
        apply(tx, envelopes[0])
    else:
        apply_runs(tx, envelopes)
    note_folded(tx, envelopes)
