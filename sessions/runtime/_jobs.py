"""The runtime's store work: plain synchronous functions, each one decision and its events.

Each runs in a savepoint of a shared durable commit (`sessions/_group.py`) and follows the
engine's rule: read the projection, decide, raise before appending anything, then append. The
check that a session is not busy and the append of `prompt_started` happen in one transaction
against the stream version just read, so of two prompts racing for one session exactly one starts.
Nothing here awaits, calls a provider or reads the clock for a decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

import projections as pj
from eventlog import LogView, SessionExistsError, Transaction, UnknownSessionError
from eventlog import events as ev
from eventlog.errors import ConfigurationError, ForgottenError, MissingKeyError
from projections import _runtime as rt
from sessions._checks import iso
from sessions._host import append, transact
from sessions._keyed_refs import SPAWN_REF, ref_label
from sessions._keyring import is_keyed
from sessions._seal import Sealer
from sessions._store import SessionStore
from sessions.runtime._errors import SessionBusyError, SessionFailedError
from sessions.runtime._params import merge_params
from sessions.runtime._recorder import in_flight_request_id, last_loop_id, shown_id, usage_dict
from sessions.runtime._replay import Replay, recorded

INTERRUPTED = "interrupted"
"""`prompt_failed.kind` of a prompt that was in flight when its process stopped."""


@dataclass(frozen=True)
class Started:
    """A prompt that is now in flight: what the provider is to be called with."""

    request_id: str
    loop_id: str
    provider: str
    params: dict[str, Any]
    messages: list[dict[str, Any]]
    first: bool


def info(view: LogView, session_id: str, verb: str, sealer: Sealer | None) -> dict[str, Any]:
    """The status record of an open runtime session, naming the request in flight as its caller
    did (opened with `sealer` in an encrypted session); raises `UnknownSessionError` otherwise."""
    state = pj.load_state(view, session_id)
    runtime = rt.load_runtime(view, session_id)
    if state is None or state.status != pj.ACTIVE or runtime is None or not runtime.open:
        raise UnknownSessionError(session_id, verb)
    transcript = pj.load_transcript(view, session_id) or pj.Transcript()
    return {
        "session_id": session_id,
        "agent_id": state.agent_id,
        "status": runtime.status,
        "created_at": iso(state.created_at),
        "last_activity_at": iso(transcript.last_activity_at or state.last_activity_at),
        "provider": runtime.provider,
        "scope": state.scope,
        "request_id": in_flight_request_id(view, sealer, state, runtime),
        "loops": runtime.loops,
        "usage": usage_dict(runtime.usage),
    }


def open_session(
    store: SessionStore,
    session_id: str | None,
    agent_id: str,
    provider: str,
    params: dict[str, Any],
    metadata: dict[str, Any],
    options: dict[str, Any],
) -> dict[str, Any]:

    def decide(tx: Transaction) -> dict[str, Any]:
        if session_id is not None and store.exists(session_id):
            raise SessionExistsError(f"create: session `{session_id}` already exists")
        recorded = {**metadata, "provider": provider, "runtime_params": params}
        spawn = options.get("parent_spawn_ref")
        spawned = {} if spawn is None else {"parent_spawn_ref": _spawn_ref(tx, store, spawn)}
        opened = {**options, **spawned}
        sid = store.open_session(session_id, agent_id=agent_id, metadata=recorded, **opened)
        return info(tx, sid, "create", store._sealer)

    return transact(store.log, decide)


def _spawn_ref(tx: Transaction, store: SessionStore, ref: dict[str, Any]) -> dict[str, Any]:
    """`ref` as a sub-agent session records it: with `keyed_loop_id`, the parent's loop id as
    the parent's loop index holds it, when the fold cannot find that loop by `loop_id` as
    given: the parent is encrypted (its index holds a keyed digest, which the projection cannot
    compute), or the child is (its `loop_id` is kept as a digest under its own key). That is
    the text itself only where the parent's index holds it in the clear (a plain parent, or a
    loop stored before loop ids were digested), which the parent's own log holds anyway."""
    found = {name: value for name, value in ref.items() if name != rt.KEYED_LOOP_ID}
    loop_id, parent = found.get("loop_id"), found.get("session_id")
    if not isinstance(loop_id, str) or not loop_id or not isinstance(parent, str):
        return found
    try:
        keyed = store.keyed_digest(parent, loop_id)
    except (ForgottenError, MissingKeyError):  # no key to match the parent's loops by: no link
        return found
    if keyed is not None and rt.load_loop(tx, parent, keyed) is not None:
        return {**found, rt.KEYED_LOOP_ID: keyed}
    if store._sealer is not None and rt.load_loop(tx, parent, loop_id) is not None:
        return {**found, rt.KEYED_LOOP_ID: loop_id}  # held in the clear by the parent's log
    return found if keyed is None else {**found, rt.KEYED_LOOP_ID: keyed}


def adopt_session(
    store: SessionStore,
    session_id: str,
    provider: str,
    agent_id: str | None,
    params: dict[str, Any],
) -> dict[str, Any]:
    """Make an open session that the runtime did not create a runtime session; adopting one it
    already drives with the same provider changes nothing."""

    def decide(tx: Transaction) -> dict[str, Any]:
        state = pj.load_state(tx, session_id)
        if state is None or state.status != pj.ACTIVE:
            raise UnknownSessionError(session_id, "adopt")
        runtime = rt.load_runtime(tx, session_id)
        if runtime is not None:
            if runtime.provider != provider:
                raise ConfigurationError(
                    f"adopt: session `{session_id}` is already driven with provider "
                    f"`{runtime.provider}`, not `{provider}`"
                )
            return info(tx, session_id, "adopt", store._sealer)
        adopted = ev.RuntimeAdopted(provider=provider, agent_id=agent_id, runtime_params=params)
        append(tx, session_id, [adopted], sealer=store._sealer)
        return info(tx, session_id, "adopt", store._sealer)

    return transact(store.log, decide)


def _session(
    tx: Transaction, session_id: str, verb: str
) -> tuple[pj.SessionState, rt.RuntimeState]:
    state = pj.load_state(tx, session_id)
    runtime = rt.load_runtime(tx, session_id)
    if state is None or state.status != pj.ACTIVE or runtime is None or not runtime.open:
        raise UnknownSessionError(session_id, verb)
    return state, runtime


def start_prompt(
    store: SessionStore,
    session_id: str,
    request_id: str,
    prompt: ev.Message,
    defaults: Callable[[str], Mapping[str, Any]],
    params: dict[str, Any],
    loop: tuple[str, str | None, str | None],
    warnings: list[dict[str, Any]],
) -> Started | Replay:
    """Answer a request id the session already ran with its recorded outcome (`_replay.py`),
    also once it is closed; else refuse a closed, busy or failed session, or append
    `prompt_started` with the merged parameters and return the transcript the provider is to
    see."""
    loop_id, parallel_group = loop[0], loop[2]

    def decide(tx: Transaction) -> Started | Replay:
        closed = pj.load_state(tx, session_id)
        if closed is not None and closed.status == pj.CLOSED:
            # A retry of a request the session ran before it was closed (a caller that lost the
            # answer to a crash, or to the close cancelling it) answers what that run recorded.
            replay = recorded(tx, store, closed, request_id, prompt)
            if replay is not None:
                return replay
        state, runtime = _session(tx, session_id, "prompt")
        replay = recorded(tx, store, state, request_id, prompt)
        if replay is not None:  # before busy and failed: a retry answers what its first run did
            return replay
        if runtime.status == rt.BUSY:
            shown = in_flight_request_id(tx, store._sealer, state, runtime)
            raise SessionBusyError(session_id, shown)
        if runtime.status == rt.FAILED:
            raise SessionFailedError(
                f"prompt: session `{session_id}` has failed; close it and create another"
            )
        session_params = runtime.params or state.metadata.get("runtime_params")
        merged = merge_params(
            defaults(runtime.provider),
            session_params if isinstance(session_params, dict) else {},
            params,
        )
        parent_loop_id = loop[1]
        if parent_loop_id is None:
            # The caller's text of an id the session keeps as its digest: sealing keys it again.
            parent_loop_id = last_loop_id(tx, store._sealer, state, runtime)
            parent_loop_id = parent_loop_id or _spawning_loop(store._sealer, state)
        started = ev.PromptStarted(
            request_id=request_id,
            prompt=prompt,
            provider=runtime.provider,
            params=merged,
            loop_id=loop_id,
            parent_loop_id=parent_loop_id,
            parallel_group=parallel_group,
            warnings=warnings,
        )
        append(tx, session_id, [started], sealer=store._sealer)
        # The provider sees the context view: from the latest checkpoint on, prunes applied.
        messages = store.context(session_id)
        return Started(
            request_id=request_id,
            loop_id=loop_id,
            provider=runtime.provider,
            params=merged,
            messages=messages,
            first=runtime.loops == 0,
        )

    return transact(store.log, decide)


def _spawning_loop(sealer: Sealer | None, state: pj.SessionState) -> str | None:
    """A sub-agent's first loop continues the parent's loop that spawned it: the caller's text
    of its id, which an encrypted child keeps as a digest with the text sealed beside it (so
    that sealing the prompt keys it to the same digest again)."""
    ref = state.parent_spawn_ref or {}
    loop_id = ref.get("loop_id")
    if not isinstance(loop_id, str):
        return None
    sealed = ref.get("sealed_loop_id")
    return shown_id(sealer, state, loop_id, sealed, ref_label(SPAWN_REF, "loop_id"))


def _in_flight(
    tx: Transaction, store: SessionStore, session_id: str, request_id: str
) -> rt.RuntimeState | None:
    """The session's runtime state while `request_id` is its request in flight, which the
    projection names as `prompt_started` stored it: an encrypted session's keyed digest of it
    (`Keyring.keyed`), or the text itself (a plain session's, or one stored before digests)."""
    runtime = rt.load_runtime(tx, session_id)
    if runtime is None or runtime.status != rt.BUSY or runtime.request_id is None:
        return None
    stored = runtime.request_id
    if stored == request_id or (
        is_keyed(stored) and stored == store.keyed_digest(session_id, request_id)
    ):
        return runtime
    return None


def _named(runtime: rt.RuntimeState, events: list[ev.Event]) -> list[ev.Event]:
    """`events` of the request in flight naming it as the projection does (`_in_flight`): what
    the runtime writes after `prompt_started` repeats what that stored, never keys it again."""
    return [msgspec.structs.replace(event, request_id=runtime.request_id) for event in events]


def answer_open_calls(runtime: rt.RuntimeState, kind: str, why: str) -> list[ev.Event]:
    """A result for every tool call of the prompt in flight that has none yet, so the transcript
    never holds a call without its result (the APIs refuse such a transcript)."""
    assert runtime.request_id is not None
    return [
        ev.ToolCallFinished(
            request_id=runtime.request_id,
            call_id=call["id"],
            loop_id=call.get("loop_id"),
            result=ev.Message(
                role="tool",
                tool_call_id=call["id"],
                name=call.get("name"),
                content=f"error: the tool call did not finish ({why})",
                synthetic=True,
                metadata={"tool_error": kind},
            ),
            error=why,
            kind=kind,
        )
        for call in runtime.open_calls
    ]


def _ending_kind(event: ev.Event) -> str:
    if isinstance(event, ev.PromptFailed):
        return event.kind or "failed"
    return "cancelled"


def finish_prompt(store: SessionStore, session_id: str, request_id: str, event: ev.Event) -> bool:
    """Append the outcome of a prompt if it is still the one in flight (after a result for each
    tool call left open); False if it is not (the session was closed, or recovery already
    marked it failed)."""

    def decide(tx: Transaction) -> bool:
        runtime = _in_flight(tx, store, session_id, request_id)
        if runtime is None:
            return False
        why = getattr(event, "reason", None) or getattr(event, "error", None) or "the loop ended"
        answers = answer_open_calls(runtime, _ending_kind(event), str(why)[:200])
        append(tx, session_id, [*answers, *_named(runtime, [event])], sealer=store._sealer)
        return True

    return transact(store.log, decide)


def record_step(
    store: SessionStore, session_id: str, request_id: str, events: list[ev.Event]
) -> bool:
    """Append events of the tool loop (a step and its calls started, or one call finished) if
    the prompt is still in flight; False if it is not."""

    def decide(tx: Transaction) -> bool:
        runtime = _in_flight(tx, store, session_id, request_id)
        if runtime is None:
            return False
        append(tx, session_id, _named(runtime, events), sealer=store._sealer)
        return True

    return transact(store.log, decide)


def reject_input(
    store: SessionStore, session_id: str, request_id: str, filter_name: str, reason: str
) -> None:
    rejected = ev.InputRejected(filter=filter_name, reason=reason, request_id=request_id)

    def decide(tx: Transaction) -> None:
        _session(tx, session_id, "prompt")
        append(tx, session_id, [rejected], sealer=store._sealer)

    transact(store.log, decide)


def close_session(store: SessionStore, session_id: str, reason: str, verb: str) -> dict[str, Any]:
    """Close an open runtime session (cancelling a prompt still recorded in flight); returns its
    last status record."""

    def decide(tx: Transaction) -> dict[str, Any]:
        last = info(tx, session_id, verb, store._sealer)
        events: list[ev.Event] = []
        runtime = rt.load_runtime(tx, session_id)
        if runtime is not None and runtime.request_id is not None:  # named as the projection does
            events.extend(answer_open_calls(runtime, "cancelled", reason))
            events.append(ev.PromptCancelled(request_id=runtime.request_id, reason=reason))
        status = {"reason": reason, "status": last["status"]}
        events.append(ev.AgentSessionClosed(reason=reason, status=status))
        append(tx, session_id, events, sealer=store._sealer)
        return last

    return transact(store.log, decide)


def recover(store: SessionStore) -> list[str]:
    """Mark every prompt still recorded in flight as failed (`interrupted`): at start-up nothing
    can be running it. Returns the sessions it touched."""

    def decide(tx: Transaction) -> list[str]:
        touched: list[str] = []
        for session_id in list(rt.busy_ids(tx)):
            runtime = rt.load_runtime(tx, session_id)
            if runtime is None or runtime.request_id is None:
                continue
            why = "the process running this prompt stopped before it finished"
            failed = ev.PromptFailed(request_id=runtime.request_id, error=why, kind=INTERRUPTED)
            append(
                tx,
                session_id,
                [*answer_open_calls(runtime, INTERRUPTED, why), failed],
                sealer=store._sealer,
            )
            touched.append(session_id)
        return touched

    return transact(store.log, decide)


def expired(
    view: LogView, now: datetime, ttl_s: float, idle_s: float
) -> list[tuple[str, str, str | None]]:
    """Open runtime sessions past their lifetime (``expired``) or idle too long (``idle``), as
    ``(session_id, reason, request_id in flight)``. A busy session is never idle."""
    found: list[tuple[str, str, str | None]] = []
    for session_id in rt.open_runtime_ids(view):
        state = pj.load_state(view, session_id)
        runtime = rt.load_runtime(view, session_id)
        if state is None or runtime is None:
            continue
        transcript = pj.load_transcript(view, session_id) or pj.Transcript()
        last = transcript.last_activity_at or state.last_activity_at
        if (now - state.created_at).total_seconds() >= ttl_s:
            found.append((session_id, "expired", runtime.request_id))
        elif runtime.status != rt.BUSY and (now - last).total_seconds() >= idle_s:
            found.append((session_id, "idle", None))
    return found
