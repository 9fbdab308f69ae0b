"""Session bundles v1 out of a store: `export_bundle` and the shape of every section.

Export is deterministic: the bundle describes the session as of its last event, so `created_at` is
that event's time and `bundle_id` is a digest of the content; the same state exports to the same
bytes. It only reads the store. Redaction is `replay._redact`'s; import is `replay._import`'s.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from importlib import metadata as pkg_metadata
from typing import Any

from eventlog import Envelope, limits, to_builtins
from replay._redact import (
    MODES,
    PROMPT_PAYLOAD,
    WITHHELD,
    RedactionEntry,
    manifest,
    redact,
)
from replay._validate import BUNDLE_TYPE, PRODUCER, SCHEMA_ID, SCHEMA_VERSION, bundle_id
from sessions import ConcurrencyError, InvalidArgumentError, SessionStore, UnknownSessionError
from sessions._collector import collector_paused

IMPORTED_FROM = "imported_from"
IMPORTED_LINEAGE = "imported_lineage"
IMPORTED_SPAWN_REF = "imported_spawn_ref"
_PAGE_EVENTS = 1_000
_READ_ATTEMPTS = 5  # a writer appending while we read makes us read again, this many times
# An `item` keeps bytes and aware datetimes, which JSON has no type for: export writes them as
# {"~bytes": base64} and {"~datetime": RFC 3339}, and a real key beginning with `~` gets one more.
ITEM_MARK = "~"
_BYTES_MARK = "~bytes"
_DATETIME_MARK = "~datetime"
_FORMAT_NOTE = (
    "A sessionlog session as a portable session bundle v1; share sanitized or replay_only "
    "bundles, keep local ones on the machine that made them."
)


DISTRIBUTION = "sessionlog-engine"
"""The name this project is published under (`sessionlog` on the package index is another's)."""


def _version() -> str:
    try:
        return pkg_metadata.version(DISTRIBUTION)
    except pkg_metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


def _withhold_title(body: dict[str, Any]) -> list[RedactionEntry]:
    """replay_only: the session's title is often its first prompt (an agent-log import makes it
    so), so it leaves the source and the section's metadata, and the label names the id only."""
    entries: list[RedactionEntry] = []
    if body["source"]["workflow_name"] is not None:
        body["source"]["workflow_name"] = WITHHELD
        entries.append(
            RedactionEntry("$.source.workflow_name", PROMPT_PAYLOAD, "withheld", WITHHELD)
        )
    for i, section in enumerate(body["transcript"]["sections"]):
        where = f"$.transcript.sections[{i}]"
        label = f"Session {section['id']}"
        if section["label"] != label:
            section["label"] = label
            entries.append(RedactionEntry(f"{where}.label", PROMPT_PAYLOAD, "replaced", label))
        titled = [(f"{where}.metadata", section["metadata"])] + [
            (f"{where}.events[{j}].event", event["event"])
            for j, event in enumerate(section["events"])
            if isinstance(event.get("event"), dict)
        ]
        for at, holder in titled:
            if isinstance(holder.get("title"), str) and holder["title"] != WITHHELD:
                holder["title"] = WITHHELD
                entries.append(RedactionEntry(f"{at}.title", PROMPT_PAYLOAD, "withheld", WITHHELD))
    return entries


def _hash_arguments(body: dict[str, Any]) -> None:
    """Each tool call's `args_hash`: the digest of the arguments as the bundle carries them, so
    equal calls still share it, but a sanitized or replay_only bundle's hash cannot confirm a
    guess at what redaction took out (a digest of the original arguments would)."""
    for call in body["tools"]["calls"]:
        call["args_hash"] = hashlib.sha256(_canonical(call["arguments"])).hexdigest()


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# Export


def export_bundle(
    store: SessionStore,
    session_id: str,
    mode: str = "sanitized",
    *,
    progress: Callable[[int, int], object] | None = None,
) -> dict[str, Any]:
    """The session bundle v1 of a session (open or closed), redacted for `mode` (`local`,
    `sanitized`, `replay_only`). Raises `UnknownSessionError` for an unknown or deleted id.

    Inside a message's `item`, bytes are written as `{"~bytes": "<base64>"}` and timezone-aware
    datetimes as `{"~datetime": "<RFC 3339>"}`, and a key that begins with `~` as one more `~`
    in front, so that `import_bundle` restores them as they were.

    `progress(done, total)`, if given, is called as the work goes: once per page of events read,
    then once per thousand messages or events redacted. A step is one event read, one message
    redacted or one event redacted, so `total` is twice the events plus the messages."""
    if mode not in MODES:
        raise InvalidArgumentError(
            f"export_bundle: `mode` must be one of {', '.join(MODES)}, got {mode!r}"
        )
    steps = _Steps(progress)
    with collector_paused():
        snapshot, ancestry, envelopes = _read_session(store, session_id, steps)
        try:
            body, redaction_entries = redact(
                _body(snapshot, ancestry, envelopes), mode, pulse=steps.advance
            )
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"export_bundle: session `{session_id}` holds data JSON cannot carry: {exc}"
            ) from exc
    steps.finish()
    if mode == "replay_only":
        redaction_entries = sorted(
            redaction_entries + _withhold_title(body), key=lambda entry: entry.path
        )
    _hash_arguments(body)
    bundle = {**body, "redaction": manifest(mode, redaction_entries)}
    bundle["bundle_id"] = bundle_id(bundle)
    return {key: bundle[key] for key in sorted(bundle)}


class _Steps:
    """The progress of one export, as `progress(done, total)` calls that never go backwards."""

    def __init__(self, hook: Callable[[int, int], object] | None) -> None:
        self.hook = hook
        self.done = 0
        self.total = 0

    def start(self, events: int, messages: int) -> None:
        self.total = max(self.total, 2 * events + messages)
        self._emit()

    def read(self, events: int) -> None:
        self.done = max(self.done, min(events, self.total))
        self._emit()

    def advance(self, steps: int) -> None:
        self.done = min(self.done + steps, self.total)
        self._emit()

    def finish(self) -> None:
        self.done = self.total
        self._emit()

    def _emit(self) -> None:
        if self.hook is not None:
            self.hook(self.done, self.total)


def _read_session(
    store: SessionStore, session_id: str, steps: _Steps
) -> tuple[dict[str, Any], dict[str, Any], list[Envelope]]:
    """The snapshot, ancestry and stream of a session, read so that they agree: if a writer
    appends to the stream meanwhile, read again."""
    if not isinstance(session_id, str):
        raise InvalidArgumentError(
            f"export_bundle: `session_id` must be a str, got {type(session_id).__name__}"
        )
    version = -1
    for _ in range(_READ_ATTEMPTS):
        snapshot = store.snapshot(session_id)
        ancestry = store.ancestry(session_id)
        if snapshot is None or ancestry is None:
            raise UnknownSessionError(session_id, "export_bundle")
        steps.start(store.log.stream_version(session_id), len(snapshot["transcript"]))
        envelopes: list[Envelope] = []
        while True:
            page = store.log.read_stream(session_id, after=len(envelopes), limit=_PAGE_EVENTS)
            envelopes.extend(page)
            steps.read(len(envelopes))
            if len(page) < _PAGE_EVENTS:
                break
        version = store.log.stream_version(session_id)
        if version == len(envelopes) and store.snapshot(session_id) == snapshot:
            return snapshot, ancestry, envelopes
    raise ConcurrencyError(session_id, "a stream that stays still while it is exported", version)


def _lineage(snapshot: Mapping[str, Any], ancestry: Mapping[str, Any]) -> dict[str, Any]:
    """Parent, root, branch point and children; a session made by `import_bundle` with no real
    parent reports the lineage it was imported with (its own new children added)."""
    children = list(ancestry["child_ids"])
    imported = (snapshot.get("metadata") or {}).get(IMPORTED_LINEAGE)
    if ancestry["parent_id"] is None and isinstance(imported, Mapping):
        # Metadata is the caller's to change: what is not of its type is left out, not guessed.
        found = imported.get("child_ids")
        before = [c for c in found if isinstance(c, str)] if isinstance(found, list) else []
        branched = imported.get("branched_at_event_index")
        return {
            "parent_id": _id_or_none(imported.get("parent_id")),
            "root_id": _id_or_none(imported.get("root_id")) or snapshot["session_id"],
            "branched_at_event_index": (
                branched if type(branched) is int and branched >= 0 else None
            ),
            "child_ids": before + [c for c in children if c not in before],
        }
    return {
        "parent_id": ancestry["parent_id"],
        "root_id": ancestry["root_id"],
        "branched_at_event_index": snapshot["branched_at_event_index"],
        "child_ids": children,
    }


def mark_item(value: Any) -> Any:
    """`value` (an `item`, at most `value_depth_max` deep) with its bytes and datetimes as
    marked objects and its keys beginning with `ITEM_MARK` escaped."""
    if isinstance(value, bytes):
        return {_BYTES_MARK: base64.b64encode(value).decode()}
    if isinstance(value, datetime):
        return {_DATETIME_MARK: _rfc3339(value)}
    if isinstance(value, list):
        return [mark_item(v) for v in value]
    if isinstance(value, dict):
        return {
            (ITEM_MARK + k if k.startswith(ITEM_MARK) else k): mark_item(v)
            for k, v in value.items()
        }
    return value


def unmark_item(value: Any, depth: int = 0) -> Any:
    """What `mark_item` was given. A marked value that does not decode (a placeholder a
    sanitized export left in its place) stays the text it is; below `value_depth_max` nothing
    is touched (the engine refuses such an item)."""
    if depth > limits.value_depth_max or not isinstance(value, (list, dict)):
        return value
    if isinstance(value, list):
        return [unmark_item(v, depth + 1) for v in value]
    if len(value) == 1:
        ((key, text),) = value.items()
        if key == _BYTES_MARK and isinstance(text, str):
            try:
                return base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                return text
        if key == _DATETIME_MARK and isinstance(text, str):
            try:
                at = datetime.fromisoformat(text)
            except ValueError:
                return text
            return at if at.tzinfo is not None else text
    return {
        (k[len(ITEM_MARK) :] if k.startswith(ITEM_MARK) else k): unmark_item(v, depth + 1)
        for k, v in value.items()
    }


def _marked(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("item") is None:
        return message
    return {**message, "item": mark_item(message["item"])}


def _id_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _event(envelope: Envelope) -> dict[str, Any]:
    # The payload sits under `event`, not `data`: `data` is a prompt-payload key, and replay_only
    # must withhold the prompts inside an event, not the whole record of what happened.
    return {
        "position": envelope.position,
        "version": envelope.version,
        "type": envelope.type,
        "recorded_at": _rfc3339(envelope.recorded_at),
        "hash": envelope.hash.hex(),
        "meta": to_builtins(envelope.meta),
        "event": to_builtins(envelope.data),
    }


def _body(
    snapshot: dict[str, Any], ancestry: dict[str, Any], envelopes: list[Envelope]
) -> dict[str, Any]:
    sid = snapshot["session_id"]
    lineage = _lineage(snapshot, ancestry)
    messages = [_marked(message) for message in snapshot["transcript"]]
    events = [_event(envelope) for envelope in envelopes]
    created_at = _rfc3339(envelopes[-1].recorded_at)
    models = sorted({m["model"] for m in messages if isinstance(m.get("model"), str)})
    return {
        "_type": BUNDLE_TYPE,
        "schema_version": SCHEMA_VERSION,
        "bundle_id": "",
        "created_at": created_at,
        "producer": {"name": PRODUCER, "version": _version(), "schema_id": SCHEMA_ID},
        "source": {
            "kind": "sessionlog_session",
            "run_record_id": sid,
            "session_id": sid,
            "workflow_id": snapshot["agent_id"] or PRODUCER,
            "workflow_name": snapshot["title"],
            "task": snapshot["title"] or "",
            "status": snapshot["status"],
            "started_at": snapshot["created_at"],
            "finished_at": None,
            "persisted_path": None,
            "parent_run_id": lineage["parent_id"],
            "root_run_id": lineage["root_id"],
            "child_run_count": len(lineage["child_ids"]),
            "lineage": lineage,
        },
        "runtime": {
            "harn_version": "none",  # no Harn runtime took part; the engine is named below
            "provider_models": models,
            "usage": _usage(messages, models),
            "metadata": {"engine": PRODUCER, "engine_version": _version()},
        },
        "workspace": _workspace(snapshot),
        "transcript": {"sections": [_section(snapshot, lineage, messages, events)]},
        "tools": {"schemas": _tool_schemas(snapshot), "calls": _tool_calls(messages)},
        "permissions": _permissions(events),
        "replay": _replay(sid, events),
        "attachments": [],
        "metadata": {"format_note": _FORMAT_NOTE},
    }


SESSION_FIELDS = (
    "title",
    "agent_id",
    "system_prompt",
    "tool_format",
    "metadata",
    "formation",
    "scope",
    "parent_spawn_ref",
    "workspace_anchor",
    "workspace_policy",
    "roots",
    "scratchpad",
)
"""What a session is, besides its messages, as a bundle's section carries it and an import restores
it (identity, times, status and live clients aside)."""


def _section(
    snapshot: Mapping[str, Any],
    lineage: dict[str, Any],
    messages: list[dict[str, Any]],
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    sid = snapshot["session_id"]
    keys = (
        "session_id",
        "created_at",
        "status",
        *SESSION_FIELDS,
        "scratchpad_version",
        "live_clients",
        "live_controller_id",
    )
    metadata = {key: snapshot.get(key) for key in keys}
    imported_ref = (snapshot.get("metadata") or {}).get(IMPORTED_SPAWN_REF)
    if metadata["parent_spawn_ref"] is None and isinstance(imported_ref, Mapping):
        metadata["parent_spawn_ref"] = dict(imported_ref)  # as it was before the import
    metadata["lineage"] = lineage
    metadata["transcript_version"] = snapshot["version"]
    return {
        "id": sid,
        "label": f"Session {snapshot['title'] or sid}",
        "scope": "session",
        "location": f"$.sessions[{json.dumps(sid, ensure_ascii=False)}]",
        "summary": None,
        "messages": messages,
        "events": events,
        "assets": [],
        "metadata": metadata,
    }


def _usage(messages: list[dict[str, Any]], models: list[str]) -> dict[str, Any]:
    names = (
        "input_tokens",
        "output_tokens",
        "reasoning_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
    )
    totals = dict.fromkeys(names, 0)
    calls = 0
    for message in messages:
        usage = message.get("usage")
        if not isinstance(usage, Mapping):
            continue
        calls += 1
        for name in names:
            count = usage.get(name)
            if isinstance(count, int) and not isinstance(count, bool):
                totals[name] += count
    return {**totals, "call_count": calls, "models": models}


def _workspace(snapshot: Mapping[str, Any]) -> dict[str, Any] | None:
    anchor = snapshot.get("workspace_anchor") or {}
    roots = snapshot.get("roots") or []
    if not anchor and not roots:
        return None
    return {
        "primary": anchor.get("root"),
        "anchored_at": anchor.get("anchored_at"),
        "additional_roots": [
            {
                "path": r.get("root"),
                "mount_mode": r.get("mount_mode"),
                "mounted_at": r.get("mounted_at"),
            }
            for r in roots
        ],
        # `policy` is the label bundle readers expect; the engine's policy dict rides beside it.
        "policy": "safe_identity_only",
        "mount_policy": snapshot.get("workspace_policy"),
    }


def _tool_schemas(snapshot: Mapping[str, Any]) -> list[dict[str, Any]]:
    schemas = (snapshot.get("metadata") or {}).get("tool_schemas")
    if not isinstance(schemas, list):
        return []
    return [
        {"source": "session.metadata.tool_schemas", "index": i, "value": value}
        for i, value in enumerate(schemas)
    ]


def _call_parts(call: Mapping[str, Any]) -> tuple[object, str, object]:
    """(id, tool name, arguments) of a tool call in the OpenAI, flat or Anthropic shape."""
    function = call.get("function")
    function = function if isinstance(function, Mapping) else {}
    call_id = call.get("id", call.get("tool_use_id", call.get("call_id")))
    name = function.get("name", call.get("name"))
    arguments = function.get("arguments", call.get("arguments", call.get("input")))
    return call_id, name if isinstance(name, str) else "", arguments


def _tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every tool call of the transcript with its result: the first `tool` message answering
    its `tool_call_id` (None when no message answers it)."""
    answers: dict[str, int] = {}
    for index, message in enumerate(messages):
        answer_id = message.get("tool_call_id")
        if message.get("role") == "tool" and isinstance(answer_id, str):
            answers.setdefault(answer_id, index)
    calls: list[dict[str, Any]] = []
    iteration = 0
    for index, message in enumerate(messages):
        requested = message.get("tool_calls")
        if not isinstance(requested, list) or not requested:
            continue
        iteration += 1
        for call in requested:
            if not isinstance(call, Mapping):
                continue
            call_id, name, arguments = _call_parts(call)
            found = answers.get(call_id) if isinstance(call_id, str) else None
            calls.append(
                {
                    "tool_name": name,
                    "tool_use_id": call_id if isinstance(call_id, str) else "",
                    "args_hash": "",  # of the arguments as exported: `_hash_arguments`
                    "arguments": arguments,
                    "result": None if found is None else messages[found].get("content"),
                    "is_rejected": False,
                    "iteration": iteration,
                    "message_index": index,
                    "result_message_index": found,
                }
            )
    return calls


def _permissions(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    routes: list[dict[str, Any]] = []
    for event in events:
        if event["type"] != "live_session_permission_route":
            continue
        data = event["event"]
        request = data.get("request") or {}
        request_id = request.get("request_id", request.get("id"))
        routes.append(
            {
                "kind": "permission_route",
                "source": "session.events",
                "request_id": request_id if isinstance(request_id, str) else None,
                "agent": data.get("client_id"),
                "position": event["position"],
                "version": event["version"],
                "recorded_at": event["recorded_at"],
                "payload": {
                    "client_id": data.get("client_id"),
                    "request": request,
                    "metadata": data.get("metadata") or {},
                },
            }
        )
    return routes


def _replay(session_id: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    clients = [
        {
            "position": e["position"],
            "version": e["version"],
            "recorded_at": e["recorded_at"],
            **{k: v for k, v in e["event"].items() if k != "type"},
        }
        for e in events
        if e["type"] == "live_session_client"
    ]
    pointer = {
        "kind": "sessionlog_stream",
        "topic": session_id,
        "path": None,
        "location": "$.transcript.sections[0].events",
        "available": True,
        "stream_version": len(events),
        "first_position": events[0]["position"],
        "last_position": events[-1]["position"],
        "last_hash": events[-1]["hash"],
    }
    keys = ("position", "version", "type", "recorded_at", "hash")
    return {
        "replay_fixture": None,
        "run_record": None,
        "event_log_pointers": [pointer],
        "transitions": [],
        "checkpoints": [],
        "trace_spans": [],
        "verification_outcomes": [],
        "deterministic_events": [
            {"source": "session.events", "index": i, "value": {k: e[k] for k in keys}}
            for i, e in enumerate(events)
        ],
        "live_client_events": clients,
    }
