"""A plain model of what a session store should hold: the oracle behind `sessions.testing`.

Dicts and lists written from the documented semantics (seed 001 and the verbs' docstrings), never
from the engine's code: it imports only the message field catalog. `check_store` compares a real
store with the model and raises `AssertionError` naming the first difference; it only reads.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eventlog import events as ev

if TYPE_CHECKING:
    from sessions._store import SessionStore

Message = dict[str, Any]
TokenCounter = Callable[[Mapping[str, Any]], int]

ACTIVE, CLOSED, DELETED = "active", "closed", "deleted"
KNOWN_FIELDS = frozenset(ev.Message.__struct_fields__) - {"extra"}
KEEP_LAST_DEFAULT = 12  # seed 001: `keep_last (int, default 12)`
TOOL_OUTPUT_MAX_CHARS_DEFAULT = 200  # sessions._compact: tool outputs up to 200 chars stay
TEXT_KEYS = ("text", "content", "input", "output")  # the string fields of a content block
SNAPSHOT_FIELDS = (
    "session_id",
    "status",
    "transcript",
    "length",
    "title",
    "parent_id",
    "child_ids",
    "branched_at_event_index",
    "scratchpad",
    "scratchpad_version",
    "live_clients",
    "live_controller_id",
    "workspace_policy",
    "roots",
)


def _expect(condition: bool, message: str) -> None:
    # An explicit raise, so the checks still fire under `python -O`.
    if not condition:
        raise AssertionError(message)


def canonical(message: Mapping[str, Any]) -> Message:
    """A message as the store gives it back: catalog fields left unset (None, or False for the
    `synthetic` / `summary` flags, or `{}` for `metadata`) are absent, and a file given as a bare
    path string reads ``{"path": ...}``; every other key comes back verbatim."""
    out: Message = {}
    for key, value in message.items():
        if key in KNOWN_FIELDS:
            if value is None or (key in ("synthetic", "summary") and value is False):
                continue
            if key == "metadata" and value == {}:
                continue
            if key == "files":
                out[key] = [{"path": f} if isinstance(f, str) else copy.deepcopy(f) for f in value]
                continue
        out[key] = copy.deepcopy(value)
    return out


def is_tool_result(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "tool" or message.get("tool_call_id") is not None


def answers_call(message: Mapping[str, Any]) -> bool:
    """A tool result in either form: the chat one, or content holding a `tool_result` block
    (Anthropic's). Compaction never keeps one without the call before it."""
    content = message.get("content")
    return is_tool_result(message) or (
        isinstance(content, list)
        and any(isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)
    )


def visible_text(content: object) -> str:
    """The text of a message's content: the string itself, or its blocks' strings joined by
    newlines (a block is a string, or a dict whose string `TEXT_KEYS` count)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict):
            parts.extend(block[key] for key in TEXT_KEYS if isinstance(block.get(key), str))
    return "\n".join(parts)


@dataclass
class ModelSession:
    """One session as the model sees it (the latest incarnation of its id)."""

    session_id: str
    status: str = ACTIVE
    title: str | None = None
    transcript: list[Message] = field(default_factory=list)
    parent_id: str | None = None
    child_ids: list[str] = field(default_factory=list)  # every id it forked, once each
    branched_at_event_index: int | None = None
    scratchpad: dict[str, Any] | None = None
    scratchpad_version: int = 0
    clients: dict[str, str] = field(default_factory=dict)  # client id -> mode, attach order
    controller_id: str | None = None
    workspace_policy: dict[str, Any] = field(default_factory=dict)
    roots: list[dict[str, Any]] = field(default_factory=list)


class SessionModel:
    """Every session id the store has seen, with what it should hold. Verbs here assume the
    command is accepted; deciding whether it should be refused is the caller's job (see the
    `is_open`, `controller` and `clients` queries)."""

    def __init__(self, token_counter: TokenCounter) -> None:
        self.token_counter = token_counter
        self.sessions: dict[str, ModelSession] = {}

    def copy(self) -> SessionModel:
        return copy.deepcopy(self)

    # Queries

    def is_open(self, session_id: str) -> bool:
        found = self.sessions.get(session_id)
        return found is not None and found.status == ACTIVE

    def open_ids(self) -> list[str]:
        return [sid for sid, s in self.sessions.items() if s.status == ACTIVE]

    def ids_with_status(self, status: str) -> list[str]:
        return [sid for sid, s in self.sessions.items() if s.status == status]

    def session(self, session_id: str) -> ModelSession:
        found = self.sessions[session_id]
        _expect(found.status == ACTIVE, f"model: `{session_id}` is {found.status}")
        return found

    def child_ids(self, session_id: str) -> list[str]:
        """The ids this incarnation forked, oldest first, each once, while the child still
        names it as parent (closed children stay; an id reopened or re-forked elsewhere goes)."""
        return [
            child
            for child in self.session(session_id).child_ids
            if self.sessions[child].parent_id == session_id
        ]

    def view(self, session_id: str) -> dict[str, Any]:
        """The snapshot fields `check_store` compares, as the model expects them."""
        found = self.session(session_id)
        return {
            "session_id": session_id,
            "status": found.status,
            "transcript": found.transcript,
            "length": len(found.transcript),
            "title": found.title,
            "parent_id": found.parent_id,
            "child_ids": self.child_ids(session_id),
            "branched_at_event_index": found.branched_at_event_index,
            "scratchpad": found.scratchpad,
            "scratchpad_version": found.scratchpad_version,
            "live_clients": list(found.clients.items()),
            "live_controller_id": found.controller_id,
            "workspace_policy": found.workspace_policy,
            "roots": found.roots,
        }

    def ancestry(self, session_id: str) -> dict[str, Any]:
        """Parent links walked up while the parent id still has a record (closed ones too),
        stopping at the first id seen twice."""
        current = self.session(session_id)
        root, parent_id, seen = session_id, current.parent_id, {session_id}
        while parent_id is not None and parent_id not in seen:
            parent = self.sessions.get(parent_id)
            if parent is None:
                break
            seen.add(parent_id)
            root, parent_id = parent_id, parent.parent_id
        children = self.child_ids(session_id)
        return {"parent_id": current.parent_id, "child_ids": children, "root_id": root}

    def depth(self, session_id: str) -> int:
        """How many fork links lead up from the session (cycles counted once)."""
        depth, seen = 0, {session_id}
        parent_id = self.sessions[session_id].parent_id
        while parent_id is not None and parent_id not in seen and parent_id in self.sessions:
            depth, seen = depth + 1, seen | {parent_id}
            parent_id = self.sessions[parent_id].parent_id
        return depth

    # Lifecycle

    def open(
        self,
        session_id: str,
        *,
        title: str | None = None,
        workspace_policy: Mapping[str, Any] | None = None,
    ) -> None:
        """Open a fresh session; opening an open one changes nothing."""
        if not self.is_open(session_id):
            self.sessions[session_id] = ModelSession(
                session_id, title=title, workspace_policy=dict(workspace_policy or {})
            )

    def fork(self, source_id: str, child_id: str, keep_first: int | None = None) -> None:
        """The child starts as a copy of the parent (transcript, scratchpad, title, workspace)
        without its live clients or children; fork_at keeps the first `keep_first` messages."""
        parent = self.session(source_id)
        transcript = parent.transcript if keep_first is None else parent.transcript[:keep_first]
        self.sessions[child_id] = ModelSession(
            child_id,
            title=parent.title,
            transcript=copy.deepcopy(transcript),
            parent_id=source_id,
            branched_at_event_index=None if keep_first is None else len(transcript),
            scratchpad=copy.deepcopy(parent.scratchpad),
            scratchpad_version=parent.scratchpad_version,
            workspace_policy=dict(parent.workspace_policy),
            roots=copy.deepcopy(parent.roots),
        )
        if child_id not in parent.child_ids:
            parent.child_ids.append(child_id)

    def close(self, session_id: str, status: str = CLOSED) -> None:
        found = self.session(session_id)
        found.status = status
        found.clients, found.controller_id = {}, None

    def rename(self, session_id: str, title: str | None) -> None:
        self.session(session_id).title = title

    # Transcript

    def inject(self, session_id: str, message: Mapping[str, Any]) -> None:
        self.session(session_id).transcript.append(canonical(message))

    def reset(self, session_id: str) -> None:
        self.session(session_id).transcript = []

    def trim(self, session_id: str, keep_last: int) -> int:
        found = self.session(session_id)
        found.transcript = found.transcript[max(len(found.transcript) - keep_last, 0) :]
        return len(found.transcript)

    def compact(self, session_id: str, options: Mapping[str, Any]) -> int:
        found = self.session(session_id)
        found.transcript = self.compacted(found.transcript, options)
        return len(found.transcript)

    def tokens(self, messages: list[Message]) -> int:
        return sum(self.token_counter(message) for message in messages)

    def compacted(self, messages: list[Message], options: Mapping[str, Any]) -> list[Message]:
        """What compaction leaves, from the documented rules (`sessions._compact` docstring)."""
        limit = options.get("hard_limit_tokens")
        over_limit = limit is not None and self.tokens(messages) > limit
        threshold = options.get("token_threshold")
        if threshold is not None and self.tokens(messages) <= threshold and not over_limit:
            return messages
        result = self._strategy(options.get("compact_strategy", "truncate"), messages, options)
        if limit is not None and self.tokens(result) > limit:
            result = self._strategy(options.get("hard_limit_strategy", "truncate"), result, options)
            # The oldest message goes with the tool results answering it, until the limit holds
            # or only the newest message (with the results answering it) is left.
            while self.tokens(result) > limit:
                cut = 1
                while cut < len(result) and answers_call(result[cut]):
                    cut += 1
                if cut >= len(result):
                    break
                result = result[cut:]
        return result

    def _strategy(
        self, strategy: str, messages: list[Message], options: Mapping[str, Any]
    ) -> list[Message]:
        if strategy == "custom":
            return [canonical(m) for m in options["custom_compactor"](copy.deepcopy(messages))]
        # The newest keep_last stay; a tool result at the boundary pulls its call in too.
        first_kept = max(len(messages) - options.get("keep_last", KEEP_LAST_DEFAULT), 0)
        while 0 < first_kept < len(messages) and answers_call(messages[first_kept]):
            first_kept -= 1
        older, newer = messages[:first_kept], messages[first_kept:]
        if not older:
            return messages
        if strategy == "truncate":
            return newer
        if strategy == "llm":
            summary = options["summarizer"](copy.deepcopy(older))
            flags = {"synthetic": True, "summary": True}
            return [
                {"role": "user", "content": f"[summary of the {len(older)} earlier messages]"}
                | flags,
                {"role": "assistant", "content": summary} | flags,
                *newer,
            ]
        _expect(strategy == "observation_mask", f"model: unknown strategy {strategy!r}")
        masked = [self._masked(message, options) for message in older]
        compress = options.get("compress_callback")
        if compress is not None:
            masked = [canonical(m) for m in compress(copy.deepcopy(masked))]
        return masked + newer

    @staticmethod
    def _masked(message: Message, options: Mapping[str, Any]) -> Message:
        text = visible_text(message.get("content"))
        limit = options.get("tool_output_max_chars", TOOL_OUTPUT_MAX_CHARS_DEFAULT)
        if not is_tool_result(message) or len(text) <= limit:
            return message
        mask = options.get("mask_callback")
        if mask is None:
            return {**message, "content": f"[tool output masked: {len(text)} characters]"}
        placeholder = mask(copy.deepcopy(message))
        if isinstance(placeholder, Mapping):
            return canonical(placeholder)
        return {**message, "content": placeholder}

    # Scratchpad

    def set_scratchpad(self, session_id: str, scratchpad: Mapping[str, Any]) -> int:
        found = self.session(session_id)
        found.scratchpad = copy.deepcopy(dict(scratchpad))
        found.scratchpad_version += 1
        return found.scratchpad_version

    def clear_scratchpad(self, session_id: str) -> int:
        found = self.session(session_id)
        found.scratchpad = None
        found.scratchpad_version += 1
        return found.scratchpad_version

    # Live clients: many observers, at most one controller.

    def controller(self, session_id: str) -> str | None:
        return self.session(session_id).controller_id

    def clients(self, session_id: str) -> dict[str, str]:
        return self.session(session_id).clients

    def attach(self, session_id: str, client_id: str, mode: str) -> None:
        """Attach (or re-attach, keeping its place) as `mode`. The caller refuses a second
        controller without takeover; a controller re-attaching as observer gives up control."""
        found = self.session(session_id)
        if mode == "controller":
            self.takeover(session_id, client_id)
            return
        if found.controller_id == client_id:
            found.controller_id = None
        found.clients[client_id] = "observer"

    def takeover(self, session_id: str, client_id: str) -> None:
        found = self.session(session_id)
        previous = found.controller_id
        if previous is not None and previous != client_id:
            found.clients[previous] = "observer"
        found.controller_id = client_id
        found.clients[client_id] = "controller"

    def detach(self, session_id: str, client_id: str) -> bool:
        """Returns whether control was released."""
        found = self.session(session_id)
        del found.clients[client_id]
        released = found.controller_id == client_id
        if released:
            found.controller_id = None
        return released

    def client_inject_prompt(
        self, session_id: str, client_id: str, content: Any, opts: Mapping[str, Any]
    ) -> None:
        """A user message whose metadata records the controller (`live_session.client_id`)."""
        metadata = dict(opts.get("metadata") or {})
        live = {**metadata.get("live_session", {}), "client_id": client_id}
        message = {
            "role": "user",
            "content": content,
            "name": opts.get("name"),
            "metadata": {**metadata, "live_session": live},
        }
        self.inject(session_id, message)

    # Workspace

    def set_workspace_policy(self, session_id: str, policy: Mapping[str, Any]) -> bool:
        found = self.session(session_id)
        merged = {**found.workspace_policy, **policy}
        changed = merged != found.workspace_policy
        found.workspace_policy = merged
        return changed

    def add_root(self, session_id: str, root: str, mount_mode: str | None) -> str:
        """Mount (or re-mount, moving it last) a root; the mode defaults to the policy's."""
        found = self.session(session_id)
        mode = mount_mode or found.workspace_policy.get("default_mount_mode") or "read_write"
        found.roots = [r for r in found.roots if r["root"] != root]
        found.roots.append({"root": root, "mount_mode": mode})
        return str(mode)

    def remove_root(self, session_id: str, root: str) -> bool:
        found = self.session(session_id)
        kept = [r for r in found.roots if r["root"] != root]
        removed = len(kept) != len(found.roots)
        found.roots = kept
        return removed


def observed(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The snapshot fields `check_store` compares, as the store reports them."""
    view = {key: snapshot[key] for key in SNAPSHOT_FIELDS}
    view["live_clients"] = [(c["client_id"], c["mode"]) for c in snapshot["live_clients"]]
    return view


def _listed(store: SessionStore, status: str) -> list[str]:
    """Every session id `list_sessions` reports with `status`, paging by seven."""
    ids: list[str] = []
    cursor: str | None = None
    while True:
        page = store.list_sessions(cursor=cursor, limit=7, status=status)
        ids.extend(item["session_id"] for item in page["sessions"])
        cursor = page["next_cursor"]
        if cursor is None:
            return ids


def check_store(store: SessionStore, model: SessionModel) -> None:
    """Raise `AssertionError` naming the first way `store` disagrees with `model`."""
    for sid, expected in model.sessions.items():
        if expected.status == CLOSED:  # no longer open, still readable, marked closed
            _expect(not store.exists(sid), f"closed session `{sid}` still exists")
            closed = store.snapshot(sid)
            _expect(closed is not None, f"closed `{sid}` has no snapshot")
            assert closed is not None
            _expect(closed["status"] == CLOSED, f"closed `{sid}` is {closed['status']}")
            _expect(closed["transcript"] == expected.transcript, f"transcript of closed `{sid}`")
            _expect(store.ancestry(sid) is not None, f"closed `{sid}` has no ancestry")
            continue
        if expected.status != ACTIVE:
            _expect(not store.exists(sid), f"{expected.status} session `{sid}` still exists")
            _expect(store.snapshot(sid) is None, f"{expected.status} `{sid}` has a snapshot")
            _expect(store.ancestry(sid) is None, f"{expected.status} `{sid}` has an ancestry")
            continue
        snapshot = store.snapshot(sid)
        _expect(snapshot is not None and store.exists(sid), f"open session `{sid}` is missing")
        assert snapshot is not None
        got, want = observed(snapshot), model.view(sid)
        diff = {key: (got[key], want[key]) for key in want if got[key] != want[key]}
        _expect(not diff, f"session `{sid}`: (store, model) differ in {diff}")
        _expect(store.length(sid) == len(expected.transcript), f"length of `{sid}`")
        _expect(store.messages(sid) == expected.transcript, f"messages of `{sid}`")
        ancestry, wanted = store.ancestry(sid), model.ancestry(sid)
        _expect(ancestry == wanted, f"ancestry of `{sid}`: store {ancestry} != model {wanted}")
    for status in (ACTIVE, CLOSED, DELETED):
        listed, wanted_ids = sorted(_listed(store, status)), sorted(model.ids_with_status(status))
        _expect(listed == wanted_ids, f"{status} sessions: store {listed} != model {wanted_ids}")
