"""Request ids are idempotent per session: a prompt whose `request_id` the session already ran
is answered with that run's recorded outcome, and no model is called again.

The prompt a request started is found through the runtime projection's request index (rt/r/,
one key and one loop record, never a scan of the log: under the request id's keyed digest in an
encrypted session, then as given); its outcome is read from the two events the loop record points
to, opened when the session is encrypted. `recorded` runs inside `_jobs.start_prompt`'s
transaction, before anything is appended, so of a prompt and its retry racing for a session
exactly one runs. Once `Runtime.stop` has begun, `join` answers from the log alone (`stopped`)
instead of letting a prompt start, and `stop` waits for those answers (`underway`). Nothing here
appends, awaits a provider or reads a clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

import projections as pj
from eventlog import LogClosedError, LogView, SessionLogError, TruncatedError, limits
from eventlog import events as ev
from eventlog.limits import check_at_most
from projections import _runtime as rt
from sessions._store import SessionStore
from sessions.runtime._errors import (
    PromptCancelledError,
    ProviderError,
    RequestConflictError,
    RuntimeStoppedError,
    SessionBusyError,
)
from sessions.runtime._recorder import shown_id, usage_dict
from sessions.runtime._wire import text_of

if TYPE_CHECKING:
    from sessions.runtime._prompting import Flight


@dataclass(frozen=True)
class Replay:
    """What a request the session already ran ended with: the `answer` `prompt` returned, or
    the `error` it raised (failed or cancelled)."""

    answer: dict[str, Any] | None = None
    error: SessionLogError | None = None

    def result(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        assert self.answer is not None, "a replay holds an answer or an error"
        return dict(self.answer)


def check_request(session_id: str, request_id: str) -> None:
    """`LimitExceededError` for a request id too long in UTF-8 to be indexed with the session's
    id (only an id of many multi-byte characters is): a retry of it could not be found."""
    base = rt.request_key(session_id, "")
    assert base is not None, "a checked session id leaves room for a request id"
    size = len(base) + len(request_id.encode())
    what = "prompt: the index key of `request_id` (with the session id), in bytes"
    check_at_most(size, limits.kv_key_bytes_max, "kv_key_bytes_max", what)


def same_prompt(first: ev.Message, again: ev.Message) -> bool:
    """Whether a retry carries the prompt its request was first sent with: its text and files
    (runtime parameters and tools are not compared)."""
    return first.content == again.content and first.files == again.files


@contextlib.contextmanager
def underway(calls: set[asyncio.Event]) -> Iterator[None]:
    """Hold a `prompt` call in `calls` until it returns, by an event set then: `Runtime.stop`
    waits for each, so a retry that waited for a prompt `stop` cancelled reads its outcome
    before the runtime lets go of its stores."""
    returned = asyncio.Event()
    calls.add(returned)
    try:
        yield
    finally:
        calls.discard(returned)
        returned.set()


async def join(
    flights: Mapping[str, Flight],
    store: SessionStore,
    sid: str,
    rid: str,
    prompt: ev.Message,
    read: Callable[[Callable[[LogView], Replay | None]], Awaitable[Replay | None]],
    stopping: Callable[[], bool],
) -> Replay | None:
    """Return None once this process runs no prompt on `sid` and may start one. A retry of the
    request running (same id, same prompt) waits for it to end, so it can answer what it
    recorded; while another request runs, a retry of one that ended answers what it recorded
    (`finished`, through `read`), and anything else is refused as busy (as stopped once the
    runtime is `stopping`: nothing starts after the run being cancelled); the same id with another
    prompt as a conflict. Once the runtime is `stopping`, what `stopped` answers instead."""
    while (running := flights.get(sid)) is not None:
        if running.request_id != rid:
            replay = await read(
                partial(finished, store=store, session_id=sid, request_id=rid, prompt=prompt)
            )
            if replay is not None:
                return replay
            if flights.get(sid) is running:  # else it ended meanwhile: look again
                if stopping():  # it is being cancelled, and nothing starts after it
                    raise RuntimeStoppedError(sid, rid)
                raise SessionBusyError(sid, running.request_id)
            continue
        if running.prompt is not None and not same_prompt(running.prompt, prompt):
            raise RequestConflictError(sid, rid, None)
        await running.done.wait()  # a retry cancelled meanwhile leaves the first one running
    return await stopped(store, sid, rid, prompt, read) if stopping() else None


async def stopped(
    store: SessionStore,
    sid: str,
    rid: str,
    prompt: ev.Message,
    read: Callable[[Callable[[LogView], Replay | None]], Awaitable[Replay | None]],
) -> Replay:
    """The answer of a runtime that is stopping or stopped, which starts no prompt: the outcome
    the session recorded for `rid` (a retry that `join` kept waiting for its request gets what
    the cancel wrote), read without a write; `RuntimeStoppedError` when none is recorded (the
    request never ran, or a lost lease left it recorded in flight) or its store has closed."""
    try:
        replay = await read(
            partial(finished, store=store, session_id=sid, request_id=rid, prompt=prompt)
        )
    except (SessionBusyError, LogClosedError):  # nobody here will end it, or read it, any more
        replay = None
    if replay is None:
        raise RuntimeStoppedError(sid, rid)
    return replay


def finished(
    view: LogView, store: SessionStore, session_id: str, request_id: str, prompt: ev.Message
) -> Replay | None:
    """`recorded`, read outside the writer: what the session ran for `request_id`, or None."""
    state = pj.load_state(view, session_id)
    return None if state is None else recorded(view, store, state, request_id, prompt)


def recorded(
    view: LogView,
    store: SessionStore,
    state: pj.SessionState,
    request_id: str,
    prompt: ev.Message,
) -> Replay | None:
    """The outcome of the prompt the session ran for `request_id`; None if it never started
    one. `RequestConflictError` when that prompt was another, `SessionBusyError` while it is
    still recorded in flight (by a process that stopped: the next start fails it)."""
    sid = state.session_id
    # What an encrypted session's events hold; a forgotten one refuses the prompt when it writes.
    keyed = None if state.forgotten else store._keyring.keyed_for(state, request_id, "prompt")
    loop = None if keyed is None else rt.load_request(view, sid, keyed)
    if loop is None:  # a plain session's, or one stored before request ids were digested
        loop = rt.load_request(view, sid, request_id)
    if loop is None:
        return None
    started = _event(view, store, state, request_id, loop, loop.position)
    if isinstance(started, ev.PromptStarted) and not same_prompt(started.prompt, prompt):
        raise RequestConflictError(sid, request_id, loop.position)
    if loop.status == rt.RUNNING or not loop.ended_position:
        raise SessionBusyError(sid, request_id)
    ended = _event(view, store, state, request_id, loop, loop.ended_position)
    where = f"prompt: request `{request_id}` of `{sid}`"
    again = "it is not run again: send a new request id to try again"
    if loop.status == rt.CANCELLED:  # the loop record keeps the reason as stored: sealed
        why = ended.reason if isinstance(ended, ev.PromptCancelled) else loop.error
        return Replay(error=PromptCancelledError(f"{where} was cancelled ({why}); {again}"))
    if not isinstance(ended, ev.PromptCompleted):
        why = ended.error if isinstance(ended, ev.PromptFailed) else loop.error
        return Replay(error=ProviderError(f"{where} failed ({loop.error_kind}): {why}; {again}"))
    answer = {
        "session_id": sid,
        "text": text_of(ended.reply.content),
        "stop_reason": loop.stop_reason,
        "request_id": request_id,
        "loop_id": shown_id(store._sealer, state, loop.loop_id, loop.sealed_loop_id, "loop_id"),
        "tool_calls": list(ended.reply.tool_calls or []),
        "usage": usage_dict(loop.usage),
        "steps": loop.steps,
    }
    return Replay(answer=answer)


def _event(
    view: LogView,
    store: SessionStore,
    state: pj.SessionState,
    request_id: str,
    loop: rt.LoopRecord,
    at: int,
) -> ev.Event | None:
    """The event at `at` of `loop` (of request `request_id`), its sealed message and texts opened."""
    try:
        envelope = view.event_at(at)
    except TruncatedError as exc:
        raise TruncatedError(
            f"prompt: request `{request_id}` of `{state.session_id}` already ran (from "
            f"log position {loop.position}) and is not run again, but its record is gone",
            at,
            exc.anchor,
        ) from exc
    if envelope is None or envelope.stream != state.session_id:
        return None
    data = envelope.data
    sealer, opener = store._sealer, store._opener(view, state, "prompt")
    if sealer is None or opener is None:
        return data
    if isinstance(data, ev.PromptStarted):
        (message,) = opener(data, at, [0])
        return msgspec.structs.replace(data, prompt=message)
    if isinstance(data, ev.PromptCompleted):
        (message,) = opener(data, at, [0])
        return msgspec.structs.replace(data, reply=message)
    return sealer.open_event(data, state.key_slot, "prompt")  # a failure's error text
