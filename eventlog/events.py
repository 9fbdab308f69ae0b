"""The event catalog: every fact sessionlog records, as frozen, explicitly tagged msgspec Structs.

Schema-evolution rules (tested against stored fixture bytes in `tests/fixtures/`):
- a tag never changes and is never reused; renaming a class changes no stored byte;
- a new field gets a default, so events written before it still decode;
- a field is never removed or retyped; stop writing it instead;
- a new event is a new tagged class added to `AnyEvent`.
Payloads hold outcomes, never requests to compute them, so replay never calls a model or a clock.
Events are plain data that never refer back to themselves, so they opt out of the cyclic garbage
collector (`gc=False`): decoding a page of events then allocates nothing the collector must scan.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Union

import msgspec

Timestamp = Annotated[datetime, msgspec.Meta(tz=True)]
"""A moment, always with its UTC offset: a naive datetime is refused when a record is decoded, so
the log cannot hold one (a comparison of naive and aware times would fail far from the cause)."""


class _Record(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """A value inside an event: frozen, keyword-only, defaults left out of the stored bytes."""


class Usage(_Record, frozen=True):
    """Token counts of one model call or one message."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    extra: dict[str, Any] = {}


class FileRef(_Record, frozen=True):
    """A file attached to a message (at most `limits.files_per_message_max` per message)."""

    path: str
    name: str | None = None
    mime_type: str | None = None
    size_bytes: int | None = None
    extra: dict[str, Any] = {}


class Message(_Record, frozen=True):
    """One transcript entry: a chat message, or (with `item` set) an item stored verbatim. Fields
    the catalog does not name are kept in `extra`.

    `item` holds a value that is not a chat message (a Responses-API `function_call`, a
    framework's event object as plain data) exactly as given: bytes stay bytes, and it reads
    back equal in value. Such an entry's `role` is ``item`` unless the caller named one."""

    role: str
    content: str | list[Any] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[Any] | None = None
    files: list[FileRef] | None = None
    usage: Usage | None = None
    model: str | None = None
    synthetic: bool = False
    summary: bool = False
    metadata: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    item: Any = None
    sealed: bytes | None = None
    """In an encrypted session: every field but `role`, `usage`, `synthetic` and `summary`, as
    one ciphertext the engine opens on reading (`sessions/_seal.py`); the others are empty. In a
    list of a batch event, the first message's holds the ciphertext of the whole list and the
    others' are empty bytes (older stores hold one ciphertext per message there too)."""


class Event(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type", gc=False
):
    """Base of every payload. Subclasses set an explicit `tag`, which is what is stored."""

    stream_kind: ClassVar[str] = "session"


# The session stream


class SessionOpened(Event, tag="session_opened", frozen=True):
    """First event of a session opened directly (not forked). A sub-agent's `parent_spawn_ref`
    names the parent session and the loop and tool call that spawned it; an encrypted session
    keeps its `loop_id` and `tool_call_id` as digests keyed by its own data key, their texts
    sealed beside them in `sealed_loop_id` and `sealed_tool_call_id`."""

    session_id: str
    created_at: Timestamp
    agent_id: str | None = None
    title: str | None = None
    formation: dict[str, Any] = {}
    scope: str = "persistent"
    system_prompt: str | None = None
    tool_format: str | None = None
    workspace_anchor: dict[str, Any] | None = None
    workspace_policy: dict[str, Any] | None = None
    metadata: dict[str, Any] = {}
    parent_spawn_ref: dict[str, Any] | None = None
    key_slot: int = 0
    """Where the session's data key sits in the store's keyring; 0: the session is not encrypted."""


class SessionForked(Event, tag="session_forked", frozen=True):
    """First event of a child session: it shares the parent's first `keep_first` messages as they
    stood at `parent_version` of the parent's stream."""

    session_id: str
    parent_id: str
    parent_version: int
    created_at: Timestamp
    keep_first: int | None = None
    branched_at_event_index: int | None = None
    title: str | None = None
    key_slot: int = 0
    """The child's own data key (see `SessionOpened.key_slot`); what it shares of its parent stays
    sealed under the parent's key."""


class MessageInjected(Event, tag="message_injected", frozen=True):
    """One message appended to the end of the session's transcript. `idempotency_key`, when
    set, is remembered for the session: a later command with the same key writes nothing. An
    encrypted session stores a digest of the caller's key, keyed by the session's data key."""

    message: Message
    idempotency_key: str | None = None


class MessagesInjected(Event, tag="messages_injected", frozen=True):
    """Several messages appended, in order, by one command (`inject_many`): one record for the
    batch, each message still its own entry of the transcript. `idempotency_key` as for
    `message_injected` (set on the first event of the command)."""

    messages: list[Message]
    idempotency_key: str | None = None


class SessionReset(Event, tag="session_reset", frozen=True):
    """The transcript was emptied; the id, its subscribers and everything else stay."""

    reason: str | None = None


class SessionTrimmed(Event, tag="session_trimmed", frozen=True):
    """Only the last `keep_last` messages stay; `kept_count` is how many that was."""

    keep_last: int
    kept_count: int


class SessionRewound(Event, tag="session_rewound", frozen=True):
    """The transcript was cut back to its first `to_length` entries (`pop`, `rewind`): the
    `removed` entries after them leave the transcript; the log keeps them, and `as_of` a
    position before this event still shows them."""

    to_length: int
    removed: int = 0
    reason: str | None = None


class SessionCompacted(Event, tag="session_compacted", frozen=True):
    """The outcome of a compaction: messages `[replace_start, replace_end)` became `replacement`."""

    strategy: str
    replace_start: int
    replace_end: int
    replacement: list[Message] = []
    tokens_before: int | None = None
    tokens_after: int | None = None


class ScratchpadSet(Event, tag="scratchpad_set", frozen=True):
    """The session's scratchpad was replaced; `version` counts every change."""

    scratchpad: dict[str, Any]
    version: int
    source: str | None = None
    reason: str | None = None
    metadata: dict[str, Any] = {}


class ScratchpadCleared(Event, tag="scratchpad_cleared", frozen=True):
    """The session's scratchpad was emptied."""

    version: int
    source: str | None = None
    reason: str | None = None
    metadata: dict[str, Any] = {}


class LiveSessionClient(Event, tag="live_session_client", frozen=True):
    """A live client attached, took over, detached or sent a heartbeat."""

    client_id: str
    action: str
    mode: str | None = None
    previous_controller_id: str | None = None
    reason: str | None = None
    metadata: dict[str, Any] = {}


class LiveSessionPermissionRoute(Event, tag="live_session_permission_route", frozen=True):
    """A permission request was routed to the session's controlling client."""

    client_id: str
    request: dict[str, Any]
    metadata: dict[str, Any] = {}


class WorkspaceAnchorSet(Event, tag="workspace_anchor_set", frozen=True):
    """The session's workspace anchor was set (or cleared with None)."""

    anchor: dict[str, Any] | None


class WorkspacePolicySet(Event, tag="workspace_policy_set", frozen=True):
    """The session's workspace policy was replaced."""

    policy: dict[str, Any]


class WorkspaceRootAdded(Event, tag="workspace_root_added", frozen=True):
    """A workspace root was mounted, with its mount mode."""

    root: str
    mount_mode: str
    mounted_at: str | None = None


class WorkspaceRootRemoved(Event, tag="workspace_root_removed", frozen=True):
    """A workspace root was unmounted."""

    root: str


class SessionRenamed(Event, tag="session_renamed", frozen=True):
    """The session's title changed."""

    title: str | None


class SessionMetadataSet(Event, tag="session_metadata_set", frozen=True):
    """Keys of the session's metadata set (`metadata`, merged over what was there) and keys
    removed (`removed`), as one change."""

    metadata: dict[str, Any] = {}
    removed: list[str] = []


class SessionDeleted(Event, tag="session_deleted", frozen=True):
    """The session is gone from every query; its events stay in the log."""

    reason: str | None = None


class SessionForgotten(Event, tag="session_forgotten", frozen=True):
    """The session's data key was destroyed (crypto-shredding): its events stay in the log and
    still verify, their sealed content can never be read again. `key_slot` names the key."""

    reason: str | None = None
    key_slot: int = 0


class SessionArchived(Event, tag="session_archived", frozen=True):
    """A retention sweep copied the session's events to the archive `archive` of a sink (a
    sweep's batch shares one archive; `events_count` of the session's lines there, and the blake3
    of those lines, hex); the store then forgets them. Appended to a closed or deleted session."""

    archive: str
    events_count: int
    digest: str


class PromptStarted(Event, tag="prompt_started", frozen=True):
    """The runtime sent `prompt` to `provider` with the merged `params`; the session is busy. An
    encrypted session keeps `request_id` as its digest keyed by the session's data key (which
    every later event of the request repeats, and the runtime's request index holds) and the
    caller's text sealed in `sealed_request_id`; None elsewhere. It keeps `loop_id`,
    `parent_loop_id` and `parallel_group` so too (the loop index holds the digest of `loop_id`),
    their texts sealed in `sealed_loop_id`, `sealed_parent_loop_id` and `sealed_parallel_group`."""

    request_id: str
    prompt: Message
    provider: str | None = None
    params: dict[str, Any] = {}
    loop_id: str | None = None
    parent_loop_id: str | None = None
    parallel_group: str | None = None
    warnings: list[dict[str, Any]] = []
    """Input filters that passed the prompt with a warning: ``{"filter": name, "reason": ...}``."""
    sealed_request_id: str | None = None
    sealed_loop_id: str | None = None
    sealed_parent_loop_id: str | None = None
    sealed_parallel_group: str | None = None


class PromptCompleted(Event, tag="prompt_completed", frozen=True):
    """The provider answered: `reply` joins the transcript, `usage` the totals."""

    request_id: str
    reply: Message
    stop_reason: str | None = None
    usage: Usage = Usage()


class PromptFailed(Event, tag="prompt_failed", frozen=True):
    """The prompt in flight failed. `kind` says why: ``provider`` (the provider failed for good:
    the session is failed), ``transient`` (a failure that may pass, its retries spent: the session
    is idle again), ``context_length`` (the model refused the context as too long: idle again),
    ``invalid_reply`` (an answer the runtime cannot read or record), ``interrupted`` (its process
    stopped), ``runtime``, ``superseded``. Every kind but ``transient`` and ``context_length``
    leaves the session failed."""

    request_id: str
    error: str
    kind: str | None = None


class PromptCancelled(Event, tag="prompt_cancelled", frozen=True):
    """The prompt in flight was cancelled; the session is idle again."""

    request_id: str
    reason: str | None = None


class RuntimeAdopted(Event, tag="runtime_adopted", frozen=True):
    """A session opened elsewhere (seeded, imported, opened directly) is driven by the runtime
    from here on: prompts go to `provider`, with `runtime_params` as the session's layer."""

    provider: str
    agent_id: str | None = None
    runtime_params: dict[str, Any] = {}


class StepCompleted(Event, tag="step_completed", frozen=True):
    """One model call of a prompt's tool loop that asked for tools: `reply` (the assistant message
    with its `tool_calls`) joins the transcript, `usage` the loop's. The calls follow as
    `tool_call_started` / `tool_call_finished`; the loop ends with `prompt_completed`."""

    request_id: str
    step: int
    reply: Message
    stop_reason: str | None = None
    usage: Usage = Usage()


class ToolCallStarted(Event, tag="tool_call_started", frozen=True):
    """The runtime began running tool call `call_id` of the prompt in flight, as the child loop
    `loop_id` of the prompt's loop; calls asked for together share a `parallel_group`."""

    request_id: str
    call_id: str
    name: str
    arguments: dict[str, Any] = {}
    loop_id: str | None = None
    parallel_group: str | None = None


class ToolCallFinished(Event, tag="tool_call_finished", frozen=True):
    """Tool call `call_id` ended: `result` (a `tool` message answering it) joins the transcript.
    `error` and `kind` (tool_error, unknown_tool, cancelled, interrupted, max_steps) say why when
    the tool did not run to an answer; the model still gets a result for every call."""

    request_id: str
    call_id: str
    result: Message
    loop_id: str | None = None
    error: str | None = None
    kind: str | None = None


class InputRejected(Event, tag="input_rejected", frozen=True):
    """An input filter refused a prompt before any provider was called (an encrypted session keeps
    `request_id` as its keyed digest, as `prompt_started` does)."""

    filter: str
    reason: str
    request_id: str | None = None


class AgentSessionClosed(Event, tag="agent_session_closed", frozen=True):
    """The session was closed; its id no longer exists, its history stays in the log."""

    reason: str | None = None
    status: dict[str, Any] = {}


# Context policies (`sessions/_context.py`): what the next model call sees, as recorded outcomes.


class ContextCompacted(Event, tag="context_compacted", frozen=True):
    """A summarization checkpoint: `boundary` (a synthetic user message) and `summary` (the
    assistant's summary), both flagged `summary`, were inserted before transcript message
    `insert_at`. They stand for the `summarized_count` messages before them, from
    `summarized_start`; the context view starts at the latest such pair."""

    insert_at: int
    boundary: Message
    summary: Message
    summarized_start: int = 0
    summarized_count: int = 0
    tokens_before: int = 0
    tokens_after: int = 0


class ContextCompactionFailed(Event, tag="context_compaction_failed", frozen=True):
    """The summarizer failed (raised, or returned something that is not a summary); nothing
    else changed. Recorded so the failure is visible in the history, never fatal."""

    error: str
    kind: str = "summarizer"
    tokens_before: int = 0
    message_count: int = 0


class PrunedResult(_Record, frozen=True):
    """How one tool result is shown in the context view from now on. The message is named by
    its reference: the log position of the event carrying it and its index inside that event.
    `soft_trim` keeps the first `head_chars` and last `tail_chars` characters around `notice`;
    `hard_clear` shows `notice` alone."""

    position: int
    action: str
    chars: int
    notice: str
    index: int = 0
    head_chars: int = 0
    tail_chars: int = 0


class ContextPruned(Event, tag="context_pruned", frozen=True):
    """Large tool results pruned from the context view (the recorded history keeps them)."""

    results: list[PrunedResult]
    aggressive: bool = False
    tokens_before: int = 0
    tokens_after: int = 0


class DoomLoopDetected(Event, tag="doom_loop_detected", frozen=True):
    """`repeats` identical consecutive calls of `tool`: `message`, a synthetic warning saying
    why, joins the transcript."""

    message: Message
    tool: str
    repeats: int


# The bearer stream: keyed by the token's one-way handle, never by the token.


class BearerSessionCreated(Event, tag="bearer_session_created", frozen=True):
    """A bearer session began; only the token's one-way `handle` is recorded."""

    stream_kind: ClassVar[str] = "bearer"

    handle: str
    principal: str
    created_at: Timestamp
    expires_at: Timestamp
    attributes: dict[str, Any] = {}


class BearerSessionTouched(Event, tag="bearer_session_touched", frozen=True):
    """The bearer session was used at `last_seen_at` (which only moves forward)."""

    stream_kind: ClassVar[str] = "bearer"

    last_seen_at: Timestamp


class BearerSessionExpired(Event, tag="bearer_session_expired", frozen=True):
    """The bearer session was revoked for good."""

    stream_kind: ClassVar[str] = "bearer"

    expired_at: Timestamp
    reason: str | None = None


AnyEvent = Union[  # noqa: UP007 - msgspec needs a runtime Union of the tagged classes
    SessionOpened,
    SessionForked,
    MessageInjected,
    SessionReset,
    SessionTrimmed,
    SessionCompacted,
    ScratchpadSet,
    ScratchpadCleared,
    LiveSessionClient,
    LiveSessionPermissionRoute,
    WorkspaceAnchorSet,
    WorkspacePolicySet,
    WorkspaceRootAdded,
    WorkspaceRootRemoved,
    SessionRenamed,
    SessionDeleted,
    PromptStarted,
    PromptCompleted,
    PromptFailed,
    PromptCancelled,
    InputRejected,
    AgentSessionClosed,
    BearerSessionCreated,
    BearerSessionTouched,
    BearerSessionExpired,
    ContextCompacted,
    ContextCompactionFailed,
    ContextPruned,
    DoomLoopDetected,
    RuntimeAdopted,
    MessagesInjected,
    SessionRewound,
    StepCompleted,
    ToolCallStarted,
    ToolCallFinished,
    SessionMetadataSet,
    SessionForgotten,
    SessionArchived,
]

EVENT_TYPES: tuple[type[Event], ...] = AnyEvent.__args__  # type: ignore[attr-defined]


def event_type_name(event: Event) -> str:
    """The stored tag of an event, e.g. ``message_injected``."""
    return str(event.__struct_config__.tag)
