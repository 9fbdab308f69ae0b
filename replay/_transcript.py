"""Reading Harn-style `llm_transcript.jsonl` files into prompt-visible messages and metadata.

Owns the bounded, binary line reader and the rules of the three source formats (message events,
request snapshots, responses only). One pass keeps only what the winning format can still need,
re-encoded into one buffer, and counts as it keeps: memory stays within a multiple of the file
(`_limits.seed_memory_file_ratio`), and a line whose decoded objects would not fit is refused
before it is decoded. It never writes; `replay._seed` does.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import msgspec
from blake3 import blake3

from eventlog import limits
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


# JSON, like the source: whatever a line decoded to encodes back exactly (an integer past 64 bits
# included, for the session engine to judge), and decodes to equal values.
_encode = msgspec.json.Encoder().encode
_decode_kept = msgspec.json.Decoder().decode
_KEPT_ENTRY_BYTES = 12
"""What one kept message costs beyond its encoded bytes: its end offset and its line number."""
_WRITE_ENTRY_BYTES = 48
"""What the session engine's write of one message costs beyond its encoded bytes, generously: its
share of an event's framing, its transcript reference, and the pages they fill."""
_LINE_NUMBER_MAX = 2**32 - 1
_DEAD_BYTES_MIN = 256 * 1024
"""Messages `keep_last` dropped are cut from the buffer once they take this much and more than the
live ones: each cut copies the live part, so cutting at every drop would cost quadratic time."""


class KeptMessages:
    """The messages kept, in order, each re-encoded (compact JSON) into one shared buffer with its line:
    a message costs its encoded size plus 12 bytes, where a dict of it would cost hundreds. Read
    back one at a time (`m[i]`, iteration) or in `batches`. With `keep_last`, only the last that
    many stay, like a bounded deque."""

    def __init__(self, keep_last: int | None = None) -> None:
        self._keep_last = keep_last
        self.clear()

    def clear(self) -> None:
        self._buffer = bytearray()
        self._ends = array("Q")
        self._lines = array("I")
        self._first = 0  # messages before this one were dropped by `keep_last`

    def append(self, message: Message, line: int) -> None:
        if line > _LINE_NUMBER_MAX:
            raise OverflowError(f"line numbers past {_LINE_NUMBER_MAX:,} are not kept")
        self._buffer += _encode(message)
        self._ends.append(len(self._buffer))
        self._lines.append(line)
        if self._keep_last is not None and len(self) > self._keep_last:
            self._first += 1
            dead = self._ends[self._first - 1]
            if dead >= max(len(self._buffer) - dead, _DEAD_BYTES_MIN):  # mostly dead: compact
                self._drop_dead()

    def _drop_dead(self) -> None:
        start = self._ends[self._first - 1]
        del self._buffer[:start]
        self._ends = array("Q", (end - start for end in self._ends[self._first :]))
        del self._lines[: self._first]
        self._first = 0

    @property
    def seed_cost(self) -> int:
        """The peak memory seeding these messages takes, estimated: this buffer, and the session
        engine's write of the same messages beside it (about as many bytes again, plus each
        message's framing and reference)."""
        count = len(self._ends)
        kept = len(self._buffer) + _KEPT_ENTRY_BYTES * count
        return kept + len(self._buffer) + _WRITE_ENTRY_BYTES * count

    @property
    def lines(self) -> Sequence[int]:
        """The 1-based line each kept message came from."""
        return self._lines if self._first == 0 else self._lines[self._first :]

    def __len__(self) -> int:
        return len(self._ends) - self._first

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        count = len(self)
        if not -count <= index < count:
            raise IndexError(f"kept message {index} of {count}")
        at = self._first + (index % count)
        start = self._ends[at - 1] if at else 0
        value: Message = _decode_kept(memoryview(self._buffer)[start : self._ends[at]])
        return value

    def __iter__(self) -> Iterator[Message]:
        return (self[i] for i in range(len(self)))

    def batches(self, count_max: int, bytes_max: int) -> Iterator[list[Message]]:
        """The messages in order, as lists of at most `count_max` messages or about `bytes_max`
        encoded bytes: only one batch is ever decoded at a time."""
        batch: list[Message] = []
        size = 0
        for index in range(len(self)):
            at = self._first + index
            start = self._ends[at - 1] if at else 0
            batch.append(_decode_kept(memoryview(self._buffer)[start : self._ends[at]]))
            size += self._ends[at] - start
            if len(batch) >= count_max or size >= bytes_max:
                yield batch
                batch, size = [], 0
        if batch:
            yield batch


def decoded_bytes_estimate(line: bytes) -> int:
    """An upper estimate of what the Python objects decoded from `line` take, from byte counts
    alone (C speed, before decoding): its bytes, plus CPython's cost of each object, dict, list
    and string, and a slot of about 24 bytes per `,` and `:` (a list slot, a dict entry, or a
    number object). Separators inside strings are counted too: the estimate errs high."""
    strings = (line.count(b'"') - line.count(b'\\"')) // 2
    separators = line.count(b",") + line.count(b":")
    return (
        len(line) + 64 * line.count(b"{") + 56 * line.count(b"[") + 50 * strings + 24 * separators
    )


@dataclass
class Transcript:
    """What one file says, with `drop_tool_calls` and `truncate_to_last` already applied: the
    messages kept, in order, each with the line it came from; how many the format produced before
    the options (`found`); whether the truncation cut any; and the metadata."""

    messages: KeptMessages
    lines: Sequence[int]
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
    last `truncate_to_last`), so only the messages that will be kept are held, and they are
    counted as they are kept: past `messages_per_transcript_max`, or past the reading budget
    (`_limits.seed_memory_file_ratio` times the file), reading stops with the line that did it.
    `progress(bytes_read, file_bytes)` is called every few thousand lines."""
    shown = os.fspath(path)
    digest = blake3()
    state = _State(shown, drop_tool_calls, truncate_to_last)
    for number, record in _records(shown, digest, progress, state):
        state.add(number, record)
    return state.finish(digest.hexdigest())


def _records(
    path: str,
    digest: blake3,
    progress: Callable[[int, int], object] | None = None,
    state: _State | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) of every non-blank line, hashing every byte read. Sets the
    `state`'s memory budget from the file's size, and refuses a line whose decoded objects, with
    what the state keeps already, would pass it before the line is decoded."""
    decode = msgspec.json.Decoder().decode
    bound = _limits.transcript_line_bytes_max
    try:
        with open(path, "rb", buffering=_READ_BUFFER_BYTES) as file:
            size = os.fstat(file.fileno()).st_size
            budget = max(_limits.seed_memory_file_ratio * size, _limits.seed_memory_floor_bytes)
            if state is not None:
                state.budget = budget
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
                held = 0 if state is None else state.kept.seed_cost
                needs = decoded_bytes_estimate(line)
                if held + needs > budget:
                    raise TranscriptError(path, number, _over_budget(held, needs, budget))
                yield number, _decoded(decode, line, path, number)
    except OSError as exc:
        raise TranscriptError(path, None, f"cannot read the file: {exc.strerror or exc}") from exc


def _over_budget(held: int, needs: int, budget: int) -> str:
    return (
        f"this line would decode into about {needs:,} bytes of objects, which with the "
        f"{held:,} bytes the messages kept so far will cost is more than seeding may take "
        f"({_budget_text(budget)}); a transcript this dense in objects is not one we seed"
    )


def _budget_text(budget: int) -> str:
    return (
        f"{budget:,} bytes: seed_memory_file_ratio = {_limits.seed_memory_file_ratio} times the "
        f"file, at least seed_memory_floor_bytes = {_limits.seed_memory_floor_bytes:,}"
    )


def _decoded(decode: Any, line: bytes, path: str, number: int) -> dict[str, Any]:
    try:
        value = decode(line)
    except RecursionError as exc:
        raise TranscriptError(path, number, "JSON nested too deeply to decode") from exc
    except ValueError as exc:  # msgspec's decode errors are ValueErrors, as is bad UTF-8
        raise TranscriptError(path, number, _why_undecodable(line, exc)) from exc
    if type(value) is not dict:
        raise TranscriptError(path, number, f"expected a JSON object, got {json_type_name(value)}")
    return value


def _why_undecodable(line: bytes, exc: ValueError) -> str:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"invalid UTF-8 at byte {bad.start + 1} of the line"
    return f"invalid JSON: {exc}"


def json_type_name(value: object) -> str:
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

    def __init__(self, path: str, drop_tool_calls: bool, keep_last: int | None) -> None:
        self.path = path
        self.budget = _limits.seed_memory_floor_bytes  # `_records` sets the file's own
        self.records = 0
        self.events_seen = False
        self.snapshot_seen = False
        self.drop_tool_calls = drop_tool_calls
        self.keep_last = keep_last
        self.kept = KeptMessages(keep_last)
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
        if len(self.kept) >= limits.messages_per_transcript_max and self.keep_last is None:
            raise TranscriptError(
                self.path,
                number,
                f"transcript length: {len(self.kept) + 1} exceeds messages_per_transcript_max = "
                f"{limits.messages_per_transcript_max}",
            )
        try:
            self.kept.append(message, number)
        except OverflowError as exc:
            raise TranscriptError(self.path, number, str(exc)) from exc
        if self.kept.seed_cost > self.budget:  # many messages out of few bytes: `{}` x millions
            raise TranscriptError(
                self.path,
                number,
                f"the {len(self.kept):,} messages kept up to this line would cost about "
                f"{self.kept.seed_cost:,} bytes to seed, more than it may take "
                f"({_budget_text(self.budget)})",
            )

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
            messages=self.kept,
            lines=self.kept.lines,
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
