"""ADK session state as `integrations.adk` stores it: values in the JSON-safe form ADK's own SQL
services give them (`json_safe`), and the state a branch cut at an earlier event starts with
(`branch_state`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic_core import to_jsonable_python

from eventlog import limits
from eventlog._codec import check_encodable
from sessions import InvalidArgumentError, SessionStore

CREATED = "created"
"""The scratchpad key holding a session's own state as it was created (when it had any): where a
branch cut at an earlier event starts replaying from."""
_NOT_SESSIONS = ("app:", "user:", "temp:")  # ADK's State prefixes of state no session owns
_PAGE = 512  # events read per step when replaying state deltas


def json_safe(state: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`state` with each value in the form ADK's SQL services store it (pydantic's JSON form: a
    datetime as ISO text, a set or tuple as a list, bytes as UTF-8 text), so what ADK accepts is
    stored and reads back as it does from them. A value with no such form, or one the store
    cannot keep (NaN, an integer past 64 bits), is refused naming its key, before anything is
    written; ADK's services would store its `repr` or fail in the database instead."""
    safe: dict[str, Any] = {}
    for key, value in state.items():
        try:
            plain = to_jsonable_python(value)
        except Exception as exc:  # pydantic's serialization error, or bytes that are not UTF-8
            raise InvalidArgumentError(
                f"{where}: state[{key!r}]: a {type(value).__name__} has no JSON form ({exc})",
                where=where,
            ) from exc
        check_encodable(plain, what=f"{where}: state[{key!r}]")
        safe[key] = plain
    return safe


def lasting(state: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The part of `state` that is stored, JSON-safe (`json_safe`): all but its temp: keys,
    which live in the caller's session for one invocation and may hold anything."""
    for key in state:
        if not isinstance(key, str):
            raise InvalidArgumentError(
                f"{where}: state keys must be strings, got {type(key).__name__} {key!r}",
                where=where,
            )
    return json_safe({k: v for k, v in state.items() if not k.startswith("temp:")}, where)


def fitting(pad: dict[str, Any]) -> dict[str, Any]:
    """`pad` as a scratchpad, without the creation state it keeps (`CREATED`) once keeping it
    would pass the scratchpad's size bound: the session's own state must always fit, and a
    branch of it then falls back as `branch_state` says."""
    if CREATED in pad and check_encodable(pad, what="scratchpad") > limits.scratchpad_bytes_max:
        return {k: v for k, v in pad.items() if k != CREATED}
    return pad


def session_scoped(delta: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a state delta that is the session's own (neither app:, user: nor temp:)."""
    return {k: v for k, v in delta.items() if not k.startswith(_NOT_SESSIONS)}


def branch_state(
    store: SessionStore, key: str, kept: int, length: int, pad: Mapping[str, Any]
) -> dict[str, Any]:
    """The session's own state as of its first `kept` events, as `session_key` holds it now (its
    scratchpad `pad`, its `length` events): what a branch keeping those events starts with.

    When no later event changed the session's state (the common case, and a branch at the end),
    that is the state as it is, and only the later events are read. Otherwise it is the state at
    creation with the deltas of the kept events applied in order, as ADK's own rewind replays
    them (`_rewind_utils.compute_state_delta_for_rewind`). A session stored before its creation
    state was kept (`CREATED`) is taken to have been created with the keys no event ever set."""
    state: dict[str, Any] = dict(pad.get("state", {}))
    later = [d for d in _deltas(store, key, kept, length) if d]
    if not later:
        return state
    replayed: dict[str, Any] = {}
    for delta in _deltas(store, key, 0, kept):
        replayed.update(delta)
    created = pad.get(CREATED)
    if not isinstance(created, Mapping):
        touched = set(replayed).union(*later)
        created = {k: v for k, v in state.items() if k not in touched}
    return {**created, **replayed}


def _deltas(store: SessionStore, key: str, start: int, end: int) -> Iterator[dict[str, Any]]:
    """The session-scoped state delta of each stored event in [start, end), read a page at a
    time without building the events (a message that is no ADK event gives an empty one)."""
    while start < end:
        page, _ = store.message_structs(key, after=start, limit=min(_PAGE, end - start))
        if not page:
            return
        for message in page:
            actions = message.item.get("actions") if message.item is not None else None
            delta = actions.get("state_delta") if isinstance(actions, Mapping) else None
            yield session_scoped(delta) if isinstance(delta, Mapping) else {}
        start += len(page)
