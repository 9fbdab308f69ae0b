"""What every agent-log reader shares: the typed error, the bounded readers, the session built.

A reader turns the records of one file into `Built` sessions. `Built` keeps each finished message
re-encoded in one buffer (a message costs about its JSON size, not a dict's), attaches every
record that is not a message to the next message's metadata, and pairs tool calls with results.
Nothing here writes to a store; `replay.agentlogs._verb` does.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgspec
from blake3 import blake3

from eventlog import SessionLogError, check_plain, limits
from replay import _limits
from replay._transcript import decoded_bytes_estimate, json_type_name
from replay.agentlogs._decode import decode_line, failing_line, why_undecodable
from replay.agentlogs._kept import Kept
from sessions import InvalidArgumentError

Message = dict[str, Any]
Record = dict[str, Any]
Progress = Callable[[int, int], object]
Spawn = tuple[str, object, str | None]  # a spawning call's id, its prompt, the agent it names

KIND = "imported agent log"
"""The `metadata.agent_log.kind` of every imported session: what a viewer filters on."""

_READ_BUFFER_BYTES = 1 << 20
_PROGRESS_LINES = 2048
_BOM = b"\xef\xbb\xbf"
_UNKNOWN_FIELD_NAMES_MAX = 64  # names listed in the metadata; all are counted
_DEPTH_SAFE = limits.value_depth_max - 8  # a message wraps its record's values a few levels in
_CUT_CHARS_MIN = 64  # shorter text stays in its record: cutting it saves less than its note
_OBJECT_BYTES_PER_BYTE_MAX = 65  # a `{` costs `decoded_bytes_estimate` 64 bytes and itself
_encode = msgspec.json.Encoder().encode


class AgentLogError(InvalidArgumentError):
    """An agent log could not be imported: unreadable, damaged at a line, or past a bound.

    `path` and `line` (1-based, None when the whole file is at fault) say where; nothing was
    written when it is raised."""

    def __init__(self, path: str, line: int | None, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        super().__init__(f"{path}:{line}: {problem}" if line else f"{path}: {problem}")


class NotAnAgentLogError(AgentLogError):
    """The file is none of the formats read (a folder import leaves such files alone)."""


# Reading


@dataclass
class Source:
    """One file being read: its path, its digest so far, and the lines skipped as damaged."""

    path: str
    skip_bad_lines: bool = False
    progress: Progress | None = None
    digest: Any = field(default_factory=blake3)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    size: int = 0  # the bytes read: the complete lines, without a pending tail
    pending: int = 0  # bytes of a last line without its line break yet (left for next time)
    limit: int | None = None  # read no more than this (a second reading: what the first read)
    held: Callable[[], int] = lambda: 0  # bytes the reader keeps so far (for the budget)
    line: bytes = b""  # the line being read, as the file has it (JSONL)
    first_line: str | None = None
    """The blake3 (hex) of the first line that is not blank, as the file has it with its line
    break (JSONL): what appending lines never changes. None while no such line is complete."""
    number: int | None = None  # its 1-based line (a document's: item); None between readings
    document: bool = False  # the file is one JSON document, not lines
    document_bytes: bytes = b""  # a document's bytes (its items point into them)

    def record_bytes(self, record: Record) -> bytes:
        """The original JSON of `record`: the current line's (or document item's) own bytes, as
        the file has them (a record is always handed on while its line is current)."""
        return self.line if self.document else self.line.rstrip(b"\r\n")

    def record_text(self, record: Record) -> str:
        return self.record_bytes(record).decode()

    def damaged(self, line: int, problem: str) -> None:
        """A damaged line: raise, or (with `skip_bad_lines`) note it and go on."""
        if not self.skip_bad_lines:
            raise AgentLogError(self.path, line, problem)
        self.skipped.append((line, problem))


_P = ParamSpec("_P")
_T = TypeVar("_T")


def shape_checked(
    parse: Callable[Concatenate[Source, _P], _T],
) -> Callable[Concatenate[Source, _P], _T]:
    """A format's parse, with a value of a shape it did not expect (a list where it reads a
    string, a number where it reads a list) raised as the `AgentLogError` of the record being
    read (`Source.number`), not as the TypeError it caused. The readers check the shapes they
    rely on; this is the net under what they miss."""

    @functools.wraps(parse)
    def checked(source: Source, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return parse(source, *args, **kwargs)
        except SessionLogError:  # typed already (AgentLogError, a bound passed): as it is
            raise
        except (TypeError, AttributeError, KeyError, ValueError) as exc:
            problem = f"unexpected shape: {type(exc).__name__}: {exc}"
            raise AgentLogError(source.path, source.number, problem) from exc

    return checked


def json_lines(source: Source) -> Iterator[tuple[int, Record]]:
    """(1-based line, object) of every non-blank line, hashing every byte. A line past
    `agent_log_line_bytes_max`, or whose objects would not fit the memory budget, is refused
    before it is decoded (whatever `skip_bad_lines` says: it is a bound, not damage). A last
    line without its line break is a write in progress, not damage: it is neither read nor
    hashed (`source.pending` says how long it is), so the next import reads it once complete."""
    bound = _limits.agent_log_line_bytes_max
    try:
        file = open(source.path, "rb", buffering=_READ_BUFFER_BYTES)  # noqa: SIM115
    except OSError as exc:
        raise AgentLogError(source.path, None, f"cannot read: {exc.strerror or exc}") from exc
    with file:
        source.size = size = os.fstat(file.fileno()).st_size
        budget = max(_limits.agent_log_memory_file_ratio * size, _limits.seed_memory_floor_bytes)
        number = read = 0
        update, held_of, limit = source.digest.update, source.held, source.limit
        while limit is None or read < limit:
            try:
                line = file.readline(bound + 1 if limit is None else min(bound + 1, limit - read))
            except OSError as exc:
                raise AgentLogError(source.path, number + 1, f"cannot read: {exc}") from exc
            if not line:
                break
            if not line.endswith(b"\n") and len(line) <= bound:  # at the end: being written
                source.pending = len(line)
                break
            number += 1
            read += len(line)
            update(line)
            if source.progress is not None and number % _PROGRESS_LINES == 0:
                source.progress(file.tell(), size)
            if len(line) > bound and not line.endswith(b"\n"):
                raise AgentLogError(
                    source.path, number, f"line longer than agent_log_line_bytes_max = {bound:,}"
                )
            raw = line
            if number == 1 and line.startswith(_BOM):
                line = line[len(_BOM) :]
            if not line or line.isspace():  # blank
                continue
            if source.first_line is None:
                source.first_line = blake3(raw).hexdigest()
            held = held_of()
            # No byte decodes into more than _OBJECT_BYTES_PER_BYTE_MAX bytes of objects, so the
            # exact estimate (four scans of the line) is needed only near the budget.
            needs = len(line) * _OBJECT_BYTES_PER_BYTE_MAX
            if held + needs > budget:
                needs = decoded_bytes_estimate(line)
            if held + needs > budget:
                raise AgentLogError(
                    source.path,
                    number,
                    f"this line would decode into about {needs:,} bytes of objects, more than "
                    f"importing may hold ({budget:,} bytes: agent_log_memory_file_ratio = "
                    f"{_limits.agent_log_memory_file_ratio} times the file)",
                )
            try:
                value = decode_line(line)
            except (ValueError, RecursionError) as exc:
                _undecodable(source, line, number, exc)
                continue
            if type(value) is dict:
                source.line, source.number = line, number
                yield number, value
            else:
                source.damaged(number, f"expected a JSON object, got {json_type_name(value)}")
    source.number = None
    source.size = read  # what the digest is of: a live log may have grown while it was read
    if source.progress is not None:
        source.progress(size, size)


def _undecodable(source: Source, line: bytes, number: int, exc: Exception) -> None:
    if isinstance(exc, RecursionError):
        source.damaged(number, "JSON nested too deeply to decode")
    else:  # msgspec's decode errors are ValueErrors, as is bad UTF-8
        assert isinstance(exc, ValueError)
        source.damaged(number, why_undecodable(line, exc))


ITEM_ARRAYS = ("messages", "history")  # a document's arrays of items read one at a time
_document_decode = msgspec.json.Decoder(dict[str, msgspec.Raw] | list[msgspec.Raw]).decode
_items_decode = msgspec.json.Decoder(list[msgspec.Raw]).decode


def json_document(source: Source) -> Any:
    """The whole file decoded as one JSON value (Gemini CLI sessions, trajectories). Damage is
    reported at the line holding the byte where decoding failed; damage in a document cannot be
    skipped (the rest of it has no boundaries to resume at)."""
    bound = _limits.agent_log_document_bytes_max
    try:
        with open(source.path, "rb") as file:
            source.size = size = os.fstat(file.fileno()).st_size
            if size > bound:
                raise AgentLogError(
                    source.path, None, f"{size:,} bytes, more than agent_log_document_bytes_max"
                )
            data = file.read(size + 1)
    except OSError as exc:
        raise AgentLogError(source.path, None, f"cannot read: {exc.strerror or exc}") from exc
    source.digest.update(data)
    source.document = True
    if source.progress is not None:
        source.progress(len(data), len(data))
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    source.document_bytes = data
    try:
        return _items_left_raw(data)
    except (ValueError, RecursionError):  # a decoding of the whole names the failing byte
        return _decoded_whole(source)


def _decoded_whole(source: Source) -> Any:
    data = source.document_bytes
    try:
        return msgspec.json.decode(data)
    except RecursionError as exc:
        raise AgentLogError(source.path, None, "JSON nested too deeply to decode") from exc
    except ValueError as exc:
        raise AgentLogError(
            source.path, failing_line(data, exc), why_undecodable(data, exc)
        ) from exc


# Building sessions


def _nested_deeply(text: bytes) -> bool:
    """Whether a record's JSON may nest near `value_depth_max` (it opens that many containers:
    two scans in C). Only then is a message made from it walked by `check_plain`; the kept
    record itself is one string."""
    return text.count(b"{") + text.count(b"[") > _DEPTH_SAFE


def finish_records(message: Message) -> None:
    """Turn the records a message was read from into text, taking the message's text out of the
    record that holds it as the very JSON string the encoder writes (as JavaScript's
    `JSON.stringify` does), or as that string inside another JSON string (a tool's JSON output
    kept as text, as Codex keeps it): the message keeps it once, and `source.content_at`
    (`[record index, byte offset in its UTF-8]`, and `2` after them when it was nested) says
    where it goes back (`restored_records`). A record holding it otherwise stays whole."""
    source = message["metadata"]["source"]
    records: list[bytes] = source["records"]
    content = message.get("content")
    if type(content) is str and len(content) >= _CUT_CHARS_MIN:
        needle = _encode(content)
        found = _find(records, needle)
        depth = 1
        if found is None:
            needle = _nested(needle)
            found, depth = _find(records, needle), 2
        if found is not None:  # whole JSON string tokens are cut: the rest is still UTF-8
            index, at = found
            records[index] = records[index][:at] + records[index][at + len(needle) :]
            source["content_at"] = [index, at] if depth == 1 else [index, at, depth]
    source["records"] = [raw.decode() for raw in records]


def _find(records: list[bytes], needle: bytes) -> tuple[int, int] | None:
    for index, raw in enumerate(records):
        at = raw.find(needle)
        if at >= 0:
            return index, at
    return None


def _nested(encoded: bytes) -> bytes:
    """A JSON string, `encoded`, as it reads inside another JSON string (its quotes left out)."""
    return _encode(encoded.decode())[1:-1]


def insert_kept_texts(found: dict[int, str], kept: list[tuple[int, int, str]]) -> None:
    """Put back into the records of `found` (by line) the texts `cut_from_held` took out of
    them, each (line, offset, text) as the message that keeps it says, the last cut first."""
    for line, at, text in reversed(kept):
        raw = found[line].encode()
        found[line] = (raw[:at] + _encode(text) + raw[at:]).decode()


def restored_records(message: Message) -> list[str]:
    """The original JSON text of each record a kept message came from (`source.records`, with
    its content put back where `finish_records` took it out)."""
    source = message["metadata"]["source"]
    records = list(source["records"])
    cut = source.get("content_at")
    if cut is not None:
        index, at, *deeper = cut
        raw = records[index].encode()
        text = _encode(message["content"])
        if deeper and deeper[0] == 2:
            text = _nested(text)
        records[index] = (raw[:at] + text + raw[at:]).decode()
    return records


def text_of(blocks: object, kinds: tuple[str, ...] = ("text",)) -> str | None:
    """The text of a content value: a string as it is, or the `text` of the blocks of `kinds`
    joined by blank lines; None when there is none."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        return None
    parts = [
        block["text"]
        for block in blocks
        if isinstance(block, dict)
        and block.get("type") in kinds
        and isinstance(block.get("text"), str)
    ]
    return "\n\n".join(parts) if parts else None


def _items_left_raw(data: bytes) -> Any:
    """The document with its message arrays (`ITEM_ARRAYS`, or the whole when it is a list)
    left as the items' own bytes (`msgspec.Raw`), each decoded only when it is read (`items`):
    the items are never all objects at once, and each item's bytes are its kept record."""
    top = _document_decode(data)
    if isinstance(top, list):
        return top
    document: dict[str, Any] = {}
    for key, raw in top.items():
        value = None
        if key in ITEM_ARRAYS:
            try:
                value = _items_decode(raw)
            except ValueError:  # not an array: decoded as it is, below
                value = None
        document[key] = msgspec.json.decode(raw) if value is None else value
    return document


def item_value(value: Any) -> Any:
    """An item of a document's array, decoded (None if damaged: `items` reports it)."""
    try:
        return msgspec.json.decode(value) if isinstance(value, msgspec.Raw) else value
    except (ValueError, RecursionError):
        return None


def items(source: Source, values: list[Any]) -> Iterator[tuple[int, Any]]:
    """(1-based index, item) of a document's array, each decoded from its own bytes (its kept
    record) as it is handed out and its slot emptied: never every item's objects at once."""
    for index in range(len(values)):
        value, values[index] = values[index], None
        source.number = index + 1
        if isinstance(value, msgspec.Raw):
            source.line = bytes(value)
            try:
                value = msgspec.json.decode(source.line)
            except (ValueError, RecursionError):
                json_document_error(source)
        else:
            source.line = _encode(value)
        yield index + 1, value
    source.number = None


def json_document_error(source: Source) -> None:
    """Raise the error of an item found damaged late (bad UTF-8 in a string), at its line."""
    _decoded_whole(source)
    raise AgentLogError(source.path, None, "an item of the document cannot be decoded")


def text_or(value: object, default: str) -> str:
    """`value` if it is a non-empty str, else `default`."""
    return value if isinstance(value, str) and value else default


def token_counts(usage: Record, names: tuple[tuple[str, str], ...]) -> dict[str, int]:
    """A log's token counts under the transcript's usage names: for each `(key, name)` of
    `names`, the value at `key` when it is a count (an int, not negative); others are left out."""
    return {
        name: usage[key] for key, name in names if type(usage.get(key)) is int and usage[key] >= 0
    }


def function_call(call_id: str, name: str, arguments: object) -> dict[str, Any]:
    """A tool call in the engine's (OpenAI chat) shape; `arguments` kept as a JSON string."""
    if not isinstance(arguments, str):
        arguments = _encode(arguments).decode()
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class Built:
    """One session being read from a log: messages in order, with the records they came from.

    A message stays `held` (still a dict) until the next one starts, so a reader can merge
    streamed parts into it. Records that are not messages wait in `pending` and go into the
    next message's `metadata.source.attached` (after the last message: into its
    `attached_after`; in a session without messages: into the session's metadata as
    `attached_records`)."""

    def __init__(self, key: str, source: Source) -> None:
        self.key = key
        self.path = source.path
        self.text = source.record_text
        self.raw = source.record_bytes
        self.deep = False  # the held message came from a record nested deeply enough to check
        self.kept = Kept()
        self.held: Message | None = None
        self.pending: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self.roles: Counter[str] = Counter()
        self.open_calls: dict[str, int] = {}  # call id -> index of the message that made it
        self.info: dict[str, Any] = {}  # session metadata the reader found
        self.models: list[str] = []
        self.system_prompt: str | None = None
        self.title: str | None = None
        self.spawn_ref: dict[str, Any] | None = None
        self.first_prompt: str | None = None
        self.files_written: list[str] = []
        self.unknown_fields: list[str] = []
        self.fork_of: tuple[str, int] | None = None  # (session key, messages kept) of a branch
        self.fork_at_lines: dict[int, int] = {}  # line of an entry a branch leaves at -> length
        self.checkpoint_end = 0  # the index after the latest checkpoint pair (`_checkpoints`)

    def check_fields(self, record: Record, known: frozenset[str]) -> None:
        """Count the fields of `record` its format does not define (they stay in the record)."""
        if record.keys() <= known:  # the usual case, in one set comparison
            return
        for key in record:
            if key not in known:
                self.counts["unknown_fields"] += 1
                names = self.unknown_fields
                if key not in names and len(names) < _UNKNOWN_FIELD_NAMES_MAX:
                    names.append(key)

    def wrote(self, path: object) -> None:
        """Note a file a tool call wrote (created, edited, patched)."""
        if isinstance(path, str) and path and path not in self.files_written:
            self.files_written.append(path)

    def note_model(self, model: str) -> None:
        if model and model not in self.models:
            self.models.append(model)

    @property
    def length(self) -> int:
        return len(self.kept) + (self.held is not None)

    def held_bytes(self) -> int:
        return len(self.kept.buffer)

    def add(self, message: Message, line: int, record: Record | None) -> Message:
        """Start a new message (finishing the held one); returns it, held, for merging. A
        message made from a record another message already carries passes None."""
        self.flush()
        role = message["role"]
        if type(role) is not str or not role or role.isspace():
            raise AgentLogError(self.path, line, f"expected a non-empty role, got {role!r}")
        texts = [] if record is None else [self.raw(record)]  # text once the message is done
        self.deep = bool(texts) and _nested_deeply(texts[0])
        source: dict[str, Any] = {"lines": [line], "records": texts}
        if self.pending:
            source["attached"], self.pending = self.pending, []
        message.setdefault("metadata", {})["source"] = source
        self.held = message
        if not message.get("summary"):
            self.roles[role] += 1
        if role == "user" and self.first_prompt is None and not message.get("synthetic"):
            self.first_prompt = text_of(message.get("content"))
        model = message.get("model")
        if isinstance(model, str) and model and model not in self.models:
            self.models.append(model)
        return message

    def cut_from_held(self, text: object) -> int | None:
        """Take `text`, which a message made from the held message's record will keep, out of
        that record where it stands as one JSON string (a Gemini CLI tool result inside its
        call): the byte offset it goes back at (`source.content_in` of the message that keeps
        it; `insert_kept_texts` puts it back), or None when it stays."""
        held = self.held
        if held is None or type(text) is not str or len(text) < _CUT_CHARS_MIN:
            return None
        records: list[bytes] = held["metadata"]["source"]["records"]
        if not records:
            return None
        needle = _encode(text)
        at = records[-1].find(needle)
        if at < 0:
            return None
        records[-1] = records[-1][:at] + records[-1][at + len(needle) :]
        return at

    def merge(self, line: int, record: Record) -> Message:
        """The held message, with `record` noted as one more of its sources."""
        assert self.held is not None, "merge() without a held message"
        source = self.held["metadata"]["source"]
        source["lines"].append(line)
        text = self.raw(record)
        source["records"].append(text)
        self.deep = self.deep or _nested_deeply(text)
        if self.pending:
            source.setdefault("attached", []).extend(self.pending)
            self.pending = []
        return self.held

    def attach(self, line: int, record: Record, *, known: bool = True) -> None:
        self.pending.append({"line": line, "record": self.text(record)})
        if not known:
            self.counts["unknown_records"] += 1

    def call(self, call: dict[str, Any]) -> None:
        """Note a tool call of the held message (already in its `tool_calls`)."""
        self.counts["tool_calls"] += 1
        call_id = call.get("id")
        if isinstance(call_id, str):
            self.open_calls[call_id] = self.length - 1

    def result(self, call_id: object) -> bool:
        """Note a tool result; whether it answers a call still open in this session."""
        self.counts["tool_results"] += 1
        if isinstance(call_id, str) and self.open_calls.pop(call_id, None) is not None:
            return True
        self.counts["orphan_results"] += 1
        return False

    def flush(self) -> None:
        """Finish the held message: packed into `kept`, no longer open to merging."""
        held = self.held
        if held is None:
            return
        line = held["metadata"]["source"]["lines"][0]
        finish_records(held)
        try:
            if self.deep:  # values taken from such a record may pass the engine's depth bound
                check_plain(held, what="the message")
            self.kept.append(held)
        except (InvalidArgumentError, OverflowError, TypeError) as exc:
            raise AgentLogError(self.path, line, f"cannot be stored: {exc}") from exc
        self.held = None

    def finish(self) -> None:
        """Close the session: trailing records attached, unanswered calls flagged."""
        if self.pending and self.held is not None:
            self.held["metadata"]["source"]["attached_after"] = self.pending
            self.pending = []
        elif self.pending:
            self.info["attached_records"] = self.pending
            self.pending = []
        dangling: dict[int, list[str]] = {}
        for call_id, index in self.open_calls.items():
            if index >= 0:  # not a call made before a fork's own messages
                dangling.setdefault(index, []).append(call_id)
        self.counts["dangling_calls"] = sum(map(len, dangling.values()))
        for index, ids in dangling.items():
            if index == len(self.kept) and self.held is not None:
                self.held["metadata"]["dangling_tool_calls"] = ids
            else:
                self.kept.patches[index] = {"dangling_tool_calls": ids}
        self.flush()


@dataclass
class Parsed:
    """What a reader made of one file: its sessions (the first is the main one) and what the
    file says about itself."""

    sessions: list[Built]
    tool_version: str | None = None
    source_session_id: str | None = None
    records: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # other files read into these sessions
    spawns: list[Spawn] = field(default_factory=list)
