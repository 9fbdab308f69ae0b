"""Redaction of session bundles: the `sanitized` and `replay_only` modes and their manifest.

Owns what counts as sensitive (field names, secret-shaped strings, local paths) and the JSONPath of
every change. Pure functions over plain JSON data: no store, no clock, and the input is never
mutated. Every change it makes is reported as one manifest entry; nothing is dropped silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

REDACTED = "[redacted]"
WITHHELD = "[withheld]"
MODES = ("local", "sanitized", "replay_only")
POLICY_LOCAL = "none"
POLICY_SANITIZED = "sessionlog.redact:v1(sensitive_fields+secret_patterns+local_paths)"

SENSITIVE_FIELD = "sensitive_field"
SECRET_PATTERN = "secret_pattern_or_url"
PROMPT_PAYLOAD = "prompt_or_tool_payload"

# Field names whose value is a credential, whatever it looks like (compared lower-cased).
_CREDENTIAL_FIELDS = frozenset(
    (
        "authorization",
        "proxy-authorization",
        "cookie",
        "cookies",
        "set-cookie",
        "api_key",
        "apikey",
        "api-key",
        "x-api-key",
        "x-auth-token",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "bearer",
        "bearer_token",
        "client_secret",
        "secret",
        "secrets",
        "password",
        "passwd",
        "passphrase",
        "private_key",
        "session_token",
        "credential",
        "credentials",
    )
)
_CREDENTIAL_SUFFIXES = ("_token", "_secret", "_password", "_apikey", "_api_key", "_private_key")
# Field names whose value is a path on the exporting machine: sharing them tells strangers the
# layout (and often the user name) of someone's disk, and they mean nothing anywhere else.
_LOCAL_PATH_FIELDS = frozenset(
    (
        "cwd",
        "workdir",
        "working_dir",
        "working_directory",
        "project_root",
        "workspace_root",
        "root",
        "primary",
        "home",
        "home_dir",
        "homedir",
        "home_directory",
        "persisted_path",
        "run_path",
        "snapshot_path",
        "snapshot_ref",
        "source_path",
    )
)
# A `path` is only a local path where the container says so: inside mounted roots and file refs.
# Elsewhere (tool arguments, schemas) a `path` is usually relative and part of the payload.
_PATH_CONTAINERS = frozenset(("additional_roots", "roots", "files"))

# Keys whose values are prompt text or tool payloads; `replay_only` withholds them. The first
# eighteen are the bundle v1 list; the last four are where this engine's own events carry prompt or
# tool payloads (permission requests, scratchpads, tool-call inputs and outputs).
PAYLOAD_KEYS = frozenset(
    (
        "args",
        "arguments",
        "blocks",
        "content",
        "data",
        "private_reasoning",
        "prompt",
        "raw_input",
        "raw_output",
        "result",
        "response_text",
        "summary",
        "system",
        "system_prompt",
        "task",
        "text",
        "thinking",
        "visible_text",
        "request",
        "scratchpad",
        "input",
        "output",
    )
)


@dataclass(frozen=True)
class _Pattern:
    name: str
    regex: re.Pattern[str]


# Earlier patterns win where two would match the same text (an Anthropic key is also `sk-...`).
# A value that is already a placeholder (`[redacted]`, `<redacted:...>`) never matches, so
# sanitizing is idempotent and a sanitized bundle passes the secret scan.
PATTERNS: tuple[_Pattern, ...] = tuple(
    _Pattern(name, re.compile(source))
    for name, source in (
        (
            "private_key_block",
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----)?",
        ),
        ("anthropic_api_key", r"\bsk-ant-[A-Za-z0-9_-]{16,}"),
        ("openai_api_key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
        ("stripe_secret_key", r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"),
        ("aws_access_key_id", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
        ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"),
        ("slack_token", r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
        ("jwt", r"\beyJ[A-Za-z0-9_-]{6,}\.eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}"),
        ("bearer_token", r"\b[Bb]earer\s+(?![\[<])[A-Za-z0-9._~+/=-]{12,}"),
        (
            "password_assignment",
            r"(?i)\b(?:password|passwd|pwd|passphrase|secret|api[_-]?key|access[_-]?token)"
            r"\s*[:=]\s*['\"]?(?![\[<'\"])[^\s'\",;&]{3,}",
        ),
        ("home_directory", r"(?:/home/|/Users/)[A-Za-z0-9._-]+|\b[A-Za-z]:\\Users\\[^\\\s]+"),
    )
)
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]+")
_URL_SECRET_PARAMS = frozenset(
    (
        "api_key",
        "apikey",
        "key",
        "access_token",
        "refresh_token",
        "id_token",
        "token",
        "client_secret",
        "password",
        "secret",
        "auth",
        "sig",
        "signature",
    )
)


@dataclass(frozen=True)
class RedactionEntry:
    """One change made to a bundle: where, why (class), what was done and what is there now."""

    path: str
    cls: str
    action: str
    replacement: str

    def as_dict(self) -> dict[str, str]:
        return {
            "path": self.path,
            "class": self.cls,
            "action": self.action,
            "replacement": self.replacement,
        }


def field_is_sensitive(key: str, container: str | None = None) -> bool:
    """Whether the value under `key` is a credential or a local path, whatever it holds.
    `container` is the key of the list holding the object, if any (`files`, `roots`, ...)."""
    lower = key.lower()
    if lower in _CREDENTIAL_FIELDS or lower in _LOCAL_PATH_FIELDS:
        return True
    if lower == "path" and container in _PATH_CONTAINERS:
        return True
    return lower.endswith(_CREDENTIAL_SUFFIXES)


def _placeholder(name: str, matched: str) -> str:
    return f"<redacted:{name}:{len(matched.encode())}>"


def _url_leaks(url: str) -> bool:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed URL cannot be checked, so it is treated as a leak
        return True
    if password or (parts.username and "@" in parts.netloc):
        return True
    return any(key.lower() in _URL_SECRET_PARAMS for key, _ in parse_qsl(parts.query))


def scrub_string(text: str) -> tuple[str, list[str]]:
    """`text` with every secret-shaped part replaced by a named placeholder, and the placeholders
    used (empty when nothing matched)."""
    used: list[str] = []

    def url(match: re.Match[str]) -> str:
        if not _url_leaks(match.group(0)):
            return match.group(0)
        used.append(_placeholder("url_with_credentials", match.group(0)))
        return used[-1]

    out = _URL.sub(url, text)
    for pattern in PATTERNS:

        def named(match: re.Match[str], name: str = pattern.name) -> str:
            used.append(_placeholder(name, match.group(0)))
            return used[-1]

        out = pattern.regex.sub(named, out)
    return out, used


def secret_kinds(text: str) -> list[str]:
    """The names of the secret patterns sanitizing would replace in `text`, each once, in the
    order they are applied (empty for a clean string)."""
    _, used = scrub_string(text)
    names = [placeholder.split(":")[1] for placeholder in used]
    return list(dict.fromkeys(names))


def child_path(parent: str, key: str) -> str:
    """The JSONPath of `key` under `parent`: `$.a.b`, or `$.a["odd key"]` for other names."""
    if key and all(ch.isascii() and (ch.isalnum() or ch == "_") for ch in key):
        return f"{parent}.{key}"
    return f"{parent}[{json.dumps(key, ensure_ascii=False)}]"


Visit = Callable[[str, Any, str, "str | None", list[RedactionEntry]], "tuple[bool, Any]"]


def _walk(
    value: Any, path: str, visit: Visit, entries: list[RedactionEntry], container: str | None
) -> Any:
    """A copy of `value` where `visit(key, child, child_path, container, entries)` may replace a
    dict member (it returns (True, new)); strings are offered with key ''."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, child in value.items():
            where = child_path(path, key)
            replaced, new = visit(key, child, where, container, entries)
            out[key] = new if replaced else _walk(child, where, visit, entries, key)
        return out
    if isinstance(value, list):
        return [
            _walk(item, f"{path}[{i}]", visit, entries, container) for i, item in enumerate(value)
        ]
    if isinstance(value, str):
        replaced, new = visit("", value, path, container, entries)
        return new if replaced else value
    return value


def _sanitize_visit(
    key: str, value: Any, path: str, container: str | None, entries: list[RedactionEntry]
) -> tuple[bool, Any]:
    if key and field_is_sensitive(key, container):
        if value is None or value == REDACTED:
            return True, value
        entries.append(RedactionEntry(path, SENSITIVE_FIELD, "replaced", REDACTED))
        return True, REDACTED
    if not key and isinstance(value, str):
        scrubbed, used = scrub_string(value)
        if used:
            # The manifest names the placeholders only, never the text around them, so a
            # replay_only bundle cannot leak withheld prompt text through its manifest.
            entries.append(RedactionEntry(path, SECRET_PATTERN, "replaced", ", ".join(used)))
            return True, scrubbed
    return False, None


def _withhold_visit(
    key: str, value: Any, path: str, container: str | None, entries: list[RedactionEntry]
) -> tuple[bool, Any]:
    if key in PAYLOAD_KEYS and value is not None:
        entries.append(RedactionEntry(path, PROMPT_PAYLOAD, "withheld", WITHHELD))
        return True, WITHHELD
    return False, None


def redact(body: dict[str, Any], mode: str) -> tuple[dict[str, Any], list[RedactionEntry]]:
    """A redacted copy of the bundle `body` (everything but its `redaction` section) and the
    manifest entries, sorted by path. `local` returns an unchanged copy and no entries."""
    if mode not in MODES:
        raise ValueError(f"redaction mode must be one of {', '.join(MODES)}, got {mode!r}")
    entries: list[RedactionEntry] = []
    out: dict[str, Any] = json.loads(json.dumps(body))
    if mode == "local":
        return out, entries
    out = _walk(out, "$", _sanitize_visit, entries, None)
    if mode == "replay_only":
        out = _walk(out, "$", _withhold_visit, entries, None)
    entries.sort(key=lambda entry: entry.path)
    return out, entries


def manifest(mode: str, entries: list[RedactionEntry]) -> dict[str, Any]:
    """The bundle's `redaction` section for `mode` and its entries."""
    return {
        "mode": mode,
        "policy": POLICY_LOCAL if mode == "local" else POLICY_SANITIZED,
        "placeholder": REDACTED,
        "entries": [entry.as_dict() for entry in entries],
        "unsafe_secret_markers_rejected": mode != "local",
    }


def find_secrets(value: Any, path: str = "$") -> list[tuple[str, list[str]]]:
    """Every string under `value` that still looks like a secret: (JSONPath, pattern names)."""
    found: list[tuple[str, list[str]]] = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((child_path(where, k), v) for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(item))))
        elif isinstance(item, str):
            kinds = secret_kinds(item)
            if kinds:
                found.append((where, kinds))
    return found
