"""Reading Harn-style `llm_transcript.jsonl` files into prompt-visible messages and metadata.

Owns the bounded, binary line reader and the rules of the three source formats (message events,
request snapshots, responses only). One pass keeps only what the winning format can still need,
so memory follows the messages kept, not the file. It never writes; `replay._seed` does.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
from blake3 import blake3

from replay import _limits
from sessions import InvalidArgumentError

MESSAGE_EVENTS = "message_events"
REQUEST_SNAPSHOTS = "request_snapshots"
PROVIDER_RESPONSES_ONLY = "provider_responses_only"

_MESSAGE_KINDS = frozenset(("message", "tool_result", "tool_results"))
_REQUEST_KINDS = frozenset(("provider_call_request", "request"))
_RESPONSE_KINDS = frozenset(("provider_call_response", "response"))
_COPIED_KEYS = (
    "name",
    "tool_call_id",
    "tool_use_id",
    "tool_calls",
    "native_tool_calls",
    "reasoning",
)
_BOM = b"\xef\xbb\xbf"
_READ_BUFFER_BYTES = 1 << 20
# How often `progress` hears of the bytes read: often enough for a bar, rare enough to cost nothing.
_PROGRESS_LINES = 4096

Message = dict[str, Any]


class TranscriptError(InvalidArgumentError):
    """A transcript file could not be read: unreadable, not JSON lines, or past a bound.

    `seed_from_jsonl` returns these as `ok: false` results; the message names the file and, where
    there is one, the 1-based line."""

    def __init__(self, path: str, line: int | None, problem: str) -> None:
        self.path = path
        self.line = line
        super().__init__(f"{path}:{line}: {problem}" if line else f"{path}: {problem}")


@dataclass
class Transcript:
    """What one file says, with `drop_tool_calls` and `truncate_to_last` already applied: the
    messages kept, in order, each with the line it came from; how many the format produced before
    the options (`found`); whether the truncation cut any; and the metadata."""

    messages: list[Message]
    lines: list[int]
    found: int
    truncated: bool
    source_format: str
    records: int
    system_prompt: str | None
    provider: str | None
    model: str | None
    tool_format: str | None
    blake3: str


def read_transcript(
    path: str | os.PathLike[str],
    *,
    drop_tool_calls: bool = False,
    truncate_to_last: int | None = None,
    progress: Callable[[int, int], object] | None = None,
) -> Transcript:
    """Read the whole file in one pass; raise `TranscriptError` on the first unreadable line.

    The options are applied as messages arrive (dropping tool payloads first, then keeping the
    last `truncate_to_last`), so only the messages that will be kept are held.
    `progress(bytes_read, file_bytes)` is called every few thousand lines."""
    shown = os.fspath(path)
    digest = blake3()
    state = _State(drop_tool_calls, truncate_to_last)
    for number, record in _records(shown, digest, progress):
        state.add(number, record)
    return state.finish(digest.hexdigest())


def _records(
    path: str, digest: blake3, progress: Callable[[int, int], object] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) of every non-blank line, hashing every byte read."""
    decode = msgspec.json.Decoder().decode
    bound = _limits.transcript_line_bytes_max
    try:
        with open(path, "rb", buffering=_READ_BUFFER_BYTES) as file:
            size = os.fstat(file.fileno()).st_size if progress is not None else 0
            number = 0
            while True:
                line = file.readline(bound + 1)
                if not line:
                    if progress is not None:
                        progress(size, size)
                    return
                number += 1
                digest.update(line)
                if progress is not None and number % _PROGRESS_LINES == 0:
                    progress(file.tell(), size)
                if len(line) > bound and not line.endswith(b"\n"):
                    raise TranscriptError(
                        path,
                        number,
                        f"line is longer than transcript_line_bytes_max = {bound:,} bytes",
                    )
                if number == 1 and line.startswith(_BOM):
                    line = line[len(_BOM) :]  # some editors write one; it is not part of the JSON
                if not line.strip():
                    continue
                yield number, _decoded(decode, line, path, number)
    except OSError as exc:
        raise TranscriptError(path, None, f"cannot read the file: {exc.strerror or exc}") from exc


def _decoded(decode: Any, line: bytes, path: str, number: int) -> dict[str, Any]:
    try:
        value = decode(line)
    except RecursionError as exc:
        raise TranscriptError(path, number, "JSON nested too deeply to decode") from exc
    except ValueError as exc:  # msgspec's decode errors are ValueErrors, as is bad UTF-8
        raise TranscriptError(path, number, _why_undecodable(line, exc)) from exc
    if type(value) is not dict:
        raise TranscriptError(path, number, f"expected a JSON object, got {_json_type_name(value)}")
    return value


def _why_undecodable(line: bytes, exc: ValueError) -> str:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"invalid UTF-8 at byte {bad.start + 1} of the line"
    return f"invalid JSON: {exc}"


def _json_type_name(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "null"


class _State:
    """The running state of one pass, per format.

    Message events win over everything, so once one is seen the snapshot state is dropped and no
    longer kept. Until then one accumulator serves both other formats: a request snapshot replaces
    it and a response appends to it, so it holds only the latest snapshot and the responses after
    it (and, in a responses-only file, every response)."""

    def __init__(self, drop_tool_calls: bool, keep_last: int | None) -> None:
        self.records = 0
        self.events_seen = False
        self.snapshot_seen = False
        self.drop_tool_calls = drop_tool_calls
        self.keep_last = keep_last
        self.kept: deque[tuple[Message, int]] = deque(maxlen=keep_last)
        self.found = 0  # messages the format produced, before the options
        self.after_drop = 0  # of those, the ones `drop_tool_calls` left
        self.system_prompt: str | None = None
        self.provider: str | None = None
        self.model: str | None = None
        self.tool_format: str | None = None

    def add(self, number: int, record: dict[str, Any]) -> None:
        self.records += 1
        kind = record.get("type")
        if type(kind) is not str:
            kind = record.get("kind")
        if kind in _MESSAGE_KINDS:
            if not self.events_seen:
                self.events_seen = True
                self._clear()  # snapshots and responses no longer count
            for message in _event_messages(kind, record):
                self._keep(message, number)
            return
        if kind in _REQUEST_KINDS:
            self._request_metadata(record)
        elif kind == "system_prompt":
            self.system_prompt = _text(record.get("content")) or self.system_prompt
        elif kind in _RESPONSE_KINDS:
            self.provider = self.provider or _text(record.get("provider"))
            self.model = self.model or _text(record.get("model"))
        if self.events_seen:
            return
        snapshot = _snapshot_messages(record)
        if snapshot is not None:
            self.snapshot_seen = True
            self._clear()
            for message in snapshot:
                self._keep(message, number)
        elif kind in _RESPONSE_KINDS:
            reply = _response_message(record)
            if reply is not None:
                self._keep(reply, number)

    def _clear(self) -> None:
        self.kept.clear()
        self.found = self.after_drop = 0

    def _keep(self, message: Message, number: int) -> None:
        self.found += 1
        if self.drop_tool_calls:
            stripped = without_tools(message)
            if stripped is None:
                return
            message = stripped
        self.after_drop += 1
        self.kept.append((message, number))

    def _request_metadata(self, record: dict[str, Any]) -> None:
        snapshot = record.get("request_snapshot")
        system = _text(record.get("system"))
        if system is None and type(snapshot) is dict:
            system = _text(snapshot.get("system"))
        self.system_prompt = system or self.system_prompt
        self.provider = _text(record.get("provider")) or self.provider
        self.model = _text(record.get("model")) or self.model
        self.tool_format = _text(record.get("tool_format")) or self.tool_format

    def finish(self, digest: str) -> Transcript:
        if self.events_seen:
            source_format = MESSAGE_EVENTS
        elif self.snapshot_seen:
            source_format = REQUEST_SNAPSHOTS
        else:
            source_format = PROVIDER_RESPONSES_ONLY
        return Transcript(
            messages=[message for message, _ in self.kept],
            lines=[number for _, number in self.kept],
            found=self.found,
            truncated=self.keep_last is not None and self.after_drop > self.keep_last,
            source_format=source_format,
            records=self.records,
            system_prompt=self.system_prompt,
            provider=self.provider,
            model=self.model,
            tool_format=self.tool_format,
            blake3=digest,
        )


# Records to messages. Throughout, a key whose value is null counts as absent: the flat shape
# writes every absent field as null.


def _text(value: object) -> str | None:
    """`value` when it is a string with something besides whitespace in it."""
    return value if type(value) is str and value.strip() else None


def _prompt_visible(value: object) -> Message | None:
    """`value` as a message if it is one: an object with a non-empty string role and content,
    tool calls or native tool calls. The object itself is kept, unknown keys and all."""
    if type(value) is not dict or _text(value.get("role")) is None:
        return None
    if (
        value.get("content") is None
        and value.get("tool_calls") is None
        and value.get("native_tool_calls") is None
    ):
        return None
    return value


def _event_messages(kind: str, record: dict[str, Any]) -> list[Message]:
    if kind == "tool_results":
        listed = record.get("messages")
        if type(listed) is list:
            return [m for m in map(_prompt_visible, listed) if m is not None]
        results = record.get("results")
        if type(results) is not list:
            return []
        return [m for m in map(_result_message, results) if m is not None]
    nested = _prompt_visible(record.get("message"))
    if nested is not None:
        return [nested]
    flat = _flat_message(kind, record)
    return [] if flat is None else [flat]


def _flat_message(kind: str, record: dict[str, Any]) -> Message | None:
    """A message written with its fields at the top level of the record."""
    role = _text(record.get("role")) or ("tool" if kind == "tool_result" else None)
    if role is None:
        return None
    content = record.get("content")
    if content is None:
        content = _text(record.get("text")) or ""
    message: Message = {"role": role, "content": content}
    for key in _COPIED_KEYS:
        value = record.get(key)
        if value is not None:
            message[key] = value
    return message


def _first(data: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        value = data.get(key)
        if value is not None:
            return value
    return None


def _result_message(result: object) -> Message | None:
    """One entry of a `tool_results` record's `results` as a tool message."""
    if type(result) is not dict:
        return None
    message: Message = {"role": "tool"}
    name = _first(result, "tool_name", "name")
    if type(name) is str and name:
        message["name"] = name
    call_id = _first(result, "tool_call_id", "tool_use_id")
    if type(call_id) is str:
        message["tool_call_id"] = call_id
    content = _first(result, "observation", "rendered_result", "output", "content")
    message["content"] = "" if content is None else content
    return message


def _snapshot_messages(record: dict[str, Any]) -> list[Message] | None:
    """The messages of a request snapshot (`request_snapshot.messages`, else a top-level
    `messages` array), or None when the record carries no snapshot."""
    snapshot = record.get("request_snapshot")
    listed = snapshot.get("messages") if type(snapshot) is dict else None
    if listed is None:
        listed = record.get("messages")
    if type(listed) is not list:
        return None
    return [m for m in map(_prompt_visible, listed) if m is not None]


def _response_message(record: dict[str, Any]) -> Message | None:
    """The assistant message a provider response stands for, or None when it said nothing."""
    text = _text(record.get("text")) or ""
    calls = record.get("tool_calls")
    if type(calls) is not list:
        calls = []
    if not text and not calls:
        return None
    message: Message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    thinking = _text(record.get("thinking"))
    if thinking is not None:
        message["reasoning"] = thinking
    return message


# The `drop_tool_calls` option

_TOOL_ROLES = frozenset(("tool", "tool_result"))
_TOOL_KEYS = frozenset(("tool_calls", "native_tool_calls", "tool_call_id", "tool_use_id"))


def without_tools(message: Message) -> Message | None:
    """`message` with its tool payloads removed, or None when nothing prompt-visible is left:
    tool messages go, tool-call fields go, content keeps only its text blocks."""
    role = message.get("role")
    if role in _TOOL_ROLES:
        return None
    stripped = {key: value for key, value in message.items() if key not in _TOOL_KEYS}
    content = stripped.get("content")
    if isinstance(content, list):
        texts = [block for block in content if _is_text_block(block)]
        if not texts:
            return None
        stripped["content"] = texts
    if role == "assistant" and _no_text(stripped.get("content")):
        return None
    return stripped


def _is_text_block(block: object) -> bool:
    """A text block, or a block that does not say what it is (a bare string, an untyped dict)."""
    kind = block.get("type") if isinstance(block, dict) else None
    return not isinstance(kind, str) or kind == "text"


def _no_text(content: object) -> bool:
    if content is None:
        return True
    if isinstance(content, str):
        return not content.strip()
    if isinstance(content, list):
        return not content
    return False
