"""Damaged and shuffled agent logs: every import either matches an independent count of what the
damaged file still holds, keeping every record, or raises `AgentLogError` with nothing written.
Never another exception.

The damage: the file cut at any byte, bits flipped anywhere, lines dropped, lines swapped. Each
format's samples are cut to a few dozen lines first, to keep an example fast.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import replay
from replay.agentlogs import AgentLogError
from sessions import SessionStore
from tests._agent_log_counts import COUNTERS, FIXTURES

LINES_MAX = 60
SAMPLES = {
    "claude-code": FIXTURES
    / "claude-code/sample-project/5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl",
    "codex": FIXTURES / "codex/codex-pomodor-timer.jsonl",
    "pi": FIXTURES / "pi/large-session.jsonl",
    "gemini-cli": FIXTURES / "gemini-cli/gemini-cli-pomodoro-timer.json",
    "openai-chat": FIXTURES / "openai-chat/marshmallow-code__marshmallow-1867.traj",
}


def sample_bytes(fmt: str) -> bytes:
    """The sample, short: its first lines (a JSONL log), or its first messages (a document)."""
    path = SAMPLES[fmt]
    if path.suffix == ".jsonl":
        return b"\n".join(path.read_bytes().split(b"\n")[:LINES_MAX]) + b"\n"
    document = json.loads(path.read_bytes())
    key = "messages" if "messages" in document else "history"
    document[key] = document[key][:12]
    document.pop("trajectory", None)
    return json.dumps(document, indent=1).encode()


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    for _ in range(draw(st.integers(1, 3))):
        lines = data.split(b"\n")
        kind = draw(st.sampled_from(["cut", "flip", "drop", "swap"]))
        event(kind)
        if kind == "cut":
            data = data[: draw(st.integers(0, len(data)))]
        elif kind == "flip":
            at = draw(st.integers(0, len(data) - 1)) if data else 0
            if data:
                bit = 1 << draw(st.integers(0, 7))
                data = data[:at] + bytes([data[at] ^ bit]) + data[at + 1 :]
        elif kind == "drop" and len(lines) > 1:
            del lines[draw(st.integers(0, len(lines) - 1))]
            data = b"\n".join(lines)
        elif kind == "swap" and len(lines) > 1:
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
    return data


def independent(fmt: str, path: Path) -> dict[str, Any] | None:
    """The independent count, or None when the damage left records the counter does not read
    (a key renamed by a flipped bit): then only what holds for any import is checked."""
    try:
        return COUNTERS[fmt](path)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
        event(f"uncountable: {type(exc).__name__}")
        return None


def check_import(store: SessionStore, fmt: str, path: Path, result: replay.AgentLogImport) -> None:
    (found,) = result.files
    snapshots = [store.snapshot(s.session_id) for s in found.sessions]
    messages = [m for s in snapshots if s is not None for m in s["transcript"]]
    covered = {
        line
        for m in messages
        for line in (
            *m["metadata"]["source"]["lines"],
            *(a["line"] for a in m["metadata"]["source"].get("attached", [])),
            *(a["line"] for a in m["metadata"]["source"].get("attached_after", [])),
        )
    }
    for snapshot in snapshots:
        assert snapshot is not None
        held = snapshot["metadata"]["agent_log"].get("attached_records", [])
        covered.update(item["line"] for item in held)
    if path.suffix == ".jsonl":
        data = path.read_bytes()  # a last line without its line break is left for next time
        assert found.pending_tail_bytes == len(data) - data.rfind(b"\n") - 1
        complete = path.with_name(f"complete-{path.name}")
        complete.write_bytes(data[: len(data) - found.pending_tail_bytes])
        path = complete  # what was read, for the independent count too
        lines = complete.read_bytes().split(b"\n")
        skipped = {line for line, _ in found.skipped_lines}
        assert not covered & skipped
        assert covered | skipped == {n for n, line in enumerate(lines, 1) if line.strip()}
    if found.skipped_lines or not found.sessions:
        return  # what a skipped line held is not in the session, so the counts differ
    if found.sessions[0].counts.get("branches"):
        event("branched")  # swapped lines whose parent links form a tree: forks repeat prefixes
        return
    assert sum(s.counts.get("tool_results", 0) for s in found.sessions) == sum(
        m["role"] == "tool" for m in messages
    )
    expected = independent(fmt, path)
    if expected is None:
        return
    roles = Counter(m["role"] for m in messages if not m.get("summary"))
    assert dict(roles) == expected["roles"]
    assert sum(len(m.get("tool_calls") or []) for m in messages) == expected["tool_calls"]
    assert sum(m["role"] == "tool" for m in messages) == expected["tool_results"]
    # A file left with sidechain records only (its main ones dropped, or the first of them the
    # last line, not complete) is a subagent's own file: its sessions are the sidechains.
    own_file = any("subagent_of" in s["metadata"]["agent_log"] for s in snapshots if s)
    assert len(found.sessions) - (not own_file) == expected["sidechains"]


def skip_damage(store: SessionStore, fmt: str, path: Path) -> None:
    """Past damaged lines: either a typed error still (a bound, no line left to recognise) or
    an import keeping every line but the skipped ones."""
    head = store.log.head
    try:
        kept = replay.import_agent_log(store, path, format=fmt, skip_bad_lines=True)
    except AgentLogError:
        event("typed error when skipping")
        assert store.log.head == head
        return
    event("imported past damaged lines")
    check_import(store, fmt, path, kept)


@pytest.mark.parametrize("fmt", sorted(SAMPLES))
def test_damage_gives_a_matching_import_or_a_typed_error(tmp_path: Path, fmt: str) -> None:
    original = sample_bytes(fmt)
    examples = itertools.count()

    @settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(data=damaged(original))
    def run(data: bytes) -> None:
        # A store of its own for each example: each is another file, and one file rewritten
        # under its name is refused by a store that imported it (test_agent_logs_growth).
        with SessionStore.open(tmp_path / f"store-{next(examples)}") as store:
            path = tmp_path / f"log{SAMPLES[fmt].suffix}"
            path.write_bytes(data)
            head = store.log.head
            try:
                result = replay.import_agent_log(store, path, format=fmt)
            except AgentLogError as exc:
                event("typed error")
                assert store.log.head == head
                assert str(exc).startswith(str(path))
                if path.suffix == ".jsonl":
                    skip_damage(store, fmt, path)
                return
            event("imported")
            check_import(store, fmt, path, result)

    run()


def test_a_message_the_engine_refuses_is_reported_at_its_record(tmp_path: Path) -> None:
    """A record whose message holds a field of a type the engine does not store (content that is
    a number) is reported at that record, and nothing is written."""
    path = tmp_path / "chat.json"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 5}]
    path.write_text(json.dumps({"messages": messages}))
    with SessionStore.open(tmp_path / "store") as store:
        head = store.log.head
        with pytest.raises(AgentLogError, match="cannot be stored") as caught:
            replay.import_agent_log(store, path)
        assert caught.value.line == 2
        assert "content" in caught.value.problem
        assert store.log.head == head


def _first_result(records: list[Any]) -> int:
    """The index of the first Claude Code record holding a tool result."""
    return next(
        i
        for i, r in enumerate(records)
        if r.get("type") == "user"
        and isinstance(r["message"].get("content"), list)
        and any(b.get("type") == "tool_result" for b in r["message"]["content"])
    )


def _claude_result_id_a_list(records: list[Any]) -> int:
    at = _first_result(records)
    block = next(b for b in records[at]["message"]["content"] if b["type"] == "tool_result")
    block["tool_use_id"] = [block["tool_use_id"]]
    return at


def _set(index: int, *keys: str, value: object) -> Any:
    """A change setting `value` at `keys` in the record at `index`; it returns that index."""

    def change(records: list[Any]) -> int:
        target = records[index]
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
        return index

    return change


def _pi_ids_not_strings(records: list[Any]) -> int:
    records[5]["id"], records[6]["parentId"] = ["a"], {"id": "a"}
    return 6


def _gemini_no_function_response(messages: list[Any]) -> int:
    messages[1]["toolCalls"][0]["result"] = [{"functionResponse": None}]
    return 1


SHAPE_SAMPLES = {
    **SAMPLES,
    "claude-code": FIXTURES
    / "claude-code/sample-project/1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl",
}
WRONG_SHAPES = {
    # A record of a list type is an unknown record, kept; a result naming its call by a list
    # answers no call (which stays dangling).
    "claude type": ("claude-code", _set(3, "type", value=["user"]), {"unknown_records": 1}),
    "claude tool_use_id": ("claude-code", _claude_result_id_a_list, {"orphan_results": 1}),
    "codex type": ("codex", _set(3, "type", value=["x"]), {"unknown_records": 1}),
    "codex first type": ("codex", _set(0, "type", value=["x"]), {"unknown_records": 1}),
    "pi type": ("pi", _set(3, "type", value=["x"]), {"unknown_records": 1}),
    # The assistant message of line 6 makes three calls; a number for its content makes none.
    "pi content": ("pi", _set(5, "message", "content", value=42), {"tool_calls": 388}),
    # An id that is not a string names no entry: the entry naming it as parent is a root.
    "pi ids": ("pi", _pi_ids_not_strings, {"branches": 1}),
    # Message 2 makes three of the eleven calls.
    "gemini type": (
        "gemini-cli",
        _set(1, "type", value=["gemini"]),
        {"unknown_records": 1, "tool_calls": 8},
    ),
    "gemini toolCalls": ("gemini-cli", _set(1, "toolCalls", value=3), {"tool_calls": 8}),
    "gemini functionResponse": (
        "gemini-cli",
        _gemini_no_function_response,
        {"tool_calls": 11, "tool_results": 11},
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG_SHAPES))
def test_a_value_of_an_unexpected_shape_is_kept_and_counted(
    store: SessionStore, tmp_path: Path, case: str
) -> None:
    """Valid JSON of a shape the format does not have (a list for a type or an id, a number for
    a list) is read as unknown, the way the importer reads any unknown record: its record kept,
    and the counts say what it became; never a TypeError."""
    fmt, change, expected = WRONG_SHAPES[case]
    sample = SHAPE_SAMPLES[fmt]
    path = tmp_path / sample.name
    if sample.suffix == ".jsonl":
        records = [json.loads(line) for line in sample.read_text().splitlines() if line]
        line = change(records) + 1
        lines = [json.dumps(record) for record in records]
        path.write_text("".join(f"{text}\n" for text in lines))
    else:
        document = json.loads(sample.read_text())
        line = change(document["messages"]) + 1
        path.write_text(json.dumps(document))
    result = replay.import_agent_log(store, path)
    (found,) = result.files
    assert (found.format, found.detected) == (fmt, True)
    counts = found.sessions[0].counts
    assert {name: counts.get(name, 0) for name in expected} == expected
    kept = {}
    for session in found.sessions:
        kept.update(replay.agent_log_records(store, session.session_id))
    if sample.suffix == ".jsonl":
        assert kept[line] == lines[line - 1]  # the record of the unexpected shape, as it is
    else:
        assert line in kept


def test_a_shape_a_reader_missed_is_an_error_at_its_line_with_nothing_written(
    store: SessionStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The net under the readers' own checks: a TypeError (or AttributeError, KeyError,
    ValueError) a format's reader raises on a record is the `AgentLogError` of that record's
    file and line, in the library and at the command line (not an internal error)."""
    from replay.agentlogs import _codex
    from sessionlog.cli import main

    def missed(output: object) -> tuple[object, object]:
        raise TypeError("unhashable type: 'list'")

    monkeypatch.setattr(_codex, "_output", missed)
    records = SAMPLES["codex"].read_text().splitlines()
    line = next(n for n, text in enumerate(records, 1) if '"type":"function_call_output"' in text)
    folder = tmp_path / "logs"
    folder.mkdir()
    path = folder / SAMPLES["codex"].name
    path.write_text("\n".join(records) + "\n")
    head = store.log.head
    with pytest.raises(AgentLogError, match="unexpected shape: TypeError") as caught:
        replay.import_agent_log(store, folder)
    assert (caught.value.path, caught.value.line) == (str(path), line)
    assert isinstance(caught.value.__cause__, TypeError)
    assert store.log.head == head
    code = main(["--store", str(tmp_path / "cli"), "import-agent-log", str(folder)])
    assert code == 5 and f"{path}:{line}: unexpected shape" in capsys.readouterr().err
