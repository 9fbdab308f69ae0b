"""Pure folds from events to read models, persisted next to the log in the same transactions.

Imports only `eventlog`. `project` is the log's projector; the query functions read the state it
keeps; `rebuild` and `catch_up` recompute it from the log.
"""

from projections._check import check, verify, verify_files
from projections._fold import (
    SYSTEM_STREAM_PREFIX,
    apply,
    load_state,
    load_transcript,
    message_of,
    project,
    slice_ranges,
)
from projections._queries import (
    active_count,
    catch_up,
    check_current,
    child_ids,
    dump,
    iter_states,
    projected_position,
    ranges_added,
    ranges_window,
    read_messages,
    rebuild,
)
from projections._state import (
    ACTIVE,
    CLOSED,
    DELETED,
    LiveClient,
    SessionState,
    Transcript,
    idempotency_key,
)
from projections._tokens import (
    BEARER_STREAM_PREFIX,
    BearerRecord,
    bearer_stream,
    load_record,
)

__all__ = [
    "ACTIVE",
    "BEARER_STREAM_PREFIX",
    "BearerRecord",
    "CLOSED",
    "DELETED",
    "SYSTEM_STREAM_PREFIX",
    "LiveClient",
    "SessionState",
    "Transcript",
    "active_count",
    "apply",
    "bearer_stream",
    "catch_up",
    "check",
    "check_current",
    "child_ids",
    "dump",
    "idempotency_key",
    "iter_states",
    "load_record",
    "load_state",
    "load_transcript",
    "message_of",
    "project",
    "projected_position",
    "ranges_added",
    "ranges_window",
    "read_messages",
    "rebuild",
    "slice_ranges",
    "verify",
    "verify_files",
]
