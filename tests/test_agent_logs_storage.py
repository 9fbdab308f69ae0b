"""How an imported agent log is stored: messages reach the engine as typed structs, so what the
engine would refuse in a dict (an integer past 64 bits, nesting past `value_depth_max`, a role
that is not text) is refused at the file's line, with nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replay
from eventlog import limits
from replay.agentlogs import AgentLogError
from sessions import SessionStore
from tests._agent_log_counts import FIXTURES

PI = FIXTURES / "pi" / "large-session.jsonl"


def pi_with(tmp_path: Path, change: dict[str, object]) -> tuple[Path, int]:
    """The pi sample's first 40 lines with `change` merged into the first assistant message's
    first content block; the path and the changed line."""
    lines = PI.read_text().splitlines()[:40]
    for number, line in enumerate(lines, start=1):
        record = json.loads(line)
        message = record.get("message") or {}
        if message.get("role") == "assistant" and message.get("content"):
            message["content"][0].update(change)
            lines[number - 1] = json.dumps(record)
            break
    path = tmp_path / "changed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, number


def nested(depth: int) -> object:
    value: object = "deep"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"type": "thinking", "count": 2**70}, "ints"),
        ({"type": "mystery", "value": nested(limits.value_depth_max)}, "depth"),
    ],
    ids=["integer-past-64-bits", "nested-past-the-depth-bound"],
)
def test_a_value_the_engine_cannot_store_is_refused_at_its_line(
    store: SessionStore, tmp_path: Path, change: dict[str, object], problem: str
) -> None:
    path, number = pi_with(tmp_path, change)
    with pytest.raises(AgentLogError, match=problem) as caught:
        replay.import_agent_log(store, path)
    assert caught.value.line == number
    assert str(caught.value).startswith(f"{path}:{number}: ")
    assert store.log.head == 0


def test_nesting_within_the_bound_is_kept_exactly(store: SessionStore, tmp_path: Path) -> None:
    deep = nested(limits.value_depth_max - 8)
    path, _ = pi_with(tmp_path, {"type": "mystery", "value": deep})
    (sid,) = replay.import_agent_log(store, path).session_ids
    snapshot = store.snapshot(sid)
    assert snapshot is not None
    others = [m["metadata"].get("other_blocks") for m in snapshot["transcript"]]
    assert [blocks[0]["value"] for blocks in others if blocks] == [deep]


@pytest.mark.parametrize("role", ["   ", "\t\n"])
def test_a_message_without_a_textual_role_is_refused_at_its_item(
    store: SessionStore, tmp_path: Path, role: object
) -> None:
    path = tmp_path / "roles.json"
    messages = [{"role": "user", "content": "hi"}, {"role": role, "content": "there"}]
    path.write_text(json.dumps({"messages": messages}))
    with pytest.raises(AgentLogError) as caught:
        replay.import_agent_log(store, path, format="openai-chat")
    assert caught.value.line == 2
    assert store.log.head == 0


def test_a_content_of_a_type_the_engine_does_not_store_is_refused(
    store: SessionStore, tmp_path: Path
) -> None:
    path = tmp_path / "content.json"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": {"a": 1}}]
    path.write_text(json.dumps({"messages": messages}))
    with pytest.raises(AgentLogError, match="content") as caught:
        replay.import_agent_log(store, path, format="openai-chat")
    assert caught.value.line == 2
    assert store.log.head == 0


def imported_exactly(folder: Path, lines: list[str]) -> list[dict[str, Any]]:
    """Import `lines` as a log into a new store in `folder`; check that the records read back
    are the lines, and return the transcript."""
    path = folder / "log.jsonl"
    path.write_bytes("".join(line + "\n" for line in lines).encode())
    with SessionStore.open(folder / "store") as store:
        (sid,) = replay.import_agent_log(store, path).session_ids
        assert replay.agent_log_records(store, sid) == dict(enumerate(lines, start=1))
        snapshot = store.snapshot(sid)
        assert snapshot is not None
        return list(snapshot["transcript"])


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(st.text(min_size=0, max_size=300), min_size=1, max_size=4),
    ascii_only=st.booleans(),
    spaced=st.booleans(),
)
def test_records_come_back_byte_for_byte_however_the_text_was_written(
    tmp_path_factory: pytest.TempPathFactory, texts: list[str], ascii_only: bool, spaced: bool
) -> None:
    """A message's text is kept once: taken out of its record where the record holds it as the
    encoder would write it, left in where it is written otherwise (escaped non-ASCII, say); the
    records read back are the file's lines either way."""
    folder = tmp_path_factory.mktemp("texts")
    separators = (", ", ": ") if spaced else (",", ":")
    header = {"type": "session", "id": "s", "cwd": "/w", "timestamp": "2025-01-01T00:00:00Z"}
    records = [header] + [
        {"type": "message", "message": {"role": "user", "content": [{"type": "text", "text": t}]}}
        for t in texts
    ]
    lines = [json.dumps(r, ensure_ascii=ascii_only, separators=separators) for r in records]
    transcript = imported_exactly(folder, lines)
    assert [m["content"] for m in transcript] == texts


def test_a_text_is_stored_once(store: SessionStore) -> None:
    (sid,) = replay.import_agent_log(store, PI).session_ids
    snapshot = store.snapshot(sid)
    assert snapshot is not None
    cut = [m for m in snapshot["transcript"] if "content_at" in m["metadata"]["source"]]
    assert len(cut) > len(snapshot["transcript"]) // 2
    original = replay.agent_log_records(store, sid)
    for message in cut:
        source = message["metadata"]["source"]
        index, _ = source["content_at"]
        kept, line = source["records"][index], original[source["lines"][index]]
        written = json.dumps(message["content"], ensure_ascii=False)  # as pi writes it
        assert written in line and written not in kept
        assert len(line.encode()) - len(kept.encode()) == len(written.encode())


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=0, max_size=300), ascii_only=st.booleans())
def test_a_tool_output_inside_a_json_string_comes_back_byte_for_byte(
    tmp_path_factory: pytest.TempPathFactory, text: str, ascii_only: bool
) -> None:
    """Codex keeps a shell's output as JSON inside a string: the output text is cut out of that
    nested string and put back exactly."""
    folder = tmp_path_factory.mktemp("codex")
    inner = json.dumps({"output": text, "metadata": {"exit_code": 0}}, ensure_ascii=ascii_only)
    records = [
        {"type": "session_meta", "payload": {"id": "c", "cli_version": "0.47.0", "cwd": "/w"}},
        {
            "type": "response_item",
            "payload": {
                "type": "function_call",
                "name": "shell",
                "arguments": "{}",
                "call_id": "k",
            },
        },
        {
            "type": "response_item",
            "payload": {"type": "function_call_output", "call_id": "k", "output": inner},
        },
    ]
    lines = [json.dumps(r, ensure_ascii=ascii_only) for r in records]
    (output,) = [m for m in imported_exactly(folder, lines) if m["role"] == "tool"]
    assert output["content"] == text
    if not ascii_only and len(text) >= 64:
        assert output["metadata"]["source"]["content_at"][2:] == [2]


def test_bad_utf8_inside_a_document_item_is_reported_at_its_line(
    store: SessionStore, tmp_path: Path
) -> None:
    """A document's items are decoded one at a time; damage found only then (bad UTF-8 in a
    string) is still reported at the line holding it, with nothing written."""
    data = (FIXTURES / "gemini-cli" / "gemini-cli-pomodoro-timer.json").read_bytes()
    lines = data.split(b"\n")
    number = next(n for n, line in enumerate(lines) if b'"content": "' in line and n > 40)
    lines[number] = lines[number].replace(b'"content": "', b'"content": "\xff', 1)
    path = tmp_path / "session.json"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(AgentLogError, match="UTF-8") as caught:
        replay.import_agent_log(store, path, format="gemini-cli")
    assert caught.value.line == number + 1
    assert store.log.head == 0


def test_a_gemini_tool_result_is_stored_once_and_its_record_still_reads_back(
    tmp_path: Path,
) -> None:
    """A Gemini CLI call's result is kept by its tool message, taken out of the `gemini` record
    that holds it inline (two calls of one record, one the same text as the message itself, one
    too short to cut, one never answered); each record still reads back as the file has it."""
    long, same = "result " * 40, "the same words " * 10

    def call(call_id: str, output: str | None) -> dict[str, Any]:
        made: dict[str, Any] = {"id": call_id, "name": "run", "args": {"cmd": call_id}}
        if output is not None:
            response = {"output": output}
            made.update(result=[{"functionResponse": {"response": response}}], status="success")
        return made

    calls = [call("c1", long), call("c2", same), call("c3", "short"), call("c4", None)]
    messages = [
        {"id": "u", "type": "user", "content": "go " * 30},
        {"id": "g", "type": "gemini", "content": same, "toolCalls": calls},
    ]
    document = {"sessionId": "s", "messages": messages}
    path = tmp_path / "session.json"
    path.write_text(json.dumps(document, indent=2))
    with SessionStore.open(tmp_path / "store") as store:
        (sid,) = replay.import_agent_log(store, path).session_ids
        snapshot = store.snapshot(sid)
        assert snapshot is not None
        records = replay.agent_log_records(store, sid)
    assert {n: json.loads(text) for n, text in records.items()} == {1: messages[0], 2: messages[1]}
    assert records[2] in path.read_text()  # the very text of the item in the file
    tools = [m for m in snapshot["transcript"] if m["role"] == "tool"]
    assert [m["content"] for m in tools] == [long, same, "short"]
    assert ["content_in" in m["metadata"]["source"] for m in tools] == [True, True, False]
    (assistant,) = [m for m in snapshot["transcript"] if m["role"] == "assistant"]
    (kept,) = assistant["metadata"]["source"]["records"]
    assert json.dumps(long) not in kept and json.dumps(same) not in kept
    assert '"short"' in kept


def test_a_lone_surrogate_escape_reads_as_a_replacement_and_its_record_stays_exact(
    tmp_path: Path,
) -> None:
    """JavaScript's `JSON.stringify` writes half of a surrogate pair as an escape (`\\ud83d`)
    when a text is cut inside an emoji: valid JSON, which msgspec refuses. The message holds
    U+FFFD in its place; the record reads back as the file's line, escape and all."""
    header = {"type": "session", "id": "s", "cwd": "/w", "timestamp": "2025-01-01T00:00:00Z"}
    texts = [
        "build output cut at 30000 chars: done \ud83d",
        "\ude00 cut before",
        "whole \U0001f600",
    ]
    records = [header] + [
        {"type": "message", "message": {"role": "user", "content": [{"type": "text", "text": t}]}}
        for t in texts
    ]
    lines = [json.dumps(r) for r in records]  # as JSON.stringify: lone halves as escapes
    assert "\\ud83d" in lines[1] and "\\ude00" in lines[2]
    transcript = imported_exactly(tmp_path, lines)
    assert [m["content"] for m in transcript] == [
        "build output cut at 30000 chars: done \ufffd",
        "\ufffd cut before",
        "whole \U0001f600",
    ]


def test_a_lone_surrogate_escape_does_not_excuse_damage(
    store: SessionStore, tmp_path: Path
) -> None:
    path, line = pi_with(tmp_path, {"text": "done \ud83d"})
    lines = path.read_text().splitlines()
    lines[line - 1] = lines[line - 1][:-3]  # cut: still damaged, whatever the escape
    path.write_text("\n".join(lines) + "\n")
    head = store.log.head
    with pytest.raises(AgentLogError, match="truncated JSON") as caught:
        replay.import_agent_log(store, path)
    assert caught.value.line == line and store.log.head == head
