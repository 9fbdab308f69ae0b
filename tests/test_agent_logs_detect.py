"""Telling a log's format from its content: a first line of any length is read whole (up to
`agent_log_line_bytes_max`), so a log whose first record is long (a Codex `session_meta` with
long instructions, a first prompt with a pasted file) imports under `auto` exactly as under its
named format; a line past the bound is refused at its line either way. Under a named format, a
first line that is not JSON is damage at its line, and a file of another kind is not a log of
that format. `detect_format` answers as the import's own detection does.

The long lines are the samples' own first records, their longest text (not an id) repeated."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import replay
from replay import _limits
from replay.agentlogs import AgentLogError, NotAnAgentLogError
from replay.agentlogs._decode import decode_line, outline
from sessions import SessionStore
from tests._agent_log_counts import FIXTURES, SAMPLES
from tests.test_agent_logs_growth import CODEX, IDS, LINE_SAMPLES, lines_of, one, state
from tests.test_agent_logs_subagents import SESSION, split_session

WINDOW = 256 * 1024  # the bytes detection once read of a file, whatever its first line
SIZES = {"under": WINDOW - 1, "at": WINDOW, "over": WINDOW + 1, "four times": 4 * WINDOW}
TRAJECTORY = FIXTURES / "openai-chat" / "pydicom__pydicom-1458.traj"
GEMINI = FIXTURES / "gemini-cli" / "gemini-cli-pomodoro-timer.json"
EVENTS = Path(__file__).parent / "fixtures" / "log-format-v1.jsonl"  # JSON lines, no agent log


def _texts(value: Any) -> list[tuple[int, Any, Any]]:
    """(length, container, key) of every string in `value` whose key does not name an id."""
    found = []
    items = (
        value.items() if type(value) is dict else enumerate(value) if type(value) is list else ()
    )
    for key, item in items:
        if type(item) is str and not str(key).lower().endswith(("id", "uuid")):
            found.append((len(item.encode()), value, key))
        found.extend(_texts(item))
    return found


def _encoded(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def grown(line: bytes, size: int) -> bytes:
    """The record of `line` re-encoded (compact, UTF-8) as exactly `size` bytes, its line break
    not counted: its longest text is repeated, then padded to the byte."""
    record = json.loads(line)
    _, holder, key = max(_texts(record), key=lambda found: found[0])
    text = holder[key] or "x"
    holder[key] = ""
    wanted = size - len(_encoded(record))  # the text's bytes between its quotes
    holder[key] = text * (wanted // (len(_encoded(text)) - 2))
    holder[key] += "x" * (wanted - len(_encoded(holder[key])) + 2)
    made = _encoded(record)
    assert len(made) == size and json.loads(made) == record
    return made


def long_first_line(path: Path, size: int, folder: Path) -> Path:
    lines = lines_of(path)
    log = folder / path.name
    log.write_bytes(grown(lines[0], size) + b"\n" + b"".join(lines[1:]))
    return log


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize(("fmt", "path"), LINE_SAMPLES, ids=IDS)
def test_a_long_first_line_imports_under_auto_as_under_its_format(
    store: SessionStore, tmp_path: Path, fmt: str, path: Path, size: str
) -> None:
    """A first record just under, at and over the 256 KiB detection once read, or four times
    that: `auto` (and `detect_format`) tells the format, and the import equals the one under
    the named format, message for message, the long line kept as the file has it."""
    log = long_first_line(path, SIZES[size], tmp_path)
    assert replay.detect_format(log) == fmt
    found = one(store, log)
    assert (found.format, found.detected) == (fmt, True)
    with SessionStore.open(tmp_path / "named") as named:
        assert one(named, log, format=fmt).format == fmt
        assert state(named) == state(store)  # every message, its metadata, the records kept
    kept = replay.agent_log_records(store, found.sessions[0].session_id)
    assert kept[1].encode() == lines_of(log)[0].rstrip(b"\n")


@pytest.mark.parametrize("named", [False, True], ids=["auto", "named"])
@pytest.mark.parametrize(("fmt", "path"), LINE_SAMPLES, ids=IDS)
def test_a_first_line_past_the_line_bound_is_refused_at_its_line(
    store: SessionStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fmt: str,
    path: Path,
    named: bool,
) -> None:
    """At `agent_log_line_bytes_max` (its line break not counted) the line is read; one byte
    more and the log is refused at file:1 as past that bound, under `auto` too (not taken for
    a damaged JSON document), with nothing written."""
    bound = 2 * WINDOW  # stands in for the 64 MiB of the real bound
    monkeypatch.setattr(_limits, "agent_log_line_bytes_max", bound)
    options = {"format": fmt} if named else {}
    at = long_first_line(path, bound, tmp_path)
    assert one(store, at, **options).format == fmt
    (tmp_path / "past").mkdir()
    past = long_first_line(path, bound + 1, tmp_path / "past")
    head = store.log.head
    for attempt in (lambda: one(store, past, **options), lambda: replay.detect_format(past)):
        with pytest.raises(AgentLogError, match="agent_log_line_bytes_max") as caught:
            attempt()
        assert (caught.value.path, caught.value.line) == (str(past), 1)
        assert str(caught.value).startswith(f"{past}:1: line longer than")
        assert not isinstance(caught.value, NotAnAgentLogError)
    assert store.log.head == head


@pytest.mark.parametrize("blank_after", [b"", b"\n", b"\n \n"])
def test_a_one_line_document_longer_than_a_line_may_be_is_read_as_a_document(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blank_after: bytes
) -> None:
    """A JSON document written on one line is no line log: a line bound does not apply to it
    (its bound is `agent_log_document_bytes_max`), and `auto` still reads it whole."""
    data = json.dumps(json.loads(TRAJECTORY.read_bytes()), separators=(",", ":")).encode()
    monkeypatch.setattr(_limits, "agent_log_line_bytes_max", len(data) // 4)
    log = tmp_path / TRAJECTORY.name
    log.write_bytes(data + blank_after)
    assert replay.detect_format(log) == "openai-chat"
    found = one(store, log)
    assert (found.format, found.detected) == ("openai-chat", True) and found.written
    with SessionStore.open(tmp_path / "named") as named:
        one(named, log, format="openai-chat")
        assert state(named) == state(store)


@pytest.mark.parametrize(("fmt", "path"), LINE_SAMPLES, ids=IDS)
def test_a_first_line_dense_in_objects_is_refused_at_its_line_not_taken_for_a_document(
    store: SessionStore, tmp_path: Path, fmt: str, path: Path
) -> None:
    """Telling the format decodes only a record's outline, so a long first line dense in objects
    costs no more than its bytes to look at; the import then refuses it, at file:1, for the
    objects it would decode into."""
    lines = lines_of(path)
    record = json.loads(lines[0])
    record["dense"] = [{}] * 120_000
    log = tmp_path / path.name
    log.write_bytes(json.dumps(record, separators=(",", ":")).encode() + b"\n" + lines[-1])
    assert len(lines_of(log)[0]) > WINDOW
    for options in ({}, {"format": fmt}):
        with pytest.raises(AgentLogError, match="agent_log_memory_file_ratio") as caught:
            one(store, log, **options)
        assert caught.value.line == 1
    assert replay.detect_format(log) == fmt
    assert store.log.head == 0


OTHER_KINDS = {
    "another format's log": lambda fmt: next(p for f, p in LINE_SAMPLES if f != fmt).read_bytes(),
    "JSON lines of no agent": lambda fmt: EVENTS.read_bytes(),
    "a JSON document": lambda fmt: json.dumps(json.loads(GEMINI.read_bytes()), indent=2).encode(),
    "a one-line document": lambda fmt: TRAJECTORY.read_bytes().replace(b"\n", b" ") + b"\n",
    "text": lambda fmt: b"# Notes\n\n{not JSON} at all\n",
}


@pytest.mark.parametrize("kind", list(OTHER_KINDS))
@pytest.mark.parametrize("fmt", ["claude-code", "codex", "pi"])
def test_a_file_of_another_kind_is_not_a_log_of_the_format_named(
    store: SessionStore, tmp_path: Path, fmt: str, kind: str
) -> None:
    log = tmp_path / "other.jsonl"
    log.write_bytes(OTHER_KINDS[kind](fmt))
    with pytest.raises(NotAnAgentLogError, match=f"not a log of format {fmt}$"):
        one(store, log, format=fmt)
    with pytest.raises(NotAnAgentLogError):
        one(store, log, format=fmt, skip_bad_lines=True)
    assert store.log.head == 0


def test_json_lines_of_another_kind_are_left_alone_in_a_folder(
    store: SessionStore, tmp_path: Path
) -> None:
    """Under `auto`, valid JSON lines that are no agent log are not an agent log (they were
    taken for a damaged JSON document, and stopped the folder's import)."""
    folder = tmp_path / "logs"
    folder.mkdir()
    shutil.copy(EVENTS, folder / "events.jsonl")
    shutil.copy(CODEX, folder / "session.jsonl")
    with pytest.raises(NotAnAgentLogError, match="not an agent log"):
        replay.detect_format(folder / "events.jsonl")
    result = replay.import_agent_log(store, folder)
    assert [f.path for f in result.files] == [str(folder / "session.jsonl")]
    assert result.not_agent_logs == (str(folder / "events.jsonl"),)


def _cases(folder: Path) -> dict[str, Path]:
    """Files of every kind detection meets, each in a folder of its own."""
    made: dict[str, bytes] = {p.name: p.read_bytes() for _, p in SAMPLES}
    for fmt, path in LINE_SAMPLES:
        made[f"{fmt} long first line {path.name}"] = long_first_line(path, WINDOW + 1, folder)
    codex = lines_of(CODEX)
    made["damaged first line"] = codex[0][:40] + b"\n" + b"".join(codex[1:4])
    made["only a damaged first line"] = codex[0][:40] + b"\n"
    made["first line being written"] = codex[0][:40]
    made["empty"] = b""
    made["JSON lines of no agent"] = EVENTS.read_bytes()
    made["JSON document of no agent"] = b'{\n "notes": [\n  1\n ]\n}\n'
    made["damaged JSON document"] = json.dumps(json.loads(GEMINI.read_bytes()), indent=1)[
        :3000
    ].encode()
    made["text"] = b"hello\n"
    paths = {}
    for number, (name, data) in enumerate(sorted(made.items())):
        paths[name] = folder / str(number) / "log.jsonl"
        paths[name].parent.mkdir()
        paths[name].write_bytes(data if isinstance(data, bytes) else data.read_bytes())
    return paths


def test_detect_format_answers_as_the_import_detects(tmp_path: Path) -> None:
    """The format `detect_format` gives, or its error, is the import's under `auto` (which
    skips damaged lines here, so that what it reports is its detection, not the damage
    reading finds later); a file with no complete line has no format yet for either."""

    def by_import(path: Path) -> object:
        with SessionStore.open(path.parent / "store") as store:
            try:
                found = one(store, path, skip_bad_lines=True)
            except AgentLogError as exc:
                return type(exc).__name__, str(exc)
        return found.format if found.detected else "nothing yet"

    def by_detect(path: Path) -> object:
        try:
            return replay.detect_format(path)
        except AgentLogError as exc:
            if type(exc) is AgentLogError and exc.problem.startswith("no complete line yet"):
                return "nothing yet"
            return type(exc).__name__, str(exc)

    answers = {name: (by_detect(path), by_import(path)) for name, path in _cases(tmp_path).items()}
    assert {name: got for name, (got, _) in answers.items()} == {
        name: want for name, (_, want) in answers.items()
    }
    assert answers["empty"][0] == answers["first line being written"][0] == "nothing yet"
    assert answers["JSON lines of no agent"][0][0] == "NotAnAgentLogError"
    assert answers["damaged JSON document"][0][0] == "AgentLogError"
    assert answers["damaged first line"][0] == "codex"


def test_a_subagent_file_with_a_long_first_line_is_found_with_its_session(
    store: SessionStore, tmp_path: Path
) -> None:
    """A subagent's file is told by its first record (a sidechain naming the session), which
    is its prompt and may be long: it is read whole, and the file imported as a child."""
    files = split_session(tmp_path, nested=True, name_agents=True)
    for file in files.values():
        lines = lines_of(file)
        file.write_bytes(grown(lines[0], WINDOW + 1) + b"\n" + b"".join(lines[1:]))
    (found,) = replay.import_agent_log(store, tmp_path / f"{SESSION}.jsonl").files
    assert set(found.subagent_files) == {str(file) for file in files.values()}
    assert len(found.sessions) == 3


def _shallow(value: Any) -> Any:
    if type(value) is dict:
        return {
            key: type(item)() if type(item) in (dict, list) else item for key, item in value.items()
        }
    return [] if type(value) is list else value


def test_an_outline_is_the_record_without_what_its_fields_hold() -> None:
    """Each line of every sample, and lines of each kind of value, outlined: its fields as
    decoded, any object or array among them empty; not JSON, an error as decoding gives."""
    lines = [line for _, path in LINE_SAMPLES for line in lines_of(path)]
    lines += [b'"text"\n', b"5", b"null", b"[1, {}]", b'{"a": {"b": 1}, "c": [2], "d": "\\u00e9"}']
    lines.append(b'{"type": "session", "cwd": "/a \\ud83d b", "x": ["\\ud83d"]}')  # lone surrogates
    for line in lines:
        assert outline(line) == _shallow(decode_line(line)), line[:80]
    for bad in (b'{"a": 1', b'{"a": }', b"{'a': 1}", b'{"a": "\xff"}', b"[" * 5000 + b"]" * 5000):
        with pytest.raises((ValueError, RecursionError)):
            decode_line(bad)
        with pytest.raises((ValueError, RecursionError)):
            outline(bad)
