"""Redaction of session bundles: the `sanitized` and `replay_only` modes and their manifest.

Owns where redaction looks and the JSONPath of every change: every value and every dict key, a
list of strings also as one text (a private key whose lines are list items), fields whose name is a
credential's or a local path's; `replay._secrets` says what is a secret. Pure functions over plain
JSON data: no store, no clock, and the input is never mutated. Every change it makes is reported as
one manifest entry; nothing is dropped silently.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from eventlog import json_copy
from replay._redact_parts import bytes_text, paired_values, split_blocks, split_secrets
from replay._secret_names import credential_name
from replay._secrets import (
    BLOCK_KINDS,
    continues_block,
    forget,
    opens_block,
    placeholder_for,
    scan,
    scrub,
)

REDACTED = "[redacted]"
WITHHELD = "[withheld]"
MODES = ("local", "sanitized", "replay_only")
POLICY_LOCAL = "none"
POLICY_SANITIZED = (
    "sessionlog.redact:v2(credential_names+secret_detectors+keys+split_and_encoded+local_paths)"
)

SENSITIVE_FIELD = "sensitive_field"
SECRET_PATTERN = "secret_pattern_or_url"
PROMPT_PAYLOAD = "prompt_or_tool_payload"

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
# eighteen are the bundle v1 list; the last five are where this engine's own events carry prompt or
# tool payloads (permission requests, scratchpads, tool-call inputs and outputs, stored items).
_PROMPT_KEYS = frozenset(
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
        "item",
    )
)
# What a model produced for itself (reasoning, thinking and their signatures): replay_only
# withholds these too, whatever container holds them.
MODEL_PRIVATE_KEYS = frozenset(
    (
        "reasoning",
        "reasoning_content",
        "reasoning_details",
        "reasoning_text",
        "thinking",
        "redacted_thinking",
        "private_reasoning",
        "signature",
        "encrypted_content",
        "thought",
        "thoughts",
        "chain_of_thought",
    )
)
PAYLOAD_KEYS = _PROMPT_KEYS | MODEL_PRIVATE_KEYS
_LEAF_KEYS = PAYLOAD_KEYS | {"value", "note", "line", "message"}


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


@lru_cache(maxsize=16_384)
def field_is_sensitive(key: str, container: str | None = None) -> bool:
    """Whether the value under `key` is a credential or a local path, whatever it holds.
    `container` is the key of the list holding the object, if any (`files`, `roots`, ...)."""
    lower = key.lower()
    if lower in _LOCAL_PATH_FIELDS:
        return True
    if lower == "path" and container in _PATH_CONTAINERS:
        return True
    return credential_name(key)


def _keeps_value(value: Any) -> bool:
    """Values a sensitive field keeps: nothing to hide in null, true/false or a placeholder."""
    return value is None or isinstance(value, bool) or value in (REDACTED, WITHHELD)


def scrub_string(text: str) -> tuple[str, list[str]]:
    """`text` with every secret replaced by a named placeholder, and the placeholders used
    (empty when nothing matched)."""
    return scrub(text)


def secret_kinds(text: str) -> list[str]:
    """The kinds of secret sanitizing would replace in `text`, each once, in order of
    appearance (empty for a clean string)."""
    return list(dict.fromkeys(hit.kind for hit in scan(text)))


def child_path(parent: str, key: str) -> str:
    """The JSONPath of `key` under `parent`: `$.a.b`, or `$.a["odd key"]` for other names."""
    if key and all(ch.isascii() and (ch.isalnum() or ch == "_") for ch in key):
        return f"{parent}.{key}"
    return f"{parent}[{json.dumps(key, ensure_ascii=False)}]"


# Where a value sits, built lazily: (parent, step) with step a dict key, an int list index, or
# "$" at the root; rendered as a JSONPath only when an entry needs it.
_Where = tuple[Any, Any]
_ROOT: _Where = (None, "$")


@lru_cache(maxsize=16_384)
def _step(key: str) -> str:
    return child_path("", key)


def _render(where: _Where) -> str:
    parts: list[str] = []
    node: _Where | None = where
    while node is not None:
        node, step = node
        if isinstance(step, int):
            parts.append(f"[{step}]")
        else:
            parts.append(step if node is None else _step(step))
    return "".join(reversed(parts))


# The lists whose items the walk reports as it goes (`redact`'s `pulse`), and how often.
_PULSED = frozenset(("messages", "events"))
_PULSE_EVERY = 1_000


class _Sanitizer:
    """One sanitizing walk: a redacted copy of a JSON value and the entries it made."""

    def __init__(self, pulse: Callable[[int], object] | None = None) -> None:
        self.entries: list[RedactionEntry] = []
        self.pulse = pulse
        self.openings = 0  # texts seen that begin a private key block and leave it open
        self.open_kind = ""
        self.keys: dict[str | None, dict[Any, Any]] = {}

    def note(self, where: _Where, cls: str, action: str, replacement: str) -> None:
        self.entries.append(RedactionEntry(_render(where), cls, action, replacement))

    def value(self, value: Any, where: _Where, container: str | None) -> Any:
        if isinstance(value, str):
            return value if len(value) < 6 else self.text(value, where)
        if isinstance(value, dict):
            return self.mapping(value, where, container)
        if isinstance(value, list | tuple):
            return self.sequence(list(value), where, container)
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, bytes | bytearray | memoryview):
            return self.blob(bytes(value), where)
        return self.value(plain_copy(value), where, container)

    def text(self, value: str, where: _Where) -> str:
        hits = scan(value)
        if not hits:
            return value
        if any(hit.kind in BLOCK_KINDS for hit in hits):
            kind = opens_block(value)
            if kind is not None:
                self.openings += 1
                self.open_kind = kind
        scrubbed, used = scrub(value)
        if used:
            # The manifest names the placeholders only, never the text around them, so a
            # replay_only bundle cannot leak withheld prompt text through its manifest.
            self.note(where, SECRET_PATTERN, "replaced", ", ".join(used))
        return scrubbed

    def blob(self, value: bytes, where: _Where) -> str:
        """Bytes travel as base64 (as JSON carries them); their text is scanned first: all of
        it when it is UTF-8, else its runs of printable ASCII (a key inside a binary frame)."""
        decoded = bytes_text(value)
        hits = scan(decoded) if decoded else ()
        if hits:
            placeholder = placeholder_for(hits[0].kind, value)
            self.note(where, SECRET_PATTERN, "replaced", placeholder)
            return placeholder
        return self.text(base64.b64encode(value).decode("ascii"), where)

    def mapping(
        self, value: dict[Any, Any], where: _Where, container: str | None
    ) -> dict[str, Any]:
        facts = self.keys.get(container)
        if facts is None:
            facts = self.keys[container] = {}
        out: dict[str, Any] = {}
        paired = paired_values(value) if "value" in value or "Value" in value else ()
        for key, child in value.items():
            if key in paired and not _keeps_value(child):
                self.note((where, key), SENSITIVE_FIELD, "replaced", REDACTED)
                out[key] = REDACTED
                continue
            seen = facts.get(key)
            if seen is None:
                seen = facts[key] = _key_facts(key, container)
            if seen is _PLAIN_KEY:  # the common case, kept short: a key to keep as it is
                kind = type(child)
                if kind is str:
                    out[key] = child if len(child) < 6 else self.text(child, (where, key))
                elif kind is dict:
                    out[key] = self.mapping(child, (where, key), key)
                elif kind is list:
                    out[key] = self.sequence(child, (where, key), key)
                elif child is None or kind is int or kind is float or kind is bool:
                    out[key] = child
                else:
                    out[key] = self.value(child, (where, key), key)
                continue
            name, new_key, used, sensitive = seen
            if used:
                new_key = _free_key(new_key, out, value)
                self.note((where, new_key), SECRET_PATTERN, "key_replaced", used)
            if sensitive and not _keeps_value(child):
                self.note((where, new_key), SENSITIVE_FIELD, "replaced", REDACTED)
                out[new_key] = REDACTED
            else:
                out[new_key] = self.value(child, (where, new_key), name)
        return out

    def sequence(self, value: list[Any], where: _Where, container: str | None) -> list[Any]:
        split: dict[int, str] = {}
        if len(value) > 1 and isinstance(value[0], str) and all(isinstance(i, str) for i in value):
            split = split_secrets(value)
        elif len(value) > 1 and any(isinstance(i, dict) and "text" in i for i in value):
            split = split_blocks(value)
        out: list[Any] = []
        pulse = self.pulse if container in _PULSED else None
        carrying, seen = False, self.openings
        for i, item in enumerate(value):
            if pulse is not None and i % _PULSE_EVERY == 0 and i:
                pulse(_PULSE_EVERY)
            if carrying:
                continued = self.continuation(item, (where, i), container)
                carrying = continued is not None and not continued[1]
                if continued is not None:
                    out.append(continued[0])
                    continue
            if i in split and isinstance(item, dict):  # a content block: its text goes
                placeholder = placeholder_for(split[i], item["text"])
                out.append({**self.value(item, (where, i), container), "text": placeholder})
                self.note(((where, i), "text"), SECRET_PATTERN, "replaced", placeholder)
            elif i in split:
                placeholder = placeholder_for(split[i], item)
                self.note((where, i), SECRET_PATTERN, "replaced", placeholder)
                out.append(placeholder)
            else:
                out.append(self.value(item, (where, i), container))
            if self.openings != seen:
                carrying, seen = True, self.openings
        if pulse is not None and value:
            pulse((len(value) - 1) % _PULSE_EVERY + 1)
        return out

    def continuation(
        self, item: Any, where: _Where, container: str | None
    ) -> tuple[Any, bool] | None:
        """If `item` goes on with the private key block an earlier item left open: its
        redacted copy and whether it ends the block; else None."""
        if isinstance(item, str):
            part, closed = continues_block(item)
            if not part:
                return None
            placeholder = placeholder_for(self.open_kind, item)
            self.note(where, SECRET_PATTERN, "replaced", placeholder)
            return placeholder, closed
        if not isinstance(item, dict):
            return None
        found = [(keys, text, continues_block(text)) for keys, text in payload_leaves(item)]
        parts = [(keys, text, closed) for keys, text, (part, closed) in found if part]
        if not parts:
            return None
        kind = self.open_kind
        copy = self.value(item, where, container)
        for keys, text, _ in parts:
            placeholder = placeholder_for(kind, text)
            _put(copy, keys, placeholder)
            at = where
            for key in keys:
                at = (at, key)
            self.note(at, SECRET_PATTERN, "replaced", placeholder)
        return copy, any(closed for _, _, closed in parts)


def payload_leaves(
    item: dict[Any, Any], keys: tuple[str, ...] = (), depth: int = 0
) -> Iterator[tuple[tuple[str, ...], str]]:
    """The strings under prompt or payload keys of `item` (`content`, `text`, ...), with the
    keys leading to each, four dicts deep at most (lists inside are walked on their own)."""
    for key, child in item.items():
        if isinstance(child, str) and key in _LEAF_KEYS:
            yield (*keys, key), child
        elif isinstance(child, dict) and depth < 4:
            yield from payload_leaves(child, (*keys, str(key)), depth + 1)


def _put(target: Any, keys: tuple[str, ...], value: str) -> None:
    for key in keys[:-1]:
        target = target.get(key) if isinstance(target, dict) else None
    if isinstance(target, dict) and keys[-1] in target:
        target[keys[-1]] = value


_PLAIN_KEY = ("", "", "", False)


def _key_facts(key: Any, container: str | None) -> tuple[str, str, str, bool]:
    """(name, key as exported, placeholders used in it, whether its value is sensitive), or
    `_PLAIN_KEY` for a str key kept as it is whose value is not sensitive."""
    name = key if isinstance(key, str) else str(key)
    new_key, used = scrub(name)
    sensitive = field_is_sensitive(name, container)
    if isinstance(key, str) and not used and not sensitive:
        return _PLAIN_KEY
    return name, new_key, ", ".join(used), sensitive


def _free_key(key: str, taken: dict[str, Any], source: dict[Any, Any]) -> str:
    """`key`, or `key#2`, `key#3`... if a member of the output or the input already has it."""
    candidate, n = key, 1
    while candidate in taken or candidate in source:
        n += 1
        candidate = f"{key}#{n}"
    return candidate


def withholds(key: object, value: Any) -> bool:
    """Whether replay_only withholds `value` under `key`: text or a container under a payload
    key. Flags and counts stay (`"summary": true` marks a compaction summary; a bundle whose flag
    became text could not be imported)."""
    return key in PAYLOAD_KEYS and isinstance(value, str | list | dict) and value != WITHHELD


def _withhold(value: Any, path: str, entries: list[RedactionEntry]) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, child in value.items():
            where = child_path(path, key)
            if withholds(key, child):
                entries.append(RedactionEntry(where, PROMPT_PAYLOAD, "withheld", WITHHELD))
                out[key] = WITHHELD
            else:
                out[key] = _withhold(child, where, entries)
        return out
    if isinstance(value, list):
        return [_withhold(item, f"{path}[{i}]", entries) for i, item in enumerate(value)]
    return value


def plain_copy(body: Any) -> Any:
    """A deep copy of `body` as JSON would carry it (tuples become lists, bytes base64).
    Raises `InvalidArgumentError` for what JSON cannot carry."""
    return json_copy(body, what="bundle")


def redact(
    body: dict[str, Any], mode: str, *, pulse: Callable[[int], object] | None = None
) -> tuple[dict[str, Any], list[RedactionEntry]]:
    """A redacted copy of the bundle `body` (everything but its `redaction` section) and the
    manifest entries, sorted by path. `local` returns an unchanged copy and no entries.
    `pulse(n)`, if given, hears of every thousand items of a `messages` or `events` list
    redacted (and of the rest at the end of each list)."""
    if mode not in MODES:
        raise ValueError(f"redaction mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "local":
        return plain_copy(body), []
    sanitizer = _Sanitizer(pulse)
    forget()
    try:
        out: dict[str, Any] = sanitizer.value(body, _ROOT, None)
    finally:
        forget()
    entries = sanitizer.entries
    if mode == "replay_only":
        out = _withhold(out, "$", entries)
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


def members(value: Any, path: str) -> Iterator[tuple[str, Any, str | None, Any]]:
    """Every (path, value, key, container key) under `value`, depth first, without recursion."""
    stack: list[tuple[str, Any, str | None, Any]] = [(path, value, None, None)]
    while stack:
        where, item, key, container = stack.pop()
        yield where, item, key, container
        if isinstance(item, dict):
            stack.extend(
                (child_path(where, str(k)), v, str(k), key) for k, v in reversed(list(item.items()))
            )
        elif isinstance(item, list):
            stack.extend(
                (f"{where}[{i}]", v, None, key) for i, v in reversed(list(enumerate(item)))
            )


def find_secrets(value: Any, path: str = "$") -> list[tuple[str, list[str]]]:
    """Everything under `value` sanitizing would still change: (JSONPath, kinds). Kinds are the
    secret kinds of a string, `secret_in_key:...` for a dict key, `credential_field` for a
    credential's field that still has a value, `split_...` for a list item holding part of a
    secret that only shows with its neighbours."""
    found: list[tuple[str, list[str]]] = []
    forget()
    open_blocks = False
    for where, item, key, _container in members(value, path):
        kinds: list[str] = []
        if key is not None:
            kinds += [f"secret_in_key:{kind}" for kind in secret_kinds(key)]
            if credential_name(key) and not _keeps_value(item):
                kinds.append("credential_field")
        if isinstance(item, dict) and ("value" in item or "Value" in item):
            found += [
                (child_path(where, k), ["credential_field"])
                for k in paired_values(item)
                if not _keeps_value(item[k])
            ]
        if isinstance(item, str):
            kinds += secret_kinds(item)
            open_blocks = open_blocks or (
                any(k in BLOCK_KINDS for k in kinds) and opens_block(item) is not None
            )
        elif isinstance(item, list) and all(isinstance(i, str) for i in item):
            split = split_secrets(item)
            found.extend((f"{where}[{i}]", [f"split_{kind}"]) for i, kind in sorted(split.items()))
        elif isinstance(item, list) and any(isinstance(i, dict) and "text" in i for i in item):
            split = split_blocks(item)
            found += [(f"{where}[{i}].text", [f"split_{k}"]) for i, k in sorted(split.items())]
        if kinds:
            found.append((where, kinds))
    if open_blocks:
        found += _continued_blocks(value, path)
    forget()
    return found


def _continued_blocks(value: Any, path: str) -> list[tuple[str, list[str]]]:
    """The items of every list that go on with a private key block an earlier item opened."""
    found: list[tuple[str, list[str]]] = []
    for where, item, _, _ in members(value, path):
        if not isinstance(item, list):
            continue
        kind: str | None = None
        for i, child in enumerate(item):
            if kind is not None:
                parts = _block_parts(child)
                if parts:
                    found += [(f"{where}[{i}]{suffix}", [f"split_{kind}"]) for suffix, _ in parts]
                    if any(closed for _, closed in parts):
                        kind = None
                    continue
            kind = _block_opened(child)
    return found


def _block_opened(value: Any) -> str | None:
    """The kind of the last private key block left open by a string anywhere in `value`."""
    kind = None
    for _, item, _, _ in members(value, ""):
        if isinstance(item, str):
            kind = opens_block(item) or kind
    return kind


def _block_parts(item: Any) -> list[tuple[str, bool]]:
    """(JSONPath suffix, ends the block) of each part of `item` that goes on with a block."""
    if isinstance(item, str):
        part, closed = continues_block(item)
        return [("", closed)] if part else []
    if not isinstance(item, dict):
        return []
    parts: list[tuple[str, bool]] = []
    for keys, text in payload_leaves(item):
        part, closed = continues_block(text)
        if part:
            parts.append(("".join(_step(key) for key in keys), closed))
    return parts
