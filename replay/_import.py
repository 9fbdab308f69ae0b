"""Session bundles v1 into a store: `import_bundle`.

Import creates the session under the bundle's id in one atomic commit, with its transcript, system
prompt, tool format, workspace, scratchpad and metadata. Lineage cannot be recreated as a real fork
(the parent's log is not in the bundle), so it is kept as *imported lineage* in the session's
metadata (`metadata.imported_lineage`, and a sub-agent's spawn reference in
`metadata.imported_spawn_ref`), and a later export of the imported session reports it: a
`local` bundle round-trips to the same transcript and lineage (the bytes and datetimes inside an
`item`, which export marks as `{"~bytes": ...}` and `{"~datetime": ...}`, come back as bytes and
datetimes). Where the session came from is kept in `metadata.imported_from`. Sanitized and
replay_only bundles import as they are: placeholder text (`[redacted]`, `<redacted:...>`,
`[withheld]`) becomes the imported text. Live clients and permission routes are evidence of past
connections and are not recreated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replay._bundle import (
    IMPORTED_FROM,
    IMPORTED_LINEAGE,
    IMPORTED_SPAWN_REF,
    SESSION_FIELDS,
    unmark_item,
)
from replay._redact import scrub_string
from replay._validate import PRODUCER, BundleError, BundleIssue, check_bundle
from sessions import InvalidArgumentError, SessionExistsError, SessionStore

# What an imported session is compared on when the same id already exists.
_COMPARED = ("transcript", *SESSION_FIELDS)


class BundleConflictError(SessionExistsError):
    """`import_bundle` found the bundle's session id already holding different content."""


@dataclass
class _Plan:
    """What `import_bundle` will create: the open options, then messages, roots, scratchpad;
    `paths` names where in the bundle each came from (`section`, `roots`, and each option), so
    that a refusal from the engine points at the bundle, not at the engine's arguments."""

    session_id: str
    options: dict[str, Any]
    messages: list[dict[str, Any]]
    roots: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    scratchpad: dict[str, Any] | None = None
    paths: dict[str, str] = field(default_factory=dict)


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
    _check_identity(bundle)
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


def _refused(message: str, *paths: str) -> BundleError:
    issues = [BundleIssue(path, "import", message) for path in paths]
    return BundleError(f"import_bundle: {'; '.join(str(i) for i in issues)}", issues)


def _check_identity(bundle: Mapping[str, Any]) -> None:
    """A bundle that can seed a session, and one that is what it says it is: it has a section,
    and its session id is the same wherever it is written. (That ours still has the content its
    `bundle_id` digests is `check_bundle`'s to say.)"""
    if not bundle["transcript"]["sections"]:
        raise _refused(
            "expected at least one section (a bundle with no transcript cannot seed a session)",
            "$.transcript.sections",
        )
    index, section = _pick_section(bundle)
    meta = section["metadata"] if section else {}
    where = f"$.transcript.sections[{index}]"
    named = {
        "$.source.session_id": bundle["source"].get("session_id"),
        f"{where}.metadata.session_id": meta.get("session_id"),
    }
    if bundle["producer"].get("name") == PRODUCER:  # its digest was checked with the rest
        named = {
            "$.source.run_record_id": bundle["source"]["run_record_id"],
            **named,
            f"{where}.id": section["id"] if section else None,
        }
    present = {path: value for path, value in named.items() if value is not None}
    if len(set(map(repr, present.values()))) > 1:
        raise _refused("the session ids of the bundle disagree", *present)


def _apply(store: SessionStore, plan: _Plan) -> None:
    """Write `plan` to `store` in one transaction; an engine refusal becomes a `BundleError`
    naming the part of the bundle it was about."""
    where = plan.paths["section"]
    try:
        with store.transaction():
            where = plan.paths["section"] + ".metadata"
            store.open_session(plan.session_id, **plan.options)
            where = plan.paths["section"] + ".messages"
            if plan.messages:
                store.inject_many(plan.session_id, plan.messages)
            for index, (root, options) in enumerate(plan.roots):
                where = f"{plan.paths['roots']}[{index}]"
                store.add_root(plan.session_id, root, options)
            where = plan.paths["section"] + ".metadata.scratchpad"
            if plan.scratchpad:
                store.set_scratchpad(plan.session_id, plan.scratchpad)
            where = plan.paths["section"]
    except BundleError:
        raise
    except InvalidArgumentError as exc:
        raise _translated(exc, where, plan) from exc


def _translated(exc: InvalidArgumentError, where: str, plan: _Plan) -> BundleError:
    text = str(exc)
    if exc.where and text.startswith(f"{exc.where}: "):
        text = text[len(exc.where) + 2 :]
    else:
        text = re.sub(r"^[a-z_]+: ", "", text)  # the engine verb: the path says where now
    if where.endswith(".messages") and exc.index is not None:
        where = f"{where}[{exc.index}]"
    elif where.endswith(".metadata"):
        # The option the engine named (`metadata`.imported_lineage, `workspace_policy`, ...).
        found = [key for key in plan.paths if key.startswith("`") and key in text]
        where = plan.paths[max(found, key=len)] if found else where
        if text.startswith("session id"):
            where = plan.paths["session_id"]
    issue = BundleIssue(where, "refused", scrub_string(text)[0])  # it may quote the bundle
    return BundleError(f"import_bundle: {issue}", [issue])


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
    where = f"$.transcript.sections[{index}]"
    from_source = source.get("session_id") or not meta.get("session_id")
    sid_path = "$.source.session_id" if source.get("session_id") else "$.source.run_record_id"
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
    if bundle["producer"].get("name") == PRODUCER:  # ours marks what JSON has no type for
        messages = [
            {**m, "item": unmark_item(m["item"])} if m.get("item") is not None else m
            for m in messages
        ]
    options = _open_options(bundle, meta)
    plan = _Plan(sid, options, messages, paths=_option_paths(bundle, where))
    plan.paths["session_id"] = sid_path if from_source else f"{where}.metadata.session_id"
    if bundle["producer"].get("name") == PRODUCER:
        plan.roots = _roots(meta.get("roots"), "root")
        plan.paths["roots"] = f"{where}.metadata.roots"
    else:
        workspace = bundle.get("workspace")
        found = workspace.get("additional_roots") if isinstance(workspace, Mapping) else None
        plan.roots = _roots(found, "path")
        plan.paths["roots"] = "$.workspace.additional_roots"
    scratchpad = meta.get("scratchpad")
    plan.scratchpad = dict(scratchpad) if isinstance(scratchpad, Mapping) else None
    return plan


def _option_paths(bundle: Mapping[str, Any], where: str) -> dict[str, str]:
    """Where each option `open_session` is given comes from, keyed by how the engine's
    refusals name it (`name`, or `metadata`.key for a key the import adds)."""
    meta = f"{where}.metadata"
    paths = {"section": where}
    paths.update({f"`{key}": f"{meta}.{key}" for key in SESSION_FIELDS})
    paths["`metadata`"] = f"{meta}.metadata"
    paths[f"`metadata`.{IMPORTED_LINEAGE}"] = "$.source.lineage"
    paths[f"`metadata`.{IMPORTED_SPAWN_REF}"] = f"{meta}.parent_spawn_ref"
    paths[f"`metadata`.{IMPORTED_FROM}"] = "$.source"
    if bundle["producer"].get("name") != PRODUCER:
        paths["`metadata`.tool_schemas"] = "$.tools.schemas"
        paths["`workspace_anchor"] = "$.workspace"
    return paths


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
        lineage = {"parent_id": source.get("parent_run_id"), "root_id": source.get("root_run_id")}
    # The validator checked the types; a placeholder left by redaction counts as absent.
    children = lineage.get("child_ids")
    branched = lineage.get("branched_at_event_index")
    metadata[IMPORTED_LINEAGE] = {
        "parent_id": _text(lineage.get("parent_id")),
        "root_id": _text(lineage.get("root_id")),
        "branched_at_event_index": branched if isinstance(branched, int) else None,
        "child_ids": list(children) if isinstance(children, list) else [],
    }
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
