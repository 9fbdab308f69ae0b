"""The request and response bodies of the HTTP service, as msgspec Structs.

Requests are decoded into these (unknown fields are refused, so a misspelt option fails loud, as
the engine's verbs do); responses are documented by them in the OpenAPI document, which is
written from these classes. Nothing here talks to the store.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

UNSET: Any = msgspec.UNSET


class _Request(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class _Response(msgspec.Struct, kw_only=True):
    pass


# Requests


class CreateSession(_Request):
    """`POST /v1/sessions`: the options of `open_session`; `id` is minted when absent."""

    id: str | None = None
    system_prompt: str | None = None
    title: str | None = None
    metadata: dict[str, Any] | None = None
    tool_format: str | None = None
    agent_id: str | None = None
    formation: dict[str, Any] | None = None
    scope: Literal["persistent", "ephemeral"] | None = None
    workspace_anchor: dict[str, Any] | None = None
    workspace_policy: dict[str, Any] | None = None
    parent_spawn_ref: dict[str, Any] | None = None


class PatchSession(_Request):
    """`PATCH /v1/sessions/{id}`: a new `title` (null removes it) and changes to `metadata` as a
    JSON merge patch (RFC 7396): each key is set, or removed when its value is null."""

    title: str | msgspec.UnsetType | None = msgspec.UNSET
    metadata: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class CloseSession(_Request):
    reason: str | None = None
    status: dict[str, Any] | None = None


class ForkSession(_Request):
    """Fork the whole transcript, or its first `keep_first` messages, or the transcript as it was
    right after the log position `at_event_id`; `child_id` names the child."""

    keep_first: int | None = None
    at_event_id: int | None = None
    child_id: str | None = None


class InjectMessages(_Request):
    """One `message`, or a batch of `messages` (all of them or none). With `expected_length`,
    they are written only if the transcript holds exactly that many entries (its `length`, as a
    snapshot, a message page or the last inject's answer gave it); otherwise nothing is written
    and the answer is a 409 `length-conflict` naming the expected and the actual length."""

    message: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = None
    expected_length: Annotated[int, msgspec.Meta(ge=0)] | None = None


class TrimSession(_Request):
    keep_last: int


class PutScratchpad(_Request):
    """The whole new scratchpad; null clears it."""

    scratchpad: dict[str, Any] | None
    source: str | None = None
    reason: str | None = None
    metadata: dict[str, Any] | None = None


class ClientPrompt(_Request):
    content: Any
    options: dict[str, Any] | None = None


class ClientPermission(_Request):
    request: dict[str, Any]
    options: dict[str, Any] | None = None


class CreateToken(_Request):
    """A bearer session for `principal` until `expires_at` (RFC 3339)."""

    principal: str
    expires_at: str
    attributes: dict[str, Any] | None = None


# Responses


class Problem(_Response):
    """RFC 9457 problem details; `code` is the Agents Protocol error code."""

    type: str
    title: str
    status: int
    detail: str
    instance: str
    code: str


class Session(_Response):
    """A session's resource: the snapshot without its transcript."""

    id: str
    object: Literal["session"]
    session_id: str
    state: Literal["ACTIVE", "CLOSED"]
    status: str
    created_at: str | None
    updated_at: str | None
    title: str | None
    length: int
    parent_id: str | None
    child_ids: list[str]
    metadata: dict[str, Any] | None
    version: int


class SessionSnapshot(Session):
    transcript: list[dict[str, Any]]


class SessionListItem(_Response):
    id: str
    object: Literal["session"]
    session_id: str
    status: str
    title: str | None
    length: int
    created_at: str | None
    updated_at: str | None
    parent_id: str | None


class SessionPage(_Response):
    object: Literal["list"]
    data: list[SessionListItem]
    next_cursor: str | None


class MessagePage(_Response):
    object: Literal["list"]
    data: list[dict[str, Any]]
    after: int
    next_after: int | None
    length: int


class InjectResult(_Response):
    session_id: str
    appended: int
    length: int
    first_event_id: int | None
    last_event_id: int | None


class Kept(_Response):
    session_id: str
    kept: int


class Ancestry(_Response):
    session_id: str
    parent_id: str | None
    child_ids: list[str]
    root_id: str


class Scratchpad(_Response):
    session_id: str
    scratchpad: dict[str, Any] | None
    version: int


class LiveClient(_Response):
    client_id: str
    mode: str
    attached_at: str | None
    last_seen_at: str | None
    metadata: dict[str, Any]


class LiveClients(_Response):
    session_id: str
    clients: list[LiveClient]
    controller_id: str | None


class EventResource(_Response):
    object: Literal["session", "bearer_session", "stream"]
    id: str


class Event(_Response):
    """One event of the log: `id` is its log position, `sequence` its version in its stream."""

    id: int
    event: str
    resource: EventResource
    created_at: str
    sequence: int
    payload: dict[str, Any]
    meta: dict[str, Any]
    hash: str
    replayed: bool


class EventPage(_Response):
    object: Literal["list"]
    data: list[Event]
    next_after: int | None
    head: int


class SeedResult(_Response):
    ok: bool
    session_id: str | None
    messages_loaded: int
    error: str | None


class Imported(_Response):
    session_id: str


class Token(_Response):
    """A bearer session; `token` appears once, in the answer that created it."""

    handle: str
    principal: str
    created_at: str | None
    expires_at: str | None
    attributes: dict[str, Any]
    token: str | None


class VerifyResult(_Response):
    ok: bool
    events_checked: int
    streams_checked: int
    head_hash: str
    first_bad_position: int | None
    problem: str | None
    anchor_position: int
    projection_keys_checked: int | None


class Health(_Response):
    ok: bool
    head: int
    version: str
    streams_open: int
