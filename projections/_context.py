"""The context projection: which tool results a session's context view shows pruned, and reading a
transcript's tail with the reference of each message.

Prune decisions are kept per session incarnation and per message reference, so a fork, a reset or a
reopened id never sees decisions made for another incarnation. Checkpoints need no keys: they are
messages of the transcript (see `_fold._checkpoint`). Pure folds; no clock, no policy, no model.

Keys: ``cx/p/<sid>\\0<generation:4><position:8><index:2>`` -> `PrunedResult`;
``cx/v/<sid>`` -> the stream version of the session's last `context_pruned` event (8 bytes).
"""

from __future__ import annotations

from eventlog import Envelope, LogView, StructCodec, Transaction
from eventlog import events as ev
from projections import _keys as keys
from projections import _kv
from projections import _state as st

PRUNE_PREFIX = keys.PRUNE_PREFIX
PRUNE_VERSION_PREFIX = keys.PRUNE_VERSION_PREFIX
PRUNED_CODEC = StructCodec(ev.PrunedResult, "pruned result")

Ref = tuple[int, int]
_INDEX_MAX = 2**16 - 1  # a message's index inside its event, as a reference key holds it


def prune_prefix(session_id: str, generation: int) -> bytes:
    return PRUNE_PREFIX + session_id.encode() + b"\x00" + generation.to_bytes(4, "big")


def prune_key(session_id: str, generation: int, position: int, index: int) -> bytes:
    return prune_prefix(session_id, generation) + st.REF_FORMAT.pack(position, index)


def prune_version_key(session_id: str) -> bytes:
    return PRUNE_VERSION_PREFIX + session_id.encode()


def apply_pruned(tx: Transaction, transcript: st.Transcript, envelope: Envelope) -> st.Transcript:
    """Record each decision of a `context_pruned` event; the transcript itself is unchanged."""
    data = envelope.data
    assert isinstance(data, ev.ContextPruned)
    raw = _kv.get(tx, st.state_key(envelope.stream))
    if raw is None:
        return transcript
    generation = st.STATE_CODEC.decode(raw).generation
    for result in data.results:
        if not (0 < result.position < envelope.position and 0 <= result.index <= _INDEX_MAX):
            continue  # names no message that can exist: nothing to show pruned
        key = prune_key(envelope.stream, generation, result.position, result.index)
        _kv.put(tx, key, PRUNED_CODEC.encode(result))
    _kv.put(tx, prune_version_key(envelope.stream), envelope.version.to_bytes(8, "big"))
    return transcript


def prune_version(view: LogView, session_id: str) -> int:
    """The version of the session's last `context_pruned` event (0 when there is none)."""
    value = _kv.get(view, prune_version_key(session_id))
    return int.from_bytes(value, "big") if value else 0


def load_prunes(
    view: LogView, session_id: str, generation: int, *, from_position: int = 0
) -> dict[Ref, ev.PrunedResult]:
    """The prune decisions of a session incarnation for messages at `from_position` or later."""
    prefix = prune_prefix(session_id, generation)
    start = prefix + st.REF_FORMAT.pack(from_position, 0)
    found: dict[Ref, ev.PrunedResult] = {}
    for key, value in _kv.scan(view, prefix, start=start):
        position, index = st.REF_FORMAT.unpack(key[len(prefix) :])
        found[(position, index)] = PRUNED_CODEC.decode(value)
    return found
