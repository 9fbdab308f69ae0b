"""Session bundles v1 out of a store (`export_bundle`) and back in (`import_bundle`).

Export is deterministic: the bundle describes the session as of its last event, so `created_at` is
that event's time and `bundle_id` is a digest of the content; the same state exports to the same
bytes. Import creates the session under the bundle's id in one atomic commit, with its transcript,
system prompt, tool format, workspace, scratchpad and metadata. Lineage cannot be recreated as a
real fork (the parent's log is not in the bundle), so it is kept as *imported lineage* in the
session's metadata (`metadata.imported_lineage`), and a later export of the imported session reports
it: a `local` bundle round-trips to the same transcript and lineage. Where the session came from is
kept in `metadata.imported_from`. Sanitized and replay_only bundles import as they are: placeholder
text (`[redacted]`, `<redacted:...>`, `[withheld]`) becomes the imported text. Live clients and
permission routes are evidence of past connections and are not recreated.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata as pkg_metadata
from typing import Any

from eventlog import Envelope, to_builtins
from replay._redact import MODES, manifest, redact
from replay._validate import (
    BUNDLE_TYPE,
    SCHEMA_ID,
    SCHEMA_VERSION,
    BundleError,
    BundleIssue,
    check_bundle,
)
from sessions import (
    ConcurrencyError,
    InvalidArgumentError,
    SessionExistsError,
    SessionStore,
    UnknownSessionError,
)

PRODUCER = "sessionlog"
IMPORTED_FROM = "imported_from"
IMPORTED_LINEAGE = "imported_lineage"
_PAGE_EVENTS = 1_000
_READ_ATTEMPTS = 5  # a writer appending while we read makes us read again, this many times
_FORMAT_NOTE = (
    "A sessionlog session as a portable session bundle v1; share sanitized or replay_only "
    "bundles, keep local ones on the machine that made them."
)
# What an imported session is compared on when the same id already exists.
_COMPARED = (
    "transcript",
    "system_prompt",
    "tool_format",
    "title",
    "agent_id",
    "metadata",
    "formation",
    "scope",
    "parent_spawn_ref",
    "workspace_anchor",
    "workspace_policy",
    "roots",
    "scratchpad",
)


class BundleConflictError(SessionExistsError):
    """`import_bundle` found the bundle's session id already holding different content."""


def _version() -> str:
    try:
        return pkg_metadata.version("sessionlog")
    except pkg_metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# Export


def export_bundle(store: SessionStore, session_id: str, mode: str = "sanitized") -> dict[str, Any]:
    """The session bundle v1 of an open session, redacted for `mode` (`local`, `sanitized`,
    `replay_only`). Raises `UnknownSessionError` for an unknown id."""
    if mode not in MODES:
        raise InvalidArgumentError(
            f"export_bundle: `mode` must be one of {', '.join(MODES)}, got {mode!r}"
        )
    snapshot, ancestry, envelopes = _read_session(store, session_id)
    try:
        body, redaction_entries = redact(_body(snapshot, ancestry, envelopes), mode)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"export_bundle: session `{session_id}` holds data JSON cannot carry: {exc}"
        ) from exc
    bundle = {**body, "redaction": manifest(mode, redaction_entries)}
    digest = hashlib.sha256(_canonical({**bundle, "bundle_id": ""})).hexdigest()
    bundle["bundle_id"] = f"bundle_{digest[:32]}"
    return {key: bundle[key] for key in sorted(bundle)}


def _read_session(
    store: SessionStore, session_id: str
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
        envelopes: list[Envelope] = []
        while True:
            page = store.log.read_stream(session_id, after=len(envelopes), limit=_PAGE_EVENTS)
            envelopes.extend(page)
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
        before = [c for c in imported.get("child_ids") or [] if isinstance(c, str)]
        return {
            "parent_id": imported.get("parent_id"),
            "root_id": imported.get("root_id") or snapshot["session_id"],
            "branched_at_event_index": imported.get("branched_at_event_index"),
            "child_ids": before + [c for c in children if c not in before],
        }
    return {
        "parent_id": ancestry["parent_id"],
        "root_id": ancestry["root_id"],
        "branched_at_event_index": snapshot["branched_at_event_index"],
        "child_ids": children,
    }


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
    messages = snapshot["transcript"]
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
        "transcript": {"sections": [_section(snapshot, lineage, events)]},
        "tools": {"schemas": _tool_schemas(snapshot), "calls": _tool_calls(messages)},
        "permissions": _permissions(events),
        "replay": _replay(sid, events),
        "attachments": [],
        "metadata": {"format_note": _FORMAT_NOTE},
    }


def _section(
    snapshot: Mapping[str, Any], lineage: dict[str, Any], events: list[dict[str, Any]]
) -> dict[str, Any]:
    sid = snapshot["session_id"]
    keys = (
        "session_id",
        "title",
        "agent_id",
        "created_at",
        "status",
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
        "scratchpad_version",
        "live_clients",
        "live_controller_id",
    )
    metadata = {key: snapshot.get(key) for key in keys}
    metadata["lineage"] = lineage
    metadata["transcript_version"] = snapshot["version"]
    return {
        "id": sid,
        "label": f"Session {snapshot['title'] or sid}",
        "scope": "session",
        "location": f"$.sessions[{json.dumps(sid, ensure_ascii=False)}]",
        "summary": None,
        "messages": snapshot["transcript"],
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
                    "args_hash": hashlib.sha256(_canonical(arguments)).hexdigest(),
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


# Import


@dataclass
class _Plan:
    """What `import_bundle` will create: the open options, then messages, roots, scratchpad."""

    session_id: str
    options: dict[str, Any]
    messages: list[dict[str, Any]]
    roots: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    scratchpad: dict[str, Any] | None = None


def import_bundle(
    store: SessionStore, bundle: Mapping[str, Any], *, allow_secrets: bool | None = None
) -> str:
    """Create the bundle's session in `store` and return its id, in one atomic commit.

    Importing the same bundle again writes nothing and returns the id; a different session
    under that id raises `BundleConflictError`. An invalid bundle raises `BundleError` and
    writes nothing. Secret-looking strings are refused unless the bundle is `local` (or
    `allow_secrets` says otherwise).
    """
    if allow_secrets is None:
        redaction = bundle.get("redaction") if isinstance(bundle, Mapping) else None
        allow_secrets = isinstance(redaction, Mapping) and redaction.get("mode") == "local"
    check_bundle(bundle, allow_secrets=allow_secrets, where="import_bundle")
    plan = _plan(bundle)
    rehearsal = SessionStore.memory()  # builds the session once off to the side: a dry run
    try:
        _apply(rehearsal, plan)
        wanted = _comparable(rehearsal.snapshot(plan.session_id))
    finally:
        rehearsal.close()
    with store.transaction():
        if store.exists(plan.session_id):
            found = _comparable(store.snapshot(plan.session_id))
            if found == wanted:
                return plan.session_id
            differ = ", ".join(k for k in _COMPARED if found.get(k) != wanted.get(k))
            raise BundleConflictError(
                f"import_bundle: session `{plan.session_id}` already exists with different "
                f"content (differs in: {differ}); bundle {bundle.get('bundle_id')!r}"
            )
        _apply(store, plan)
    return plan.session_id


def _apply(store: SessionStore, plan: _Plan) -> None:
    with store.transaction():
        store.open_session(plan.session_id, **plan.options)
        if plan.messages:
            store.inject_many(plan.session_id, plan.messages)
        for root, options in plan.roots:
            store.add_root(plan.session_id, root, options)
        if plan.scratchpad:
            store.set_scratchpad(plan.session_id, plan.scratchpad)


def _comparable(snapshot: Mapping[str, Any] | None) -> dict[str, Any]:
    return {} if snapshot is None else {key: snapshot.get(key) for key in _COMPARED}


def _pick_section(bundle: Mapping[str, Any]) -> tuple[int, Mapping[str, Any] | None]:
    """The section to import: ours is the `session` scope; another producer's first section is
    the run's whole transcript (later sections are stage excerpts of it)."""
    sections = bundle["transcript"]["sections"]
    for index, section in enumerate(sections):
        if section.get("scope") == "session":
            return index, section
    return (0, sections[0]) if sections else (0, None)


def _plan(bundle: Mapping[str, Any]) -> _Plan:
    source = bundle["source"]
    index, section = _pick_section(bundle)
    meta: Mapping[str, Any] = section["metadata"] if section else {}
    sid = source.get("session_id") or meta.get("session_id") or source.get("run_record_id")
    if not isinstance(sid, str) or not sid:
        raise BundleError(
            "import_bundle: the bundle names no session id",
            [BundleIssue("$.source.run_record_id", "missing", "expected a non-empty string")],
        )
    messages = list(section["messages"]) if section else []
    for position, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if not isinstance(role, str) or not role.strip():
            path = f"$.transcript.sections[{index}].messages[{position}]"
            issue = BundleIssue(path, "message", "expected a message object with a `role`")
            raise BundleError(f"import_bundle: {issue}", [issue])
    options = _open_options(bundle, meta)
    plan = _Plan(sid, options, messages)
    if bundle["producer"].get("name") == PRODUCER:
        plan.roots = _roots(meta.get("roots"), "root")
    else:
        workspace = bundle.get("workspace")
        found = workspace.get("additional_roots") if isinstance(workspace, Mapping) else None
        plan.roots = _roots(found, "path")
    scratchpad = meta.get("scratchpad")
    plan.scratchpad = dict(scratchpad) if isinstance(scratchpad, Mapping) else None
    return plan


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _open_options(bundle: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    source = bundle["source"]
    own = bundle["producer"].get("name") == PRODUCER
    metadata = dict(meta["metadata"]) if own and isinstance(meta.get("metadata"), Mapping) else {}
    if not own:
        schemas = _foreign_tool_schemas(bundle["tools"]["schemas"])
        if schemas:
            metadata["tool_schemas"] = schemas
    lineage = source.get("lineage")
    if not isinstance(lineage, Mapping):
        lineage = {
            "parent_id": source.get("parent_run_id"),
            "root_id": source.get("root_run_id"),
            "branched_at_event_index": None,
            "child_ids": [],
        }
    metadata[IMPORTED_LINEAGE] = dict(lineage)
    metadata[IMPORTED_FROM] = {
        "bundle_id": bundle["bundle_id"],
        "producer": bundle["producer"].get("name"),
        "producer_version": bundle["producer"].get("version"),
        "mode": bundle["redaction"].get("mode"),
        "source_kind": source.get("kind"),
        "source_id": source.get("run_record_id"),
        "started_at": source.get("started_at"),
    }
    options: dict[str, Any] = {
        "metadata": metadata,
        "system_prompt": _text(meta.get("system_prompt")),
        "tool_format": _text(meta.get("tool_format")),
        "title": _text(meta.get("title")) or _text(source.get("workflow_name")),
        "agent_id": _text(meta.get("agent_id")),
        "workspace_anchor": _anchor(bundle, meta),
    }
    for key in ("formation", "parent_spawn_ref", "workspace_policy"):
        if own and isinstance(meta.get(key), Mapping):
            options[key] = dict(meta[key])
    if own and meta.get("scope") in ("persistent", "ephemeral"):
        options["scope"] = meta["scope"]
    return {key: value for key, value in options.items() if value is not None}


def _anchor(bundle: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The engine's anchor: ours is carried as is; a Harn anchor `{primary, anchored_at}` (in
    the section or the bundle's `workspace`) becomes `{root, anchored_at}`."""
    anchor = meta.get("workspace_anchor")
    if isinstance(anchor, Mapping) and "primary" not in anchor:
        return dict(anchor)
    if not isinstance(anchor, Mapping):
        anchor = bundle.get("workspace")
    if not isinstance(anchor, Mapping) or not isinstance(anchor.get("primary"), str):
        return None
    mapped = {"root": anchor["primary"], "anchored_at": anchor.get("anchored_at")}
    return {key: value for key, value in mapped.items() if value is not None}


def _roots(entries: object, key: str) -> list[tuple[str, dict[str, Any]]]:
    roots: list[tuple[str, dict[str, Any]]] = []
    for entry in entries if isinstance(entries, list) else []:
        root = entry.get(key) if isinstance(entry, Mapping) else None
        if not isinstance(root, str) or not root:
            continue
        options = {
            name: entry[name]
            for name in ("mount_mode", "mounted_at")
            if isinstance(entry.get(name), str) and entry[name]
        }
        roots.append((root, options))
    return roots


def _foreign_tool_schemas(entries: list[Any]) -> list[Any]:
    """Tool schemas from another producer's `tools.schemas` entries, flattened: an entry's value
    is a schema, a list of them, or an event holding them under `schemas`."""
    schemas: list[Any] = []
    for entry in entries:
        value = entry.get("value") if isinstance(entry, Mapping) else None
        if isinstance(value, Mapping) and isinstance(value.get("schemas"), list):
            schemas.extend(value["schemas"])
        elif isinstance(value, list):
            schemas.extend(value)
        elif value is not None:
            schemas.append(value)
    return schemas
