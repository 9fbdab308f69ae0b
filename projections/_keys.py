"""Every key of the projection space, in one table: which prefix (or single key) holds what.

The folds (`_fold.py`, `_runtime.py`, `_context.py`, `_tokens.py`) take their keys from here, so
two of them can never pick overlapping prefixes unseen, and a reader of a raw store (a dump, the
projection check) can say what any key is.
"""

from __future__ import annotations

from eventlog import CLUSTER_PREFIX  # `@<stream>\0<suffix>`: `eventlog.cluster_key`

# Single keys.
POSITION_KEY = b"P"
"""Not stored (layout 7 keeps a position per stream, `FOLDED_SUFFIX`): what a transaction
remembers as the position the projection reflects, in its cache only."""
LAYOUT_KEY = b"V"
SEGMENT_COUNTER_KEY = b"#seg"
ACTIVE_COUNT_KEY = b"n/active"
RUNTIME_OPEN_COUNT_KEY = b"rt/n"
RUNTIME_USAGE_KEY = b"rt/u"
KEY_SLOT_KEY = b"k/slot"

# Prefixes, each followed by what the table says.
STATE_PREFIX = b"h/"
TRANSCRIPT_SUFFIX = b"t"
FOLDED_SUFFIX = b"P"
REF_PREFIX = b"g/"
CHILD_PREFIX = b"c/"
IDEMPOTENCY_PREFIX = b"i/"
BEARER_PREFIX = b"b/"
PRUNE_PREFIX = b"cx/p/"
PRUNE_VERSION_PREFIX = b"cx/v/"
RUNTIME_STATE_PREFIX = b"rt/s/"
RUNTIME_LOOP_PREFIX = b"rt/l/"
RUNTIME_LOOP_ID_PREFIX = b"rt/i/"
RUNTIME_REQUEST_PREFIX = b"rt/r/"
RUNTIME_OPEN_PREFIX = b"rt/o/"
RUNTIME_BUSY_PREFIX = b"rt/b/"

KEYS: dict[bytes, str] = {
    LAYOUT_KEY: "the layout version of this key space (`_state.LAYOUT_VERSION`)",
    SEGMENT_COUNTER_KEY: "the last reference segment number handed out (8)",
    ACTIVE_COUNT_KEY: "the number of active sessions (8)",
    RUNTIME_OPEN_COUNT_KEY: "the number of open runtime sessions (8)",
    RUNTIME_USAGE_KEY: "token usage summed over every runtime loop of the store",
    KEY_SLOT_KEY: "the highest keyring slot a session's opening names (8)",
}
"""The single keys, and what each holds."""

KEY_PREFIXES: dict[bytes, str] = {
    STATE_PREFIX: "h/<sid>: the SessionState of a session",
    CLUSTER_PREFIX: (
        "@<stream>\\0P: the position of the stream's last event folded in (8); "
        "@<sid>\\0t: the Transcript (reference ranges, the chunk being filled) of a session"
    ),
    REF_PREFIX: "g/<segment:8><chunk:4>: a chunk of packed message references",
    CHILD_PREFIX: "c/<parent>\\0<position:8>: a child (fork) of a session",
    IDEMPOTENCY_PREFIX: "i/<sid>\\0<key>: the position of a command that carried this key",
    BEARER_PREFIX: "b/<handle>: the BearerRecord of a bearer token",
    PRUNE_PREFIX: "cx/p/<sid>\\0<generation:4>...: a pruned tool result of the context view",
    PRUNE_VERSION_PREFIX: "cx/v/<sid>: the session version the pruning was folded up to (8)",
    RUNTIME_STATE_PREFIX: "rt/s/<sid>: the RuntimeState of a runtime session",
    RUNTIME_LOOP_PREFIX: "rt/l/<sid>\\0<position:8>: the LoopRecord of a prompt",
    RUNTIME_LOOP_ID_PREFIX: (
        "rt/i/<sid>\\0<loop_id>: the position of that loop's prompt (8); an encrypted "
        "session's loop id is its keyed digest, as its events hold it"
    ),
    RUNTIME_REQUEST_PREFIX: (
        "rt/r/<sid>\\0<request_id>: the position of that request's prompt (8); an encrypted "
        "session's request id is its keyed digest, as its events hold it"
    ),
    RUNTIME_OPEN_PREFIX: "rt/o/<sid>: present while a runtime session is open",
    RUNTIME_BUSY_PREFIX: "rt/b/<sid>: present while a prompt is in flight",
}
"""The key prefixes, and what a key under each holds."""


def kind_of(key: bytes) -> str | None:
    """The table entry `key` belongs to (a single key or a prefix, as text); None for a key that
    no projection writes."""
    if key in KEYS:
        return key.decode()
    for prefix in KEY_PREFIXES:
        if key.startswith(prefix):
            return prefix.decode()
    return None
