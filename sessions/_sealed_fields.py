"""What an encrypted session keeps of each event's fields, by event type: the tables the sealer
(`sessions/_seal.py`) seals, keys and opens by. Data about the event catalog only: nothing here
holds a key or touches storage.

What is sealed: every message (all of it but its role, usage and the synthetic and summary flags,
as one ciphertext in `Message.sealed`), titles, the system prompt, tool arguments, error texts,
input filters' and cancelled prompts' reasons, a caller's reasons and sources of rewinds,
scratchpad changes and live clients, and the values of metadata (the session's, a live client's,
a scratchpad change's), scratchpads and permission requests (their keys stay readable, so the
projections merge them without a key). A caller's idempotency key and a prompt's request id and loop
ids are kept as digests under the session's key (`Keyring.keyed`), which the projection indexes
without a key; `prompt_started` keeps their texts sealed beside the digests, and a sub-agent's
`parent_spawn_ref` its parent's loop and tool call ids so too.
What stays readable: stream ids, positions, versions, kinds, times, counts, ids of forks and
clients: `verify`, the projections and paging need no key.
"""

from __future__ import annotations

from eventlog import events as ev

MESSAGES: dict[type[ev.Event], tuple[str, ...]] = {
    ev.MessageInjected: ("message",),
    ev.PromptStarted: ("prompt",),
    ev.PromptCompleted: ("reply",),
    ev.StepCompleted: ("reply",),
    ev.ToolCallFinished: ("result",),
    ev.DoomLoopDetected: ("message",),
    ev.ContextCompacted: ("boundary", "summary"),  # indexes 0 and 1, as `message_of` reads them
}
MESSAGE_LISTS: dict[type[ev.Event], str] = {
    ev.MessagesInjected: "messages",
    ev.SessionCompacted: "replacement",
}
TEXTS: dict[type[ev.Event], tuple[str, ...]] = {
    ev.SessionOpened: ("title", "system_prompt"),
    ev.SessionForked: ("title",),
    ev.SessionRenamed: ("title",),
    ev.PromptFailed: ("error",),
    ev.PromptCancelled: ("reason",),  # the caller's reason for closing may quote the session
    ev.ToolCallFinished: ("error",),
    ev.ContextCompactionFailed: ("error",),
    ev.InputRejected: ("reason",),  # a filter's reason (or error) may quote the prompt
    # A caller's free text on a change (why it rewound, who set the scratchpad and why): no
    # projection reads it, and it may say anything the session does.
    ev.SessionRewound: ("reason",),
    ev.SessionReset: ("reason",),
    ev.ScratchpadSet: ("source", "reason"),
    ev.ScratchpadCleared: ("source", "reason"),
    ev.LiveSessionClient: ("reason",),
}
VALUES: dict[type[ev.Event], tuple[str, ...]] = {
    ev.SessionOpened: ("metadata",),
    ev.SessionMetadataSet: ("metadata",),
    ev.ScratchpadSet: ("scratchpad", "metadata"),
    ev.ScratchpadCleared: ("metadata",),
    ev.LiveSessionPermissionRoute: ("request", "metadata"),
    ev.LiveSessionClient: ("metadata",),
    ev.ToolCallStarted: ("arguments",),
}
VALUE_LISTS: dict[type[ev.Event], str] = {
    ev.PromptStarted: "warnings",  # input filters' warnings: their reasons may quote the prompt
}
"""Lists of records whose values are sealed, but for their `filter` (a name)."""
KEYED: dict[type[ev.Event], tuple[str, ...]] = {
    ev.MessageInjected: ("idempotency_key",),
    ev.MessagesInjected: ("idempotency_key",),
    ev.PromptStarted: ("request_id", "loop_id", "parent_loop_id", "parallel_group"),
    ev.InputRejected: ("request_id",),
}
"""A caller's text that the projection indexes or the runtime finds, kept as its keyed digest
(`Keyring.keyed`). A request id enters the log in `prompt_started` and `input_rejected`, and
a prompt's loop ids in `prompt_started`; the events after it name them as the projection holds
them (`runtime/_jobs.py`), so ids stored in the clear before still match."""
SHOWN: dict[type[ev.Event], tuple[str, ...]] = {
    ev.PromptStarted: ("request_id", "loop_id", "parent_loop_id", "parallel_group"),
}
"""Keyed fields whose text is also sealed beside the digest, in `sealed_<field>`, for the
runtime's answers to show while the key lives."""
KEYED_REFS: dict[type[ev.Event], tuple[str, tuple[str, ...]]] = {
    ev.SessionOpened: ("parent_spawn_ref", ("loop_id", "tool_call_id")),
}
"""Ids a caller gives inside a record field, kept as KEYED's are (a digest under the session's
key) with the text sealed beside it in the record, in `sealed_<key>`: a sub-agent's reference
to the loop and tool call of its parent that spawned it. The rest of the record stays readable
(the parent's `session_id` is ancestry; `keyed_loop_id` is already the parent's own digest)."""
SEALED_KINDS = frozenset((*MESSAGES, *MESSAGE_LISTS, *TEXTS, *VALUES, *VALUE_LISTS, *KEYED_REFS))
READABLE_METADATA = frozenset(("provider", "runtime_params"))
"""Metadata keys whose values stay readable: the runtime's binding of a session (which provider
drives it, with which settings), which its projection reads without a key."""
