"""Session bundles v1 into a store: `import_bundle`.

Import creates the session under the bundle's id in one atomic commit, with its transcript, system
prompt, tool format, workspace, scratchpad and metadata. Lineage cannot be recreated as a real fork
(the parent's log is not in the bundle), so it is kept as *imported lineage* in the session's
metadata (`metadata.imported_lineage`, and a sub-agent's spawn reference in
`metadata.imported_spawn_ref`), and a later export of the imported session reports it: a
`local` bundle round-trips to the same transcript and lineage. Where the session came from is kept
in `metadata.imported_from`. Sanitized and replay_only bundles import as they are: placeholder text
(`[redacted]`, `<redacted:...>`, `[withheld]`) becomes the imported text. Live clients and
permission routes are evidence of past connections and are not recreated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replay._bundle import (
    IMPORTED_FROM,
    IMPORTED_LINEAGE,
    IMPORTED_SPAWN_REF,
    PRODUCER,
    SESSION_FIELDS,
)
from replay._validate import BundleError, BundleIssue, check_bundle
from sessions import SessionExistsError, SessionStore

# What an imported session is compared on when the same id already exists.
_COMPARED = ("transcript", *SESSION_FIELDS)


class BundleConflictError(SessionExistsError):
    """`import_bundle` found the bundle's session id already holding different content."""


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
    for key in ("formation", "workspace_policy"):
        if own and isinstance(meta.get(key), Mapping):
            options[key] = dict(meta[key])
    # A spawn reference names a loop of the exporting store. Given to `open_session` it would
    # list the import as a child of whatever loop of this store has that id: kept as lineage.
    spawn_ref = meta.get("parent_spawn_ref")
    if own and isinstance(spawn_ref, Mapping):
        metadata[IMPORTED_SPAWN_REF] = dict(spawn_ref)
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
