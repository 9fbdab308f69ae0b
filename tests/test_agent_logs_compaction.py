"""An agent's compaction of its context, read from its log: after the import, `store.context()`
is what the agent itself sent after compacting (its summary, then the messages it kept and the
newer ones), while `snapshot()` still holds every message and every record of the file. The logs
are the real samples with compaction records added in the shapes the agents write (Claude Code:
a `compact_boundary` system record, then the user record flagged `isCompactSummary`; pi: a
`compaction` entry naming `firstKeptEntryId`), since no sample holds one; what pi sends is worked
out here apart from the importer, as pi's `buildSessionContext` does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import replay
from sessions import SessionStore
from tests._agent_log_counts import COUNTERS, FIXTURES
from tests.test_agent_logs_growth import fresh, one, state
from tests.test_agent_logs_pi_tree import entry, migrated, write

CLAUDE = FIXTURES / "claude-code" / "-Users-chip-dev-ai-music"
CLAUDE_LOG = CLAUDE / "ba79134d-b6e9-4867-af0c-6941038c9e4b.jsonl"
SUMMARY = "The user set up the project; the agent wrote CLAUDE.md and the program."
_COMPARED = ("dangling_tool_calls", "orphan_result", "is_error")


def first_line(message: dict[str, Any]) -> int:
    return int(message["metadata"]["source"]["lines"][0])


def plain(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The messages that are not a checkpoint's, as what the model is sent and what pairs them."""
    return [
        (
            m["role"],
            m.get("content"),
            m.get("tool_calls"),
            m.get("tool_call_id"),
            *(m["metadata"].get(key) for key in _COMPARED),
        )
        for m in messages
        if not m.get("summary")
    ]


def sid_of(store: SessionStore, path: Path) -> str:
    return one(store, path).sessions[0].session_id


# pi


def compaction(number: int, parent: str, first_kept: str) -> dict[str, Any]:
    return {
        "type": "compaction",
        "id": f"c{number:07x}",
        "parentId": parent,
        "timestamp": "2025-11-21T00:00:00.000Z",
        "summary": f"{SUMMARY} ({number})",
        "firstKeptEntryId": first_kept,
        "tokensBefore": 50000,
    }


def compacted(count: int, after: list[int], kept: list[int]) -> list[dict[str, Any]]:
    """The sample's first `count` entries (version 2), with a compaction after each entry of
    `after` keeping from the entry of `kept` on, each next entry's parent the compaction."""
    records = migrated(count)
    for number, (at, first) in enumerate(zip(after, kept, strict=True), start=1):
        index = next(i for i, r in enumerate(records) if r.get("id") == f"{at:08x}")
        made = compaction(number, records[index]["id"], f"{first:08x}")
        records.insert(index + 1, made)
        records[index + 2]["parentId"] = made["id"]
    return records


def pi_context_lines(records: list[dict[str, Any]]) -> list[int]:
    """The lines of the entries whose messages pi sends after its latest compaction (on one
    line of entries): the compaction's summary first, then the messages from its first kept
    entry up to it, then those after it."""
    path = list(enumerate(records, start=1))[1:]
    at = max(i for i, (_, r) in enumerate(path) if r["type"] == "compaction")
    first = path[at][1]["firstKeptEntryId"]
    start = next((i for i, (_, r) in enumerate(path[:at]) if r["id"] == first), at)
    return [line for line, r in path[start:at] + path[at + 1 :] if r["type"] == "message"]


@pytest.mark.parametrize(
    ("after", "kept"),
    [([40], [25]), ([40], [33]), ([30, 50], [17, 34]), ([40], [41])],
    ids=["kept-before-a-failed-turn", "kept-after-it", "twice", "kept-none"],
)
def test_a_pi_compaction_starts_the_context_where_pi_did(
    store: SessionStore, tmp_path: Path, after: list[int], kept: list[int]
) -> None:
    records = compacted(60, after, kept)
    sid = sid_of(store, write(tmp_path, records))
    context = store.context(sid)
    snapshot = store.snapshot(sid)
    assert snapshot is not None
    assert [m["role"] for m in context[:2]] == ["user", "assistant"]
    assert all(m["summary"] and m["synthetic"] for m in context[:2])
    assert (
        context[1]["content"]
        == records[next(i for i, r in enumerate(records) if r.get("id") == f"c{len(after):07x}")][
            "summary"
        ]
    )
    assert [first_line(m) for m in context[2:]] == pi_context_lines(records)
    # Nothing is dropped: the transcript holds every message of the log without a compaction,
    # each as it was (a call never answered still flagged on its own message), and every line.
    plain_path = tmp_path / "plain"
    plain_path.mkdir()
    with SessionStore.open(tmp_path / "plain-store") as other:
        whole = other.snapshot(sid_of(other, write(plain_path, migrated(60))))
        assert whole is not None
        assert plain(snapshot["transcript"]) == plain(whole["transcript"])
    assert len(snapshot["transcript"]) == len(whole["transcript"]) + 2 * len(after)
    kept = replay.agent_log_records(store, sid)
    lines = (tmp_path / "tree.jsonl").read_text().splitlines()
    assert kept == dict(enumerate(lines, start=1))
    assert snapshot["metadata"]["agent_log"]["counts"]["compactions"] == len(after)


def test_a_version_1_pi_compaction_names_its_first_kept_entry_by_index(
    store: SessionStore, tmp_path: Path
) -> None:
    """Before ids, pi named the first kept entry by its index among the file's entries (the
    header is entry 0): the same context follows."""
    lines = (FIXTURES / "pi" / "large-session.jsonl").read_text().splitlines()[:61]
    made = {"type": "compaction", "timestamp": "2025-11-21T00:00:00.000Z", "summary": SUMMARY}
    made |= {"firstKeptEntryIndex": 25, "tokensBefore": 50000}
    lines[41:41] = [json.dumps(made)]
    path = tmp_path / "v1.jsonl"
    path.write_text("\n".join(lines) + "\n")
    context = store.context(sid_of(store, path))
    assert context[1]["content"] == SUMMARY
    expected = [n for n, text in enumerate(lines, 1) if json.loads(text)["type"] == "message"]
    assert [first_line(m) for m in context[2:]] == [n for n in expected if n >= 26]


def test_a_pi_compaction_in_a_log_that_grew_rewinds_to_where_the_context_starts(
    store: SessionStore, tmp_path: Path
) -> None:
    """The log is read while pi writes its compaction (the entry half written, left for the
    next import), then once it is complete and pi went on: the session is brought up to date,
    the kept messages moving after the summary, and equals a fresh import of the file."""
    records = compacted(60, [40], [25])
    path = write(tmp_path, records)
    lines = path.read_bytes().splitlines(keepends=True)
    whole = path.read_bytes()
    path.write_bytes(b"".join(lines[:41]) + lines[41][:40])  # the compaction, half written
    first = one(store, path)
    assert first.pending_tail_bytes == 40
    sid = first.sessions[0].session_id
    assert store.context(sid) == store.snapshot(sid)["transcript"]  # type: ignore[index]
    before = store.length(sid)
    path.write_bytes(whole)
    grown = one(store, path)
    (session,) = grown.sessions
    assert grown.updated and grown.pending_tail_bytes == 0
    kept = len(pi_context_lines(records[:42]))  # the messages kept, moved after the summary
    assert session.replaced == kept and session.appended == kept + 2 + (len(records) - 42)
    assert store.length(sid) == before + 2 + (len(records) - 42)
    assert state(store) == fresh(tmp_path, path)
    assert [first_line(m) for m in store.context(sid)[2:]] == pi_context_lines(records)


def test_a_pi_compaction_keeping_messages_before_a_fork_point_stays_out_of_the_fork(
    store: SessionStore, tmp_path: Path
) -> None:
    """A branch left the session between the first kept entry and the compaction: the prefix
    the fork shares cannot hold the summary (the fork never compacted), so the summary goes
    right after the point the fork leaves at (the messages kept before it stay out of the
    context: a limit), and the fork's context is its whole path."""
    records = migrated(41)  # a compaction after entry 40 keeping from entry 20; entry 41 after
    retry = {"role": "user", "content": [{"type": "text", "text": "try another way"}]}
    made = compaction(1, records[40]["id"], records[20]["id"])
    records[41]["parentId"] = made["id"]
    records[41:41] = [entry(1, records[30]["id"], retry), made]  # a branch from entry 30
    main, fork = replay.import_agent_log(store, write(tmp_path, records)).files[0].sessions
    assert fork.parent_id == main.session_id
    fork_context = store.context(fork.session_id)
    assert not any(m.get("summary") for m in fork_context)
    shared = sum(r["type"] == "message" for r in records[1:31])  # entries 1 to 30
    assert len(fork_context) == store.length(fork.session_id) == shared + 1
    context = store.context(main.session_id)
    assert context[1]["content"] == made["summary"]
    assert [first_line(m) for m in context[2:]] == [*range(32, 42), 44]  # entry 31 on


# Claude Code


def claude_compacted(at: int) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """The sample's lines with a compaction before its record `at` (a prompt): the boundary,
    then the summary (the prompt now follows the summary, as Claude Code links it)."""
    lines = CLAUDE_LOG.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    before, prompt = records[at - 1], records[at]
    common = {key: prompt[key] for key in ("isSidechain", "userType", "cwd", "sessionId")}
    common["version"] = prompt["version"]
    boundary = {
        "parentUuid": None,
        "logicalParentUuid": before["uuid"],
        **common,
        "type": "system",
        "subtype": "compact_boundary",
        "content": "Conversation compacted",
        "isMeta": False,
        "timestamp": "2025-06-20T10:00:00.000Z",
        "uuid": "0c0e1b2d-0000-4000-8000-00000000b0d1",
        "level": "info",
        "compactMetadata": {"trigger": "manual", "preTokens": 41234},
    }
    text = "This session is being continued from a previous conversation that ran out of "
    text += f"context. The conversation is summarized below:\n{SUMMARY}"
    summary = {
        "parentUuid": boundary["uuid"],
        **common,
        "type": "user",
        "message": {"role": "user", "content": text},
        "isVisibleInTranscriptOnly": True,
        "isCompactSummary": True,
        "uuid": "0c0e1b2d-0000-4000-8000-00000000c0d2",
        "timestamp": "2025-06-20T10:00:01.000Z",
    }
    prompt["parentUuid"] = summary["uuid"]
    out = [*lines[:at], json.dumps(boundary), json.dumps(summary), json.dumps(prompt)]
    return [*out, *lines[at + 1 :]], boundary, summary


def test_a_claude_compaction_starts_the_context_at_its_summary(
    store: SessionStore, tmp_path: Path
) -> None:
    lines, _, summary = claude_compacted(54)
    path = tmp_path / CLAUDE_LOG.name
    path.write_text("\n".join(lines) + "\n")
    found = one(store, path)
    (session,) = found.sessions
    assert session.counts["compactions"] == 1 == COUNTERS["claude-code"](path)["compactions"]
    assert session.counts.get("branches", 0) == 0  # the prompt after it follows the summary
    context = store.context(session.session_id)
    snapshot = store.snapshot(session.session_id)
    assert snapshot is not None
    assert [(m["role"], m["summary"]) for m in context[:2]] == [
        ("user", True),
        ("assistant", True),
    ]
    assert context[1]["content"] == summary["message"]["content"]
    assert [first_line(m) for m in context[:2]] == [55, 56]
    assert context[2:] == [m for m in snapshot["transcript"] if first_line(m) > 56]
    with SessionStore.open(tmp_path / "plain") as other:  # the file without the compaction
        whole = other.snapshot(sid_of(other, CLAUDE_LOG))
        assert whole is not None
        assert plain(snapshot["transcript"]) == plain(whole["transcript"])
    assert replay.agent_log_records(store, session.session_id) == dict(enumerate(lines, 1))
    body = replay.export_messages(store, session.session_id, "anthropic-messages", context=True)
    assert SUMMARY in json.dumps(body["messages"][:2]) and "init" not in json.dumps(body)


def test_a_claude_compaction_read_while_being_written_equals_a_fresh_import(
    store: SessionStore, tmp_path: Path
) -> None:
    """Read after the boundary, while the summary is being written (left for next time): no
    checkpoint yet, the context is the whole transcript; once the summary and the next prompt
    are written, the session gains them and equals a fresh import of the file."""
    lines, _, _ = claude_compacted(54)
    path = tmp_path / CLAUDE_LOG.name
    data = [(line + "\n").encode() for line in lines]
    path.write_bytes(b"".join(data[:55]) + data[55][:100])
    first = one(store, path)
    sid = first.sessions[0].session_id
    assert first.pending_tail_bytes == 100
    transcript = store.snapshot(sid)["transcript"]  # type: ignore[index]
    assert transcript[-1]["summary"] and transcript[-1]["role"] == "user"  # the boundary
    assert store.context(sid) == transcript
    path.write_bytes(b"".join(data))
    grown = one(store, path)
    assert grown.updated and grown.sessions[0].replaced == 0  # the summary follows its boundary
    assert state(store) == fresh(tmp_path, path)
    assert [first_line(m) for m in store.context(sid)[:2]] == [55, 56]


def test_a_claude_compact_summary_without_a_boundary_is_a_checkpoint_of_its_own(
    store: SessionStore, tmp_path: Path
) -> None:
    lines, _, summary = claude_compacted(54)
    del lines[54]  # no boundary record
    path = tmp_path / CLAUDE_LOG.name
    path.write_text("\n".join(lines) + "\n")
    sid = sid_of(store, path)
    context = store.context(sid)
    assert [first_line(m) for m in context[:2]] == [55, 55]
    assert context[1]["content"] == summary["message"]["content"]
    assert replay.agent_log_records(store, sid) == dict(enumerate(lines, 1))
