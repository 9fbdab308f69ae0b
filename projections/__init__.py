"""Pure folds from events to read models, persisted next to the log in the same transactions.

Imports only `eventlog`. `project` is the log's projector; the query functions read the state it
keeps; `rebuild` and `catch_up` recompute it from the log.
"""

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
    child_ids,
    dump,
    iter_states,
    projected_position,
    read_messages,
    rebuild,
)
from projections._state import ACTIVE, CLOSED, DELETED, LiveClient, SessionState, Transcript

__all__ = [
    "ACTIVE",
    "CLOSED",
    "DELETED",
    "SYSTEM_STREAM_PREFIX",
    "LiveClient",
    "SessionState",
    "Transcript",
    "active_count",
    "apply",
    "catch_up",
    "child_ids",
    "dump",
    "iter_states",
    "load_state",
    "load_transcript",
    "message_of",
    "project",
    "projected_position",
    "read_messages",
    "rebuild",
    "slice_ranges",
]
