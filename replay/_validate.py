"""Validation of session bundle v1 envelopes, whoever produced them.

Owns the rules a bundle must meet before anything reads it: required fields (named by JSONPath),
`_type`, `schema_version`, the section shapes, and no leftover secret-looking strings unless the
caller allows them. It reports problems; it never changes the bundle and never touches a store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replay._redact import MODES, WITHHELD, child_path, find_secrets, members, withholds
from sessions import InvalidArgumentError

BUNDLE_TYPE = "harn_session_bundle"
SCHEMA_VERSION = 1
SCHEMA_ID = "https://harnlang.com/schemas/session-bundle.v1.json"

# (path below the root, JSON types allowed). Order is the order problems are reported in.
_REQUIRED: tuple[tuple[tuple[str, ...], tuple[type, ...]], ...] = (
    (("_type",), (str,)),
    (("schema_version",), (int,)),
    (("bundle_id",), (str,)),
    (("created_at",), (str,)),
    (("producer",), (dict,)),
    (("producer", "name"), (str,)),
    (("producer", "version"), (str,)),
    (("producer", "schema_id"), (str,)),
    (("source",), (dict,)),
    (("source", "kind"), (str,)),
    (("source", "run_record_id"), (str,)),
    (("source", "workflow_id"), (str,)),
    (("source", "task"), (str,)),
    (("source", "status"), (str,)),
    (("runtime",), (dict,)),
    (("runtime", "harn_version"), (str,)),
    (("runtime", "provider_models"), (list,)),
    (("transcript",), (dict,)),
    (("transcript", "sections"), (list,)),
    (("tools",), (dict,)),
    (("tools", "schemas"), (list,)),
    (("tools", "calls"), (list,)),
    (("permissions",), (list,)),
    (("replay",), (dict,)),
    (("replay", "event_log_pointers"), (list,)),
    (("replay", "transitions"), (list,)),
    (("replay", "checkpoints"), (list,)),
    (("replay", "trace_spans"), (list,)),
    (("replay", "deterministic_events"), (list,)),
    (("redaction",), (dict,)),
    (("redaction", "mode"), (str,)),
    (("redaction", "policy"), (str,)),
    (("redaction", "placeholder"), (str,)),
    (("redaction", "entries"), (list,)),
    (("redaction", "unsafe_secret_markers_rejected"), (bool,)),
    (("attachments",), (list,)),
)
_SECTION_FIELDS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("id", (str,)),
    ("label", (str,)),
    ("scope", (str,)),
    ("location", (str,)),
    ("messages", (list,)),
    ("events", (list,)),
    ("assets", (list,)),
    ("metadata", (dict,)),
)
_TYPE_NAMES = {str: "a string", int: "an integer", list: "an array", dict: "an object"}
_TYPE_NAMES[bool] = "a boolean"


@dataclass(frozen=True)
class BundleIssue:
    """One reason a bundle is not valid: the JSONPath, a short code, and a readable message."""

    path: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class BundleError(InvalidArgumentError):
    """A session bundle was refused (invalid, or not importable); `issues` lists every reason."""

    def __init__(self, message: str, issues: list[BundleIssue] | None = None) -> None:
        self.issues = list(issues or [])
        super().__init__(message)


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {str: "a string", int: "an integer", float: "a number", list: "an array"}.get(
        type(value), "an object" if isinstance(value, Mapping) else type(value).__name__
    )


def _has_type(value: object, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in kinds:
        return False  # JSON booleans are not integers, whatever Python says
    return isinstance(value, kinds)


def _check_fields(bundle: Mapping[str, Any]) -> list[BundleIssue]:
    issues: list[BundleIssue] = []
    for keys, kinds in _REQUIRED:
        parent: Any = bundle
        for key in keys[:-1]:
            parent = parent.get(key) if isinstance(parent, Mapping) else None
        if not isinstance(parent, Mapping):
            continue  # the missing or mistyped parent is already reported
        path = "$"
        for key in keys:
            path = child_path(path, key)
        if keys[-1] not in parent:
            issues.append(BundleIssue(path, "missing", "required field is missing"))
        elif not _has_type(parent[keys[-1]], kinds):
            expected = _TYPE_NAMES[kinds[0]]
            found = _type_name(parent[keys[-1]])
            issues.append(BundleIssue(path, "type", f"expected {expected}, got {found}"))
    return issues


def _check_sections(bundle: Mapping[str, Any]) -> list[BundleIssue]:
    transcript = bundle.get("transcript")
    sections = transcript.get("sections") if isinstance(transcript, Mapping) else None
    if not isinstance(sections, list):
        return []
    issues: list[BundleIssue] = []
    for index, section in enumerate(sections):
        where = f"$.transcript.sections[{index}]"
        if not isinstance(section, Mapping):
            got = _type_name(section)
            issues.append(BundleIssue(where, "type", f"expected an object, got {got}"))
            continue
        for key, kinds in _SECTION_FIELDS:
            path = child_path(where, key)
            if key not in section:
                issues.append(BundleIssue(path, "missing", "required field is missing"))
            elif not _has_type(section[key], kinds):
                expected, found = _TYPE_NAMES[kinds[0]], _type_name(section[key])
                issues.append(BundleIssue(path, "type", f"expected {expected}, got {found}"))
    return issues


def _check_values(bundle: Mapping[str, Any]) -> list[BundleIssue]:
    issues: list[BundleIssue] = []
    kind = bundle.get("_type")
    if isinstance(kind, str) and kind != BUNDLE_TYPE:
        issues.append(
            BundleIssue("$._type", "type_name", f"expected {BUNDLE_TYPE!r}, got {kind!r}")
        )
    version = bundle.get("schema_version")
    if _has_type(version, (int,)) and version != SCHEMA_VERSION:
        issues.append(
            BundleIssue(
                "$.schema_version",
                "schema_version",
                f"expected schema version {SCHEMA_VERSION}, got {version}",
            )
        )
    redaction = bundle.get("redaction")
    mode = redaction.get("mode") if isinstance(redaction, Mapping) else None
    if isinstance(mode, str) and mode not in MODES:
        issues.append(
            BundleIssue(
                "$.redaction.mode", "mode", f"expected one of {', '.join(MODES)}, got {mode!r}"
            )
        )
    for key in ("bundle_id", "created_at"):
        if bundle.get(key) == "":
            issues.append(BundleIssue(f"$.{key}", "empty", "expected a non-empty string"))
    return issues


def validate_bundle(bundle: object, *, allow_secrets: bool = False) -> list[BundleIssue]:
    """Every problem with `bundle` (a parsed JSON object), in a stable order; empty when valid.

    Secret-looking strings (API keys, tokens, credentials in URLs, private keys, home
    directories) are problems unless `allow_secrets` is true, as for a `local` bundle kept on the
    machine that made it.
    """
    if not isinstance(bundle, Mapping):
        return [BundleIssue("$", "type", f"expected an object, got {_type_name(bundle)}")]
    issues = _check_fields(bundle) + _check_sections(bundle) + _check_values(bundle)
    if not allow_secrets:
        for path, kinds in find_secrets(dict(bundle)):
            issues.append(BundleIssue(path, "secret", f"looks like a secret ({', '.join(kinds)})"))
        issues += _check_withheld(bundle)
    return issues


def _check_withheld(bundle: Mapping[str, Any]) -> list[BundleIssue]:
    """A replay_only bundle carries no prompt, tool payload or model-private field."""
    redaction = bundle.get("redaction")
    if not isinstance(redaction, Mapping) or redaction.get("mode") != "replay_only":
        return []
    body = {key: value for key, value in bundle.items() if key != "redaction"}
    return [
        BundleIssue(path, "withheld", f"replay_only bundle carries `{key}`, which it withholds")
        for path, value, key, _ in members(body, "$")
        if withholds(key, value)
    ] + _check_title(bundle)


def _check_title(bundle: Mapping[str, Any]) -> list[BundleIssue]:
    """A sessionlog replay_only bundle carries no session title (often the first prompt): not in
    `source.workflow_name`, a section's `metadata.title`, nor its label (`Session <id>`)."""
    producer = bundle.get("producer")
    if not isinstance(producer, Mapping) or producer.get("name") != "sessionlog":
        return []  # another producer's workflow name or label is not a prompt
    issues: list[BundleIssue] = []
    source = bundle.get("source")
    if isinstance(source, Mapping) and source.get("workflow_name") not in (None, WITHHELD):
        issues.append(BundleIssue("$.source.workflow_name", "withheld", _TITLE_KEPT))
    transcript = bundle.get("transcript")
    sections = transcript.get("sections") if isinstance(transcript, Mapping) else None
    for i, section in enumerate(sections if isinstance(sections, list) else []):
        if not isinstance(section, Mapping):
            continue
        where = f"$.transcript.sections[{i}]"
        if section.get("label") != f"Session {section.get('id')}":
            issues.append(BundleIssue(f"{where}.label", "withheld", _TITLE_KEPT))
        events = section.get("events")
        titled = [(f"{where}.metadata", section.get("metadata"))] + [
            (f"{where}.events[{j}].event", event.get("event"))
            for j, event in enumerate(events if isinstance(events, list) else [])
            if isinstance(event, Mapping)
        ]
        for at, holder in titled:
            title = holder.get("title") if isinstance(holder, Mapping) else None
            if isinstance(title, str) and title != WITHHELD:
                issues.append(BundleIssue(f"{at}.title", "withheld", _TITLE_KEPT))
    return issues


_TITLE_KEPT = "replay_only bundle carries the session title, which it withholds"


def check_bundle(bundle: object, *, allow_secrets: bool = False, where: str = "bundle") -> None:
    """Raise `BundleError` naming every problem (the first five in the message) if `bundle` is
    not a valid bundle."""
    issues = validate_bundle(bundle, allow_secrets=allow_secrets)
    if issues:
        shown = "; ".join(str(issue) for issue in issues[:5])
        more = f" (and {len(issues) - 5} more)" if len(issues) > 5 else ""
        raise BundleError(f"{where}: invalid session bundle: {shown}{more}", issues)
