"""Validation of session bundle v1 envelopes, whoever produced them.

Owns the rules a bundle must meet before anything reads it: required fields (named by JSONPath),
`_type`, `schema_version`, the section shapes, no leftover secret-looking strings unless the
caller allows them, and, for a bundle of ours, the content its `bundle_id` digests (`bundle_id`
is how export names a bundle). It reports problems; it never changes the bundle and never
touches a store.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from replay._redact import (
    MODES,
    REDACTED,
    WITHHELD,
    child_path,
    find_secrets,
    members,
    scrub_string,
    withholds,
)
from sessions import InvalidArgumentError

BUNDLE_TYPE = "harn_session_bundle"
PRODUCER = "sessionlog"
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
_TYPE_NAMES[type(None)] = "null"
_NULL = type(None)
# The fields of our own session section's metadata that an import restores, and their types.
_SESSION_META: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("session_id", (str,)),
    ("title", (str, _NULL)),
    ("agent_id", (str, _NULL)),
    ("system_prompt", (str, _NULL)),
    ("tool_format", (str, _NULL)),
    ("metadata", (dict, _NULL)),
    ("formation", (dict, _NULL)),
    ("scope", (str, _NULL)),
    ("parent_spawn_ref", (dict, _NULL)),
    ("workspace_anchor", (dict, _NULL)),
    ("workspace_policy", (dict, _NULL)),
    ("roots", (list, _NULL)),
    ("scratchpad", (dict, _NULL)),
)
_SCOPES = ("persistent", "ephemeral")
_LINEAGE: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("parent_id", (str, _NULL)),
    ("root_id", (str, _NULL)),
    ("branched_at_event_index", (int, _NULL)),
    ("child_ids", (list,)),
)
_USAGE_COUNTS = (
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)
# One step of a JSONPath as `child_path` writes it: `.name`, `[3]` or `["odd key"]`.
_PATH_STEP = re.compile(r'\.([A-Za-z0-9_]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


@dataclass(frozen=True)
class BundleIssue:
    """One reason a bundle is not valid: the JSONPath, a short code, and a readable message."""

    path: str
    code: str
    message: str

    def __post_init__(self) -> None:
        # An issue lands in error messages and logs: a secret in a dict key on its path is
        # replaced by its placeholder, as sanitizing would.
        object.__setattr__(self, "path", safe_path(self.path))

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class BundleError(InvalidArgumentError):
    """A session bundle was refused (invalid, or not importable); `issues` lists every reason."""

    def __init__(self, message: str, issues: list[BundleIssue] | None = None) -> None:
        self.issues = list(issues or [])
        super().__init__(message)


def safe_path(path: str) -> str:
    """`path` with every key that looks like a secret replaced by its placeholder (a path that
    does not parse as `child_path` writes them is scrubbed whole)."""
    if not path.startswith("$"):
        return scrub_string(path)[0]
    out, at = "$", 1
    for match in _PATH_STEP.finditer(path, 1):
        if match.start() != at:
            return scrub_string(path)[0]
        name, index, quoted = match.groups()
        if index is not None:
            out += f"[{index}]"
        else:
            try:
                key = name if name is not None else json.loads(quoted)
            except ValueError:
                return scrub_string(path)[0]
            out = child_path(out, scrub_string(key)[0])
        at = match.end()
    return out if at == len(path) else scrub_string(path)[0]


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


def _typed(
    owner: Mapping[str, Any], where: str, fields: tuple[tuple[str, tuple[type, ...]], ...]
) -> Iterator[BundleIssue]:
    """An issue for each of `fields` present in `owner` with a type it does not allow; a
    placeholder a sanitized or replay_only export put in place of a whole value is allowed."""
    for key, kinds in fields:
        if key in owner and not _has_type(owner[key], kinds) and not _placeholder(owner[key]):
            expected = " or ".join(_TYPE_NAMES[kind] for kind in kinds)
            found = _type_name(owner[key])
            yield BundleIssue(child_path(where, key), "type", f"expected {expected}, got {found}")


def _placeholder(value: object) -> bool:
    if not isinstance(value, str):
        return False
    return value in (REDACTED, WITHHELD) or (value.startswith("<redacted:") and value[-1:] == ">")


def _check_lineage(bundle: Mapping[str, Any]) -> list[BundleIssue]:
    """The lineage an import keeps and a later export reports: ids are strings, the branch point
    an index, the children a list of ids."""
    source = bundle.get("source")
    if not isinstance(source, Mapping):
        return []
    issues = list(
        _typed(source, "$.source", (("parent_run_id", (str, _NULL)), ("root_run_id", (str, _NULL))))
    )
    lineage = source.get("lineage")
    if lineage is None:
        return issues
    if not isinstance(lineage, Mapping):
        got = _type_name(lineage)
        return [*issues, BundleIssue("$.source.lineage", "type", f"expected an object, got {got}")]
    issues += _typed(lineage, "$.source.lineage", _LINEAGE)
    branched = lineage.get("branched_at_event_index")
    if type(branched) is int and branched < 0:
        issues.append(
            BundleIssue(
                "$.source.lineage.branched_at_event_index",
                "range",
                f"expected a non-negative integer, got {branched}",
            )
        )
    children = lineage.get("child_ids")
    for index, child in enumerate(children if isinstance(children, list) else []):
        if not isinstance(child, str):
            path = f"$.source.lineage.child_ids[{index}]"
            issues.append(BundleIssue(path, "type", f"expected a string, got {_type_name(child)}"))
    return issues


def _sections(bundle: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    transcript = bundle.get("transcript")
    sections = transcript.get("sections") if isinstance(transcript, Mapping) else None
    for index, section in enumerate(sections if isinstance(sections, list) else []):
        if isinstance(section, Mapping):
            yield f"$.transcript.sections[{index}]", section


def _check_session_meta(bundle: Mapping[str, Any]) -> list[BundleIssue]:
    """Our own session section carries what an import restores, each field in the type the
    engine keeps it in: a wrong one is refused, not dropped or defaulted."""
    producer = bundle.get("producer")
    if not isinstance(producer, Mapping) or producer.get("name") != PRODUCER:
        return []
    issues: list[BundleIssue] = []
    for where, section in _sections(bundle):
        meta = section.get("metadata")
        if section.get("scope") != "session" or not isinstance(meta, Mapping):
            continue
        at = child_path(where, "metadata")
        issues += _typed(meta, at, _SESSION_META)
        scope = meta.get("scope")
        if isinstance(scope, str) and scope not in _SCOPES:
            expected, got = " or ".join(_SCOPES), scrub_string(scope)[0]
            issues.append(BundleIssue(f"{at}.scope", "scope", f"expected {expected}, got {got!r}"))
        anchor = meta.get("workspace_anchor")
        if isinstance(anchor, Mapping):
            fields = (("root", (str,)), ("anchored_at", (str, _NULL)))
            issues += _typed(anchor, f"{at}.workspace_anchor", fields)
    return issues


def _check_usage(bundle: Mapping[str, Any]) -> list[BundleIssue]:
    """A message's token counts are non-negative integers."""
    issues: list[BundleIssue] = []
    for where, section in _sections(bundle):
        messages = section.get("messages")
        for index, message in enumerate(messages if isinstance(messages, list) else []):
            usage = message.get("usage") if isinstance(message, Mapping) else None
            if not isinstance(usage, Mapping):
                continue
            at = f"{where}.messages[{index}].usage"
            for name in _USAGE_COUNTS:
                count = usage.get(name)
                if name not in usage or (type(count) is int and count >= 0):
                    continue
                found = str(count) if type(count) is int else _type_name(count)
                issues.append(
                    BundleIssue(
                        f"{at}.{name}", "usage", f"expected a non-negative integer, got {found}"
                    )
                )
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
    machine that made it. When nothing else is wrong, a bundle of ours whose content is not the
    one its `bundle_id` digests (it was changed after export) is a problem at `$.bundle_id`.
    """
    if not isinstance(bundle, Mapping):
        return [BundleIssue("$", "type", f"expected an object, got {_type_name(bundle)}")]
    issues = _check_fields(bundle) + _check_sections(bundle) + _check_values(bundle)
    issues += _check_lineage(bundle) + _check_session_meta(bundle) + _check_usage(bundle)
    if not allow_secrets:
        for path, kinds in find_secrets(dict(bundle)):
            issues.append(BundleIssue(path, "secret", f"looks like a secret ({', '.join(kinds)})"))
        issues += _check_withheld(bundle)
    return issues or _check_digest(bundle)


def bundle_id(bundle: Mapping[str, Any]) -> str:
    """The `bundle_id` export gives `bundle` (whatever its own says): the digest of its content
    with `bundle_id` blanked, as sorted, compact JSON. Raises `TypeError`, `ValueError` or
    `RecursionError` for a value JSON cannot carry."""
    content = msgspec.json.encode({**bundle, "bundle_id": ""}, order="sorted")
    return f"bundle_{hashlib.sha256(content).hexdigest()[:32]}"


def _first_bundle_id(bundle: Mapping[str, Any]) -> str:
    """The `bundle_id` exports before 2026-11-25 gave: the same digest of JSON written by the
    standard library, which spells some floats otherwise (``1e-07`` for ``1e-7``, ``1e+22`` for
    ``1e22``), so a bundle holding one has another id."""
    blanked = {**bundle, "bundle_id": ""}
    content = json.dumps(blanked, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return f"bundle_{hashlib.sha256(content.encode()).hexdigest()[:32]}"


def _check_digest(bundle: Mapping[str, Any]) -> list[BundleIssue]:
    """A bundle of ours still has the content its `bundle_id` digests; else it was changed after
    export, and it must not claim the original's id. Checked once nothing else is wrong: an edit
    that broke the bundle's shape or left a secret is reported as that. Another producer's
    bundle (Harn's) names itself otherwise and is not checked."""
    producer, found = bundle.get("producer"), bundle.get("bundle_id")
    if not isinstance(producer, Mapping) or producer.get("name") != PRODUCER:
        return []
    if not isinstance(found, str) or not found:
        return []  # reported as missing, mistyped or empty
    try:
        expected = bundle_id(bundle)
    except (TypeError, ValueError, RecursionError) as exc:
        return [BundleIssue("$", "digest", f"expected values JSON can carry, got {exc}")]
    if found == expected or found == _first_bundle_id(bundle):
        return []
    return [
        BundleIssue(
            "$.bundle_id",
            "digest",
            "does not match the bundle's content (changed after export?): "
            f"expected {expected!r}, got {found!r}",
        )
    ]


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
