"""Pure folds from events to read models, persisted next to the log in the same transactions.

Imports only `eventlog`. `project` is the log's projector; the query functions read the state it
keeps (sessions, their transcripts, children, bearer tokens, the runtime's records, the context
view's prunes); `rebuild` and `catch_up` recompute it from the log. `KEY_PREFIXES` and `KEYS` are
the one table of what the projection key space holds.
"""

from projections._check import check, verify, verify_files
from projections._context import load_prunes, prune_version
from projections._context_read import Ref, is_checkpoint, read_span, read_tail
from projections._fold import (
    SYSTEM_STREAM_PREFIX,
    apply,
    highest_key_slot,
    load_session,
    load_state,
    load_transcript,
)
from projections._keys import KEY_PREFIXES, KEYS, kind_of
from projections._loop_usage import LoopUsage, loop_usage
from projections._project import project
from projections._queries import (
    active_count,
    catch_up,
    check_current,
    child_ids,
    dump,
    first_referenced_position,
    iter_scratchpads,
    iter_states,
    iter_transcripts,
    projected_position,
    ranges_added,
    ranges_shared,
    ranges_window,
    read_messages,
    rebuild,
)
from projections._refs import Opener, message_of, slice_ranges
from projections._runtime import BUSY as RUNTIME_BUSY
from projections._runtime import (
    CONTEXT_LENGTH,
    TRANSIENT,
    LoopRecord,
    RuntimeState,
    busy_ids,
    load_loop,
    load_loops,
    load_runtime,
    open_runtime_count,
    open_runtime_ids,
    total_usage,
)
from projections._runtime import FAILED as RUNTIME_FAILED
from projections._state import (
    ACTIVE,
    CLOSED,
    DELETED,
    LiveClient,
    SessionState,
    StateScratchpad,
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
    "Opener",
    "ACTIVE",
    "BEARER_STREAM_PREFIX",
    "BearerRecord",
    "CLOSED",
    "CONTEXT_LENGTH",
    "DELETED",
    "KEYS",
    "KEY_PREFIXES",
    "LiveClient",
    "LoopRecord",
    "LoopUsage",
    "RUNTIME_BUSY",
    "RUNTIME_FAILED",
    "Ref",
    "RuntimeState",
    "SYSTEM_STREAM_PREFIX",
    "TRANSIENT",
    "SessionState",
    "StateScratchpad",
    "Transcript",
    "active_count",
    "highest_key_slot",
    "apply",
    "bearer_stream",
    "busy_ids",
    "catch_up",
    "check",
    "check_current",
    "child_ids",
    "dump",
    "first_referenced_position",
    "idempotency_key",
    "is_checkpoint",
    "iter_scratchpads",
    "iter_states",
    "iter_transcripts",
    "kind_of",
    "load_loop",
    "load_loops",
    "load_prunes",
    "load_record",
    "load_runtime",
    "load_session",
    "load_state",
    "load_transcript",
    "loop_usage",
    "message_of",
    "open_runtime_count",
    "open_runtime_ids",
    "project",
    "projected_position",
    "prune_version",
    "ranges_added",
    "ranges_shared",
    "ranges_window",
    "read_messages",
    "read_span",
    "read_tail",
    "rebuild",
    "slice_ranges",
    "total_usage",
    "verify",
    "verify_files",
]
