"""A line-format log imported while its agent was still writing it, then again once it grew by
appended lines: the earlier session is brought up to date and then equals, in every message and
every kept record, a fresh import of the whole file into another store; a file rewritten rather
than appended to is refused with nothing written; stores of ids made from the whole file's digest
keep working. Document formats, rewritten whole by their tools, keep one session per version."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3

import replay
from replay.agentlogs import AgentLogConflictError, AgentLogError, ImportedFile
from sessions import SessionStore
from tests._agent_log_counts import FIXTURES, SAMPLES
from tests.test_agent_logs_pi_tree import migrated, retried_tool_call

LINE_SAMPLES = [(fmt, path) for fmt, path in SAMPLES if path.suffix == ".jsonl"]
IDS = [path.name[:24] for _, path in LINE_SAMPLES]
CODEX = FIXTURES / "codex" / "codex-pomodor-timer.jsonl"
_VOLATILE = ("created_at", "last_activity_at", "version")


def lines_of(path: Path) -> list[bytes]:
    """The file's lines, each with its line break."""
    return path.read_bytes().splitlines(keepends=True)


def one(store: SessionStore, path: Path, **options: Any) -> ImportedFile:
    (found,) = replay.import_agent_log(store, path, **options).files
    return found


def state(store: SessionStore) -> dict[str, Any]:
    """Every session of `store` as a fresh import would make it (times and stream versions
    left out), with the records it keeps for audit."""
    found: dict[str, Any] = {}
    for item in store.list_sessions(limit=200)["sessions"]:
        sid = item["session_id"]
        snapshot = store.snapshot(sid)
        assert snapshot is not None
        for key in _VOLATILE:
            snapshot.pop(key)
        found[sid] = (snapshot, replay.agent_log_records(store, sid))
    return found


def fresh(tmp_path: Path, path: Path, **options: Any) -> dict[str, Any]:
    with SessionStore.open(tmp_path / f"fresh-{blake3(path.read_bytes()).hexdigest()}") as other:
        one(other, path, **options)
        return state(other)


@pytest.mark.parametrize(("fmt", "path"), LINE_SAMPLES, ids=IDS)
def test_a_grown_log_brings_its_earlier_session_up_to_date(
    store: SessionStore, tmp_path: Path, fmt: str, path: Path
) -> None:
    lines = lines_of(path)
    live = tmp_path / path.name
    for cut in sorted({max(1, len(lines) // 3), max(1, len(lines) // 2), len(lines)}):
        live.write_bytes(b"".join(lines[:cut]))
        before = {s: store.length(s) for s in state(store)}
        found = one(store, live)
        assert found.format == fmt
        assert state(store) == fresh(tmp_path, live)  # messages, metadata, kept records
        for session in found.sessions:  # what it says it added is what the session gained
            sid = session.session_id
            gained = store.length(sid) - before.get(sid, 0)
            assert session.appended - session.replaced == gained
            assert session.written  # made, or brought up to date (its metadata at least)
        assert found.updated == bool(before) and (found.updated or found.written)
    head = store.log.head
    again = one(store, live)
    assert store.log.head == head and not again.written and not again.updated
    assert sum(s.appended for s in again.sessions) == 0


@pytest.mark.parametrize(
    ("fmt", "path", "step"),
    [
        ("codex", CODEX, 1),
        ("claude-code", next(p for f, p in LINE_SAMPLES if p.name.startswith("5c0375b4")), 1),
        ("pi", FIXTURES / "pi" / "large-session.jsonl", 97),
    ],
    ids=["codex", "claude-sidechains", "pi"],
)
def test_growing_a_line_at_a_time_equals_a_fresh_import_each_time(
    store: SessionStore, tmp_path: Path, fmt: str, path: Path, step: int
) -> None:
    lines = lines_of(path)
    live = tmp_path / path.name
    ids: set[str] = set()
    for cut in range(1 + step, len(lines) + 1, step):
        live.write_bytes(b"".join(lines[:cut]))
        found = one(store, live)
        ids.add(found.sessions[0].session_id)
        assert state(store) == fresh(tmp_path, live), f"after {cut} lines"
    assert len(ids) == 1  # one session throughout: the first line names it


@pytest.mark.parametrize("back_to_old_leaf", [False, True], ids=["new-leaf", "old-leaf"])
def test_a_pi_log_that_grows_a_branch_keeps_equal_to_a_fresh_import(
    store: SessionStore, tmp_path: Path, back_to_old_leaf: bool
) -> None:
    live = tmp_path / "tree.jsonl"
    write = lambda records: live.write_text(  # noqa: E731
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    )
    write(migrated(40))
    (linear,) = one(store, live).sessions
    write(retried_tool_call(back_to_old_leaf))
    found = one(store, live)
    assert found.updated and len(found.sessions) == 2
    assert found.sessions[0].session_id == linear.session_id
    assert state(store) == fresh(tmp_path, live)


def test_a_claude_log_whose_prompt_is_resent_keeps_equal_to_a_fresh_import(
    store: SessionStore, tmp_path: Path
) -> None:
    path = FIXTURES / "claude-code" / "-Users-chip-dev-ai-music"
    path = path / "fed8ce56-bc79-401f-a83e-af084253362f.jsonl"
    lines = lines_of(path)
    records = [json.loads(line) for line in lines]
    sent = next(n for n, r in enumerate(records) if r.get("type") == "user" and n > 3)
    edit = {**records[sent], "uuid": "e0000000-edit"}
    edit["message"] = {"role": "user", "content": "do something else instead"}
    live = tmp_path / path.name
    live.write_bytes(b"".join(lines))
    (before, *_) = one(store, live).sessions
    live.write_bytes(b"".join(lines) + json.dumps(edit).encode() + b"\n")
    found = one(store, live)
    main, fork = found.sessions
    assert main.session_id == before.session_id and fork.parent_id == main.session_id
    assert main.replaced > 0  # the old path is a fork now: the main session was rewound
    assert state(store) == fresh(tmp_path, live)


def test_a_rewritten_log_is_refused_and_nothing_is_written(
    store: SessionStore, tmp_path: Path
) -> None:
    lines = lines_of(CODEX)
    live = tmp_path / CODEX.name
    live.write_bytes(b"".join(lines[:60]))
    (session,) = one(store, live).sessions
    head = store.log.head
    edited = lines[1].replace(b'"type"', b'"type" ', 1)  # the same record, other bytes
    assert edited != lines[1]
    for text in (
        b"".join([lines[0], edited, *lines[2:]]),  # an earlier line changed, and grown
        b"".join(lines[:40]),  # cut shorter
    ):
        live.write_bytes(text)
        with pytest.raises(AgentLogConflictError, match="rewritten") as caught:
            one(store, live)
        assert str(live) in str(caught.value)
        assert store.log.head == head
    assert store.length(session.session_id) == session.messages


def test_a_log_sharing_its_first_line_with_another_gets_its_own_session(
    store: SessionStore, tmp_path: Path
) -> None:
    lines = lines_of(CODEX)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_bytes(b"".join(lines[:60]))
    second.write_bytes(b"".join([*lines[:30], *lines[70:]]))  # a copy that went its own way
    (a,) = one(store, first).sessions
    (b,) = one(store, second).sessions
    assert b.session_id == a.session_id + "-2" and b.written
    first.write_bytes(b"".join(lines))  # grows: still found, past the other file's session
    grown = one(store, first)
    assert grown.updated and grown.sessions[0].session_id == a.session_id
    assert store.length(b.session_id) == b.messages
    head = store.log.head
    assert not one(store, second).written and store.log.head == head
    assert state(store)[a.session_id] == fresh(tmp_path, first)[a.session_id]


def test_too_many_logs_sharing_a_first_line_are_refused(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replay import _limits

    monkeypatch.setattr(_limits, "agent_log_first_line_slots_max", 2)
    lines = lines_of(CODEX)
    for index in range(2):
        other = tmp_path / f"{index}.jsonl"
        other.write_bytes(b"".join([lines[0], lines[10 + index]]))
        one(store, other)
    head = store.log.head
    third = tmp_path / "third.jsonl"
    third.write_bytes(b"".join([lines[0], lines[20]]))
    with pytest.raises(AgentLogConflictError, match="2 other logs share the first line"):
        one(store, third)
    assert store.log.head == head
    assert one(store, third, session_id="third").written


def test_a_store_of_whole_file_ids_keeps_working(store: SessionStore, tmp_path: Path) -> None:
    lines = lines_of(CODEX)
    live = tmp_path / CODEX.name
    live.write_bytes(b"".join(lines[:60]))
    old_id = f"codex-{blake3(live.read_bytes()).hexdigest()[:32]}"
    one(store, live, session_id=old_id)  # as every import made it before first-line ids
    head = store.log.head
    again = one(store, live)  # unchanged: found under its old id, nothing written
    assert again.sessions[0].session_id == old_id and not again.written
    assert store.log.head == head
    live.write_bytes(b"".join(lines))  # grown: its old id cannot be found; a new session
    grown = one(store, live)
    assert grown.written and not grown.updated
    assert grown.sessions[0].session_id != old_id
    assert store.length(old_id) == again.sessions[0].messages


def test_a_one_line_log_has_the_same_id_either_way(store: SessionStore, tmp_path: Path) -> None:
    live = tmp_path / CODEX.name
    lines = lines_of(CODEX)
    live.write_bytes(lines[0])
    digest = blake3(lines[0]).hexdigest()[:32]
    assert one(store, live).sessions[0].session_id == f"codex-{digest}"
    live.write_bytes(b"".join(lines[:20]))
    assert one(store, live).updated


def test_a_log_whose_first_line_is_not_complete_is_left_for_the_next_import(
    store: SessionStore, tmp_path: Path
) -> None:
    live = tmp_path / CODEX.name
    lines = lines_of(CODEX)
    live.write_bytes(lines[0].rstrip(b"\n"))  # the record is whole, its line break not yet
    found = one(store, live)
    assert found.sessions == () and found.records == 0 and not found.written
    assert found.pending_tail_bytes == len(lines[0]) - 1
    assert store.log.head == 0
    live.write_bytes(b"".join(lines[:20]))
    (session,) = one(store, live).sessions
    assert session.session_id == f"codex-{blake3(lines[0]).hexdigest()[:32]}"


@pytest.mark.parametrize(
    ("fmt", "path"),
    [(f, p) for f, p in LINE_SAMPLES if len(lines_of(p)) > 2],
    ids=[i for i, (_, p) in zip(IDS, LINE_SAMPLES, strict=True) if len(lines_of(p)) > 2],
)
@pytest.mark.parametrize("tail", ["cut", "whole"])
def test_a_last_line_being_written_is_left_for_the_next_import(
    store: SessionStore, tmp_path: Path, fmt: str, path: Path, tail: str
) -> None:
    """A live log's last line without its line break (cut in the middle, or a whole record
    whose line break is not written yet) is neither an error nor imported: the complete lines
    are, the file's digest and bytes kept are theirs, and once the rest is appended the import
    brings the session up to date, equal to a fresh import of the whole file."""
    lines = lines_of(path)
    at = len(lines) // 2
    last = lines[at][: len(lines[at]) // 2] if tail == "cut" else lines[at].rstrip(b"\r\n")
    live = tmp_path / path.name
    live.write_bytes(b"".join(lines[:at]) + last)
    found = one(store, live)  # no skip_bad_lines: not damage
    assert found.pending_tail_bytes == len(last) and not found.skipped_lines
    complete = tmp_path / "complete" / path.name
    complete.parent.mkdir()
    complete.write_bytes(b"".join(lines[:at]))
    assert found.blake3 == blake3(complete.read_bytes()).hexdigest()
    assert state(store) == fresh(tmp_path, complete)  # as if the file ended at its last break
    head = store.log.head
    assert not one(store, live).written and store.log.head == head  # still being written
    live.write_bytes(b"".join(lines[: at + 1]))  # the line is complete
    grown = one(store, live)
    assert grown.updated and grown.pending_tail_bytes == 0
    assert state(store) == fresh(tmp_path, live)
    about = store.snapshot(grown.sessions[0].session_id)["metadata"]["agent_log"]  # type: ignore[index]
    assert about["bytes"] == live.stat().st_size


def test_a_damaged_line_before_the_last_is_still_an_error(
    store: SessionStore, tmp_path: Path
) -> None:
    lines = lines_of(CODEX)
    live = tmp_path / CODEX.name
    cut = lines[60][: len(lines[60]) // 2]
    live.write_bytes(b"".join(lines[:60]) + cut + b"\n" + b"".join(lines[61:80]))
    with pytest.raises(AgentLogError, match=":61: "):
        one(store, live)
    assert store.log.head == 0
    skipped = one(store, live, skip_bad_lines=True)
    assert [line for line, _ in skipped.skipped_lines] == [61]
    assert skipped.pending_tail_bytes == 0


def test_a_session_continued_after_its_import_is_not_changed(
    store: SessionStore, tmp_path: Path
) -> None:
    lines = lines_of(CODEX)
    live = tmp_path / CODEX.name
    live.write_bytes(b"".join(lines[:60]))
    (session,) = one(store, live).sessions
    store.inject(session.session_id, {"role": "user", "content": "and now, in the engine"})
    head = store.log.head
    live.write_bytes(b"".join(lines))
    with pytest.raises(AgentLogConflictError, match="continued after its import"):
        one(store, live)
    assert store.log.head == head


def test_a_named_session_grows_too(store: SessionStore, tmp_path: Path) -> None:
    lines = lines_of(CODEX)
    live = tmp_path / CODEX.name
    live.write_bytes(b"".join(lines[:60]))
    one(store, live, session_id="mine")
    live.write_bytes(b"".join(lines))
    grown = one(store, live, session_id="mine")
    assert grown.updated and grown.sessions[0].appended > 0
    assert store.length("mine") == grown.sessions[0].messages


def test_a_document_log_rewritten_is_a_session_of_its_own(
    store: SessionStore, tmp_path: Path
) -> None:
    source = FIXTURES / "gemini-cli" / "gemini-cli-pomodoro-timer.json"
    live = tmp_path / source.name
    document = json.loads(source.read_bytes())
    messages = document["messages"]
    live.write_text(json.dumps({**document, "messages": messages[: len(messages) // 2]}))
    (first,) = one(store, live).sessions
    shutil.copy(source, live)
    grown = one(store, live)
    assert grown.written and not grown.updated
    assert grown.sessions[0].session_id != first.session_id
    assert store.length(first.session_id) == first.messages


def test_cli_says_a_log_grew_and_refuses_a_rewritten_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sessionlog.cli import main

    store, lines = str(tmp_path / "s"), lines_of(CODEX)
    live = tmp_path / CODEX.name
    live.write_bytes(b"".join(lines[:60]))
    assert main(["--store", store, "import-agent-log", str(live)]) == 0
    capsys.readouterr()
    live.write_bytes(b"".join(lines))
    assert main(["--store", store, "import-agent-log", str(live)]) == 0
    assert "grew: +" in capsys.readouterr().out
    live.write_bytes(b"".join([*lines, lines[-1]]))
    assert main(["--store", store, "import-agent-log", str(live), "--json"]) == 0
    (found,) = json.loads(capsys.readouterr().out)["files"]
    assert found["updated"] is True and found["sessions"][0]["appended"] >= 1
    live.write_bytes(b"".join(lines[:30]))
    assert main(["--store", store, "import-agent-log", str(live)]) != 0
    assert "rewritten" in capsys.readouterr().err


def test_subagent_files_grow_with_their_session(store: SessionStore, tmp_path: Path) -> None:
    from tests.test_agent_logs_subagents import SESSION, split_session

    whole = tmp_path / "whole"
    files = split_session(whole, nested=True, name_agents=True)
    live = tmp_path / "live"
    shutil.copytree(whole, live)
    main = live / f"{SESSION}.jsonl"
    lines, agent = lines_of(main), live / files["b0a1"].relative_to(whole)
    main.write_bytes(b"".join(lines[: len(lines) // 2]))
    agent.write_bytes(b"".join(lines_of(files["b0a1"])[:3]))
    (agent.parent / files["c2d3"].name).unlink()  # not written yet
    early = one(store, main)
    shutil.rmtree(live)
    shutil.copytree(whole, live)
    grown = one(store, main)
    assert grown.updated and len(grown.sessions) == len(early.sessions) + 1
    assert state(store) == fresh(tmp_path, main)
    head = store.log.head
    assert not one(store, main).written and store.log.head == head
    text = agent.read_bytes()  # rewritten, while its session grew
    agent.write_bytes(text.replace(b'"agentId": "b0a1"', b'"agentId":  "b0a1"', 1))
    main.write_bytes(main.read_bytes() + lines[-1])
    with pytest.raises(AgentLogConflictError, match="rewritten"):
        one(store, main)
    assert store.log.head == head


def test_a_subagent_file_that_grew_is_imported_though_its_session_file_did_not(
    store: SessionStore, tmp_path: Path
) -> None:
    from tests.test_agent_logs_subagents import partly_written

    whole, files, main, agent = partly_written(tmp_path)
    (agent.parent / files["c2d3"].name).unlink()  # not written yet
    one(store, main)
    live = main.parent
    shutil.rmtree(live)
    shutil.copytree(whole, live)  # the session's own file is unchanged
    grown = one(store, main)
    assert grown.updated and all(store.exists(s.session_id) for s in grown.sessions)
    assert state(store) == fresh(tmp_path, main)


def test_an_import_of_less_of_a_log_than_one_that_came_first_writes_nothing(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replay.agentlogs import _verb

    lines, live = lines_of(CODEX), tmp_path / CODEX.name
    live.write_bytes(b"".join(lines[: len(lines) // 2]))
    commit, raced = _verb._commit, []

    def racing(*args: Any, **kwargs: Any) -> Any:  # read half; a later reading commits first
        if not raced:
            raced.append(True)
            live.write_bytes(b"".join(lines))
            one(store, live)
        return commit(*args, **kwargs)

    monkeypatch.setattr(_verb, "_commit", racing)
    late = one(store, live)  # not refused as a rewritten file
    assert not late.written and not late.updated
    assert state(store) == fresh(tmp_path, live)
