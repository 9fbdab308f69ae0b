"""The runtime projection: each runtime session's status, its loop records and its token usage,
folded from the prompt lifecycle events in the same transaction as their append.

A session is a runtime session when the metadata it was opened with names a `provider` (what
`sessions.runtime.Runtime.create` writes); other sessions get no records here. Like the session
fold, every function is total and reads no clock: an event that does not fit the current state (a
completion for a request that is not in flight) changes nothing, so a rebuild never fails half way.

Key layout (see the table in `_keys.py`):
  rt/s/<sid>                  RuntimeState of the session's current incarnation
  rt/l/<sid>\\0<position:8>    LoopRecord of the prompt started at that log position
  rt/i/<sid>\\0<loop_id>       that position (8), by loop id as its events hold it (a keyed
                              digest in an encrypted session, as for request ids)
  rt/r/<sid>\\0<request_id>    the position (8) of the request's `prompt_started`, by request id
                              as its events hold it (an encrypted session's: a keyed digest)
  rt/o/<sid>                  present while the runtime session is open (what `reap` scans)
  rt/b/<sid>                  present while a prompt is in flight (what crash recovery scans)
  rt/n                        number of open runtime sessions (8)
  rt/u                        Usage summed over every loop of the store
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import msgspec

from eventlog import Envelope, LogView, StructCodec, Transaction, limits
from eventlog import events as ev
from projections import _keys as keys
from projections import _kv
from projections import _state as st
from projections._loop_usage import LoopUsage, loop_usage

ACTIVE = "active"
BUSY = "busy"
IDLE = "idle"
FAILED = "failed"

RUNNING = "running"
COMPLETED = "completed"
CANCELLED = "cancelled"

_STATE = keys.RUNTIME_STATE_PREFIX
_LOOP = keys.RUNTIME_LOOP_PREFIX
_LOOP_ID = keys.RUNTIME_LOOP_ID_PREFIX
_REQUEST = keys.RUNTIME_REQUEST_PREFIX
KEYED_LOOP_ID = "keyed_loop_id"
"""The key of a `parent_spawn_ref` naming the parent's loop as the parent's loop index holds it
(by its keyed digest, for an encrypted parent's loop)."""
SEALED_TOOL_CALL_ID = "sealed_tool_call_id"
"""The key of an encrypted child's `parent_spawn_ref` (and of the parent loop's reference to
the child) holding the tool call id's text, sealed under the child's key."""
CONTEXT_LENGTH = "context_length"
"""The `prompt_failed` kind of a provider's refusal of the context as too long."""
TRANSIENT = "transient"
"""The `prompt_failed` kind of a provider failure that may pass (rate limited, overloaded, timed
out, connection dropped) once the transport's retries ran out. Older logs record these as
``provider``, and fold as they did: failed."""
RECOVERABLE = frozenset((CONTEXT_LENGTH, TRANSIENT))
"""`prompt_failed` kinds after which the session is idle again: the loop failed, the session did
not. Every other kind fails the session (seed 002: `failed` is for unrecoverable errors)."""
_OPEN = keys.RUNTIME_OPEN_PREFIX
_BUSY = keys.RUNTIME_BUSY_PREFIX
_OPEN_COUNT = keys.RUNTIME_OPEN_COUNT_KEY
_USAGE = keys.RUNTIME_USAGE_KEY


class LoopRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One prompt's agent loop: its place in the loop tree, the settings it ran with, its usage."""

    loop_id: str
    session_id: str
    request_id: str
    position: int
    """Log position of its `prompt_started`: loops of a session sort by it."""
    started_at: datetime
    status: str = RUNNING
    parent_loop_id: str | None = None
    parallel_group: str | None = None
    provider: str | None = None
    config: dict[str, Any] = {}
    """The merged runtime parameters the provider was called with (model, temperature, ...)."""
    warnings: list[dict[str, Any]] = []
    finished_at: datetime | None = None
    stop_reason: str | None = None
    error: str | None = None
    error_kind: str | None = None
    usage: LoopUsage = LoopUsage()
    child_loop_refs: list[dict[str, Any]] = []
    """Sessions spawned from this loop: ``{"session_id", "tool_call_id"}`` each, as the child's
    `parent_spawn_ref` holds them (an encrypted child's tool call id a digest under its key,
    with its text sealed beside it in `sealed_tool_call_id`)."""
    ended_position: int = 0
    """Log position of the event that ended the loop (0 while it runs): where a retry finds it."""
    steps: int = 0
    """Model calls: one per `step_completed`, and one for a completion the model (not a stop of
    the runtime, whose reply is synthetic) wrote."""
    sealed_request_id: str | None = None
    """The caller's request id, sealed, where `request_id` is its keyed digest (`prompt_started`)."""
    sealed_loop_id: str | None = None
    """The caller's loop id, sealed, where `loop_id` is its keyed digest; and so on for the next two."""
    sealed_parent_loop_id: str | None = None
    sealed_parallel_group: str | None = None


class RuntimeState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """The runtime's view of one incarnation of a session."""

    session_id: str
    provider: str
    status: str = ACTIVE
    open: bool = True
    request_id: str | None = None
    loop_position: int = 0
    last_loop_id: str | None = None
    last_loop_started_at: datetime | None = None
    loops: int = 0
    rejected: int = 0
    usage: LoopUsage = LoopUsage()
    close_reason: str | None = None
    params: dict[str, Any] = {}
    """The session's layer of runtime parameters when it was adopted (else its opening metadata's)."""
    open_calls: list[dict[str, Any]] = []
    """Tool calls of the prompt in flight still without a result: ``{"id", "name", "loop_id"}``
    each. Recovery and cancellation answer each one before the prompt ends."""


STATE_CODEC = StructCodec(RuntimeState, "runtime state")
LOOP_CODEC = StructCodec(LoopRecord, "loop record")
USAGE_CODEC = StructCodec(LoopUsage, "usage totals")


def _state_key(session_id: str) -> bytes:
    return _STATE + session_id.encode()


def _loop_prefix(session_id: str) -> bytes:
    return _LOOP + session_id.encode() + b"\x00"


def _loop_key(session_id: str, position: int) -> bytes:
    return _loop_prefix(session_id) + position.to_bytes(8, "big")


def _loop_id_key(session_id: str, loop_id: str) -> bytes | None:
    key = _LOOP_ID + session_id.encode() + b"\x00" + loop_id.encode()
    return key if len(key) <= limits.kv_key_bytes_max else None  # unindexable: skipped, not fatal


def request_key(session_id: str, request_id: str) -> bytes | None:
    """The index key of `request_id` (as the events hold it) in `session_id`; None when it is too
    long to be one (the runtime refuses such an id before it starts a prompt; the fold skips it)."""
    key = _REQUEST + session_id.encode() + b"\x00" + request_id.encode()
    return key if len(key) <= limits.kv_key_bytes_max else None


# Reading


def load_runtime(view: LogView, session_id: str) -> RuntimeState | None:
    data = _kv.get(view, _state_key(session_id))
    return None if data is None else STATE_CODEC.decode(data)


def load_loops(view: LogView, session_id: str) -> list[LoopRecord]:
    """Every loop of the session's current incarnation, oldest first."""
    return [LOOP_CODEC.decode(value) for _, value in _kv.scan(view, _loop_prefix(session_id))]


def load_loop(view: LogView, session_id: str, loop_id: str) -> LoopRecord | None:
    key = _loop_id_key(session_id, loop_id)
    position = None if key is None else _kv.get(view, key)
    if position is None:
        return None
    return load_loop_at(view, session_id, int.from_bytes(position, "big"))


def load_request(view: LogView, session_id: str, request_id: str) -> LoopRecord | None:
    """The loop of the prompt the session's current incarnation started for `request_id`, by
    the request index (one key and one record, however long the log); None if it never did."""
    key = request_key(session_id, request_id)
    position = None if key is None else _kv.get(view, key)
    if position is None:
        return None
    return load_loop_at(view, session_id, int.from_bytes(position, "big"))


def _ids_under(view: LogView, prefix: bytes) -> Iterator[str]:
    after: bytes | None = None
    while True:
        page = _kv.scan(view, prefix, start=after, limit=limits.list_page_sessions_max)
        for key, _ in page:
            yield key[len(prefix) :].decode()
        if len(page) < limits.list_page_sessions_max:
            return
        after = page[-1][0] + b"\x00"


def open_runtime_ids(view: LogView) -> Iterator[str]:
    """Ids of the open runtime sessions, in id order."""
    return _ids_under(view, _OPEN)


def busy_ids(view: LogView) -> Iterator[str]:
    """Ids of the runtime sessions with a prompt in flight, in id order."""
    return _ids_under(view, _BUSY)


def open_runtime_count(view: LogView) -> int:
    value = _kv.get(view, _OPEN_COUNT)
    return int.from_bytes(value, "big") if value else 0


def total_usage(view: LogView) -> LoopUsage:
    """Usage summed over every loop ever recorded in this store (closed sessions included)."""
    data = _kv.get(view, _USAGE)
    return LoopUsage() if data is None else USAGE_CODEC.decode(data)


# Folding


def _put_state(tx: Transaction, state: RuntimeState) -> None:
    _kv.put(tx, _state_key(state.session_id), STATE_CODEC.encode(state))


def _put_loop(tx: Transaction, loop: LoopRecord) -> None:
    _kv.put(tx, _loop_key(loop.session_id, loop.position), LOOP_CODEC.encode(loop))


def load_loop_at(view: LogView, session_id: str, position: int) -> LoopRecord | None:
    """The loop record of the prompt (or tool call) started at log `position` of the session."""
    data = _kv.get(view, _loop_key(session_id, position))
    return None if data is None else LOOP_CODEC.decode(data)


def _add_open(tx: Transaction, delta: int) -> None:
    value = open_runtime_count(tx) + delta
    _kv.put(tx, _OPEN_COUNT, max(value, 0).to_bytes(8, "big"))


def begin(
    tx: Transaction,
    session_id: str,
    metadata: dict[str, Any],
    parent_spawn_ref: dict[str, Any] | None,
    *,
    first: bool,
    forked: bool,
) -> None:
    """A new incarnation of `session_id` began (opened or forked): drop what the runtime kept of
    the previous one, and start a record if this one is a runtime session."""
    if not first:
        _forget(tx, session_id)
    provider = metadata.get("provider")
    if not isinstance(provider, str):
        return
    _put_state(tx, RuntimeState(session_id=session_id, provider=provider))
    _kv.put(tx, _OPEN + session_id.encode(), b"")
    _add_open(tx, +1)
    if parent_spawn_ref is not None and not forked:
        _link_child(tx, session_id, parent_spawn_ref)


def _forget(tx: Transaction, session_id: str) -> None:
    previous = load_runtime(tx, session_id)
    if previous is None:
        return
    if previous.open:  # the engine never reopens an open session; a fold must still be total
        _add_open(tx, -1)
    for prefix in (_LOOP, _LOOP_ID, _REQUEST):  # each `<prefix><sid>\0...`
        for key, _ in _kv.scan(tx, prefix + session_id.encode() + b"\x00"):
            _kv.delete(tx, key)
    for key in (_state_key(session_id), _OPEN + session_id.encode(), _BUSY + session_id.encode()):
        _kv.delete(tx, key)


def _link_child(tx: Transaction, child_id: str, ref: dict[str, Any]) -> None:
    """The parent loop a sub-agent session was spawned from lists the child: found by the loop
    id as the parent's index holds it (`KEYED_LOOP_ID`, which the runtime records), else by
    `loop_id` as given (a reference stored before an encrypted child kept it as a digest under
    its own key, which matches no loop of the parent)."""
    parent_id = ref.get("session_id")
    if not isinstance(parent_id, str):
        return
    found = (ref.get(KEYED_LOOP_ID), ref.get("loop_id"))
    tried = [_loop_id_key(parent_id, loop_id) for loop_id in found if isinstance(loop_id, str)]
    position = next((p for key in tried if key and (p := _kv.get(tx, key)) is not None), None)
    if position is None:
        return
    loop = load_loop_at(tx, parent_id, int.from_bytes(position, "big"))
    if loop is None:
        return
    child = {"session_id": child_id, "tool_call_id": ref.get("tool_call_id")}
    sealed = ref.get(SEALED_TOOL_CALL_ID)
    if sealed is not None:  # an encrypted child's: `tool_call_id` is its digest under its key
        child[SEALED_TOOL_CALL_ID] = sealed
    _put_loop(tx, msgspec.structs.replace(loop, child_loop_refs=[*loop.child_loop_refs, child]))


def _started(tx: Transaction, envelope: Envelope) -> None:
    data = envelope.data
    assert isinstance(data, ev.PromptStarted)
    state = load_runtime(tx, envelope.stream)
    if state is None or not state.open:
        return
    if state.status == BUSY:  # never written by the runtime: the older prompt lost its place
        _finish(
            tx, state, FAILED, envelope, error="superseded by another prompt", kind="superseded"
        )
        state = load_runtime(tx, envelope.stream)
        assert state is not None
    loop_id = data.loop_id or data.request_id
    _start_loop(
        tx,
        envelope,
        loop_id,
        data.request_id,
        data.parent_loop_id,
        data.parallel_group,
        data.params,
        provider=data.provider,
        warnings=data.warnings,
        sealed_request_id=data.sealed_request_id,
        sealed_loop_id=data.sealed_loop_id,
        sealed_parent_loop_id=data.sealed_parent_loop_id,
        sealed_parallel_group=data.sealed_parallel_group,
    )
    request = request_key(envelope.stream, data.request_id)
    if request is not None:
        _kv.put(tx, request, envelope.position.to_bytes(8, "big"))
    _kv.put(tx, _BUSY + envelope.stream.encode(), b"")
    _put_state(
        tx,
        msgspec.structs.replace(
            state,
            status=BUSY,
            request_id=data.request_id,
            loop_position=envelope.position,
            last_loop_id=loop_id,
            last_loop_started_at=envelope.recorded_at,
            loops=state.loops + 1,
        ),
    )


def _start_loop(
    tx: Transaction,
    envelope: Envelope,
    loop_id: str,
    request_id: str,
    parent_loop_id: str | None,
    parallel_group: str | None,
    config: dict[str, Any],
    *,
    provider: str | None = None,
    warnings: list[dict[str, Any]] | None = None,
    **sealed: str | None,
) -> None:
    """Record the loop `envelope` starts, and index its id to the envelope's position."""
    loop = LoopRecord(
        loop_id=loop_id,
        session_id=envelope.stream,
        request_id=request_id,
        position=envelope.position,
        started_at=envelope.recorded_at,
        parent_loop_id=parent_loop_id,
        parallel_group=parallel_group,
        provider=provider,
        config=config,
        warnings=warnings or [],
    )
    if sealed:  # an encrypted session's texts of its digested ids (`prompt_started`)
        loop = msgspec.structs.replace(loop, **sealed)
    _put_loop(tx, loop)
    key = _loop_id_key(envelope.stream, loop_id)
    if key is not None:
        _kv.put(tx, key, envelope.position.to_bytes(8, "big"))


def _finish(
    tx: Transaction,
    state: RuntimeState,
    outcome: str,
    envelope: Envelope,
    *,
    usage: LoopUsage | None = None,
    stop_reason: str | None = None,
    error: str | None = None,
    kind: str | None = None,
    steps: int = 0,
) -> None:
    """Close the loop in flight with `outcome` (and `steps` more model calls); idle or failed."""
    loop = load_loop_at(tx, state.session_id, state.loop_position)
    if loop is not None:
        _put_loop(
            tx,
            msgspec.structs.replace(
                loop,
                status=outcome,
                finished_at=envelope.recorded_at,
                usage=loop.usage + usage if usage is not None else loop.usage,
                stop_reason=stop_reason,
                error=error,
                error_kind=kind,
                ended_position=envelope.position,
                steps=loop.steps + steps,
            ),
        )
    if usage is not None:
        _kv.put(tx, _USAGE, USAGE_CODEC.encode(total_usage(tx) + usage))
    _kv.delete(tx, _BUSY + state.session_id.encode())
    _put_state(
        tx,
        msgspec.structs.replace(
            state,
            # A context the model refused as too long is pruned, and a transient failure may
            # pass: the caller may try again, the loop failed and the session did not.
            status=FAILED if outcome == FAILED and kind not in RECOVERABLE else IDLE,
            request_id=None,
            loop_position=0,
            usage=state.usage + usage if usage is not None else state.usage,
            open_calls=[],
        ),
    )


def _in_flight(tx: Transaction, envelope: Envelope, request_id: str) -> RuntimeState | None:
    state = load_runtime(tx, envelope.stream)
    if state is None or state.status != BUSY or state.request_id != request_id:
        return None
    return state


def _completed(tx: Transaction, envelope: Envelope) -> None:
    data = envelope.data
    assert isinstance(data, ev.PromptCompleted)
    state = _in_flight(tx, envelope, data.request_id)
    if state is not None:
        usage = loop_usage(data.usage)
        steps = 0 if data.reply.synthetic else 1  # the synthetic reply of a stop called no model
        _finish(
            tx, state, COMPLETED, envelope, usage=usage, stop_reason=data.stop_reason, steps=steps
        )


def _failed(tx: Transaction, envelope: Envelope) -> None:
    data = envelope.data
    assert isinstance(data, ev.PromptFailed)
    state = _in_flight(tx, envelope, data.request_id)
    if state is not None:
        _finish(tx, state, FAILED, envelope, error=data.error, kind=data.kind)


def _cancelled(tx: Transaction, envelope: Envelope) -> None:
    data = envelope.data
    assert isinstance(data, ev.PromptCancelled)
    state = _in_flight(tx, envelope, data.request_id)
    if state is not None:
        _finish(tx, state, CANCELLED, envelope, stop_reason="cancelled", error=data.reason)


def _rejected(tx: Transaction, envelope: Envelope) -> None:
    state = load_runtime(tx, envelope.stream)
    if state is not None and state.open:
        _put_state(tx, msgspec.structs.replace(state, rejected=state.rejected + 1))


def _ended(tx: Transaction, envelope: Envelope) -> None:
    """Closed or deleted: the session leaves the open and busy indexes; its loops stay readable."""
    state = load_runtime(tx, envelope.stream)
    if state is None or not state.open:
        return
    data = envelope.data
    reason = data.reason if isinstance(data, (ev.AgentSessionClosed, ev.SessionDeleted)) else None
    _kv.delete(tx, _OPEN + envelope.stream.encode())
    _kv.delete(tx, _BUSY + envelope.stream.encode())
    _add_open(tx, -1)
    _put_state(tx, msgspec.structs.replace(state, open=False, close_reason=reason))


def _adopted(tx: Transaction, envelope: Envelope) -> None:
    data = envelope.data
    assert isinstance(data, ev.RuntimeAdopted)
    sid = envelope.stream
    raw = _kv.get(tx, st.state_key(sid))
    if raw is None or st.STATE_CODEC.decode(raw).status != st.ACTIVE:
        return  # nothing open to adopt: the fold stays total
    if load_runtime(tx, sid) is not None:
        return  # already driven by the runtime
    _put_state(
        tx, RuntimeState(session_id=sid, provider=data.provider, params=dict(data.runtime_params))
    )
    _kv.put(tx, _OPEN + sid.encode(), b"")
    _add_open(tx, +1)


def _call_ref(call: object) -> dict[str, Any] | None:
    if not isinstance(call, dict) or not isinstance(call.get("id"), str):
        return None
    name = call.get("name")
    function = call.get("function")
    if name is None and isinstance(function, dict):
        name = function.get("name")
    return {"id": call["id"], "name": name if isinstance(name, str) else None, "loop_id": None}


def _step(tx: Transaction, envelope: Envelope) -> None:
    """A model call of the tool loop: its usage joins the loop's, its calls are now open."""
    data = envelope.data
    assert isinstance(data, ev.StepCompleted)
    state = _in_flight(tx, envelope, data.request_id)
    if state is None:
        return
    usage = loop_usage(data.usage)
    loop = load_loop_at(tx, state.session_id, state.loop_position)
    if loop is not None:
        _put_loop(tx, msgspec.structs.replace(loop, usage=loop.usage + usage, steps=loop.steps + 1))
    _kv.put(tx, _USAGE, USAGE_CODEC.encode(total_usage(tx) + usage))
    calls = [ref for ref in map(_call_ref, data.reply.tool_calls or ()) if ref is not None]
    _put_state(
        tx,
        msgspec.structs.replace(
            state, usage=state.usage + usage, open_calls=[*state.open_calls, *calls]
        ),
    )


def _tool_started(tx: Transaction, envelope: Envelope) -> None:
    """A tool call runs as a child loop of the prompt's loop."""
    data = envelope.data
    assert isinstance(data, ev.ToolCallStarted)
    state = _in_flight(tx, envelope, data.request_id)
    if state is None:
        return
    loop_id = data.loop_id or data.call_id
    config = {"tool": data.name, "call_id": data.call_id, "arguments": data.arguments}
    _start_loop(
        tx, envelope, loop_id, data.request_id, state.last_loop_id, data.parallel_group, config
    )
    calls = [
        {**call, "loop_id": loop_id} if call["id"] == data.call_id else call
        for call in state.open_calls
    ]
    _put_state(tx, msgspec.structs.replace(state, open_calls=calls))


def _tool_finished(tx: Transaction, envelope: Envelope) -> None:
    data = envelope.data
    assert isinstance(data, ev.ToolCallFinished)
    state = _in_flight(tx, envelope, data.request_id)
    if state is None:
        return
    if data.loop_id is not None:
        child = load_loop(tx, envelope.stream, data.loop_id)
        if child is not None and child.status == RUNNING:
            _put_loop(
                tx,
                msgspec.structs.replace(
                    child,
                    status=COMPLETED if data.error is None else FAILED,
                    finished_at=envelope.recorded_at,
                    error=data.error,
                    error_kind=data.kind,
                ),
            )
    calls = [call for call in state.open_calls if call["id"] != data.call_id]
    _put_state(tx, msgspec.structs.replace(state, open_calls=calls))


FOLLOWERS: dict[type, Callable[[Transaction, Envelope], None]] = {
    ev.StepCompleted: _step,
    ev.ToolCallStarted: _tool_started,
    ev.ToolCallFinished: _tool_finished,
    ev.RuntimeAdopted: _adopted,
    ev.PromptStarted: _started,
    ev.PromptCompleted: _completed,
    ev.PromptFailed: _failed,
    ev.PromptCancelled: _cancelled,
    ev.InputRejected: _rejected,
    ev.AgentSessionClosed: _ended,
    ev.SessionDeleted: _ended,
}
"""What the session fold hands on to this module after its own work, by event type."""
