"""pi session files are trees (`id`/`parentId`, since pi's version 2): the branch pi resumes (the
root to the file's last entry) is the session, and every other branch a fork of the branch it
leaves, at the entry it leaves at, so nothing in the file is lost.

Trees are made the way pi makes them: the real sample is given ids and parents as pi's own
migration to version 2 does (each entry the child of the one before), then pi's `branch` moves
the leaf back to an earlier entry and new entries are appended as its children. The expected
transcripts come from walking `parentId` links here, apart from the importer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replay
from replay.agentlogs import AgentLogError
from sessions import SessionStore
from tests._agent_log_counts import FIXTURES

PI = FIXTURES / "pi" / "large-session.jsonl"
ROLES = {"toolResult": "tool"}


def migrated(count: int) -> list[dict[str, Any]]:
    """The sample's header and first `count` entries as version 2: ids, each entry's parent the
    entry before."""
    header, *entries = [json.loads(line) for line in PI.read_text().splitlines()[: count + 1]]
    header["version"] = 2
    previous = None
    for number, entry in enumerate(entries, start=1):
        entry["id"], entry["parentId"] = f"{number:08x}", previous
        previous = entry["id"]
    return [header, *entries]


def entry(number: int, parent: str | None, message: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"b{number:07x}",
        "parentId": parent,
        "timestamp": "2025-11-21T00:00:00.000Z",
        "message": message,
    }


def write(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    path = tmp_path / "tree.jsonl"
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
    return path


def path_to(records: list[dict[str, Any]], leaf: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries from the root to `leaf`, by `parentId`."""
    by_id = {r["id"]: r for r in records[1:]}
    path = [leaf]
    while path[-1]["parentId"] is not None:
        path.append(by_id[path[-1]["parentId"]])
    return path[::-1]


def roles(entries: list[dict[str, Any]]) -> list[str]:
    found = [e["message"]["role"] for e in entries if e["type"] == "message"]
    return [ROLES.get(role, role) for role in found]


def imported(store: SessionStore, path: Path) -> list[dict[str, Any]]:
    (found,) = replay.import_agent_log(store, path).files
    taken = [store.snapshot(s.session_id) for s in found.sessions]
    assert all(s is not None for s in taken)
    return [s for s in taken if s is not None]


def own_lines(snapshot: dict[str, Any]) -> set[int]:
    """The lines a session's own messages (after the prefix it shares) were made from."""
    start = snapshot["branched_at_event_index"] or 0
    lines = set()
    for message in snapshot["transcript"][start:]:
        source = message["metadata"]["source"]
        lines.update(source["lines"])
        lines.update(
            a["line"] for a in (*source.get("attached", ()), *source.get("attached_after", ()))
        )
    lines.update(a["line"] for a in snapshot["metadata"]["agent_log"].get("attached_records", ()))
    return lines


# Line 19 of the sample is an assistant turn calling a tool (answered on line 20).
CALL_LINE, CALL_ID = 19, "toolu_01WjKyzcrjn5icY2U5apUgDP"


def retried_tool_call(back_to_old_leaf: bool) -> list[dict[str, Any]]:
    """The sample's first 40 entries; then the user went back to the tool call of entry 18
    (line 19), the tool answered again and the model replied: a second branch; optionally the
    user then went back to the old leaf and wrote on."""
    records = migrated(40)
    at = records[CALL_LINE - 1]["id"]
    result = {"role": "toolResult", "toolCallId": CALL_ID, "toolName": "read"}
    result["content"] = [{"type": "text", "text": "the file, read again"}]
    retry = entry(1, at, {**result, "isError": False})
    reply = {"role": "assistant", "content": [{"type": "text", "text": "Read it again."}]}
    records += [retry, entry(2, retry["id"], reply)]
    if back_to_old_leaf:
        more = {"role": "user", "content": [{"type": "text", "text": "go on"}]}
        records.append(entry(3, records[40]["id"], more))
    return records


@pytest.mark.parametrize("back_to_old_leaf", [False, True], ids=["new-leaf", "old-leaf"])
def test_the_last_entry_chooses_the_session_and_the_other_branch_is_a_fork(
    store: SessionStore, tmp_path: Path, back_to_old_leaf: bool
) -> None:
    records = retried_tool_call(back_to_old_leaf)
    main, fork = imported(store, write(tmp_path, records))
    assert [m["role"] for m in main["transcript"]] == roles(path_to(records, records[-1]))
    other = records[40] if not back_to_old_leaf else records[42]
    assert [m["role"] for m in fork["transcript"]] == roles(path_to(records, other))
    assert fork["parent_id"] == main["session_id"]
    assert fork["branched_at_event_index"] == len(roles(records[1:CALL_LINE]))
    assert fork["metadata"]["agent_log"]["branch"]["from_line"] == CALL_LINE
    assert main["metadata"]["agent_log"]["counts"]["branches"] == 1
    assert main["metadata"]["agent_log"]["children"] == [fork["session_id"]]
    for session in (main, fork):  # the call made before the branch is answered in both
        messages = session["transcript"]
        assert not any(m["metadata"].get("orphan_result") for m in messages)
        answers = [m for m in messages if m.get("tool_call_id") == CALL_ID]
        assert len(answers) == 1
    lines = [own_lines(main), own_lines(fork)]
    assert not lines[0] & lines[1]
    assert lines[0] | lines[1] == set(range(1, len(records) + 1))


def test_a_new_root_is_a_fork_keeping_nothing(store: SessionStore, tmp_path: Path) -> None:
    records = migrated(12)
    fresh = {"role": "user", "content": [{"type": "text", "text": "start over"}]}
    records.insert(6, entry(1, None, fresh))  # pi's resetLeaf, then a message: a second root
    main, fork = imported(store, write(tmp_path, records))
    assert fork["branched_at_event_index"] == 0 and fork["length"] == 1
    assert fork["transcript"][0]["content"] == "start over"
    assert [m["role"] for m in main["transcript"]] == roles(path_to(records, records[-1]))


def test_a_linear_file_of_version_2_is_one_session(store: SessionStore, tmp_path: Path) -> None:
    records = migrated(60)
    (session,) = imported(store, write(tmp_path, records))
    assert [m["role"] for m in session["transcript"]] == roles(records[1:])
    assert session["metadata"]["agent_log"]["counts"]["branches"] == 0


def test_a_damaged_line_in_a_tree_stops_the_import(store: SessionStore, tmp_path: Path) -> None:
    path = write(tmp_path, retried_tool_call(True))
    lines = path.read_text().splitlines()
    lines[30] = lines[30][:25]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(AgentLogError) as caught:
        replay.import_agent_log(store, path)
    assert caught.value.line == 31 and store.log.head == 0
    kept = replay.import_agent_log(store, path, skip_bad_lines=True).files[0]
    assert [line for line, _ in kept.skipped_lines] == [31]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data(), count=st.integers(1, 14))
def test_any_tree_imports_as_its_branches(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, count: int
) -> None:
    """Whatever parent each entry names (an earlier entry, or none: a new root), each session
    holds exactly the path from a root to one leaf, the main one ending at the last entry, and
    every entry is one session's own."""
    header = {"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/w"}
    records: list[dict[str, Any]] = [header]
    for number in range(1, count + 1):
        parent = data.draw(st.sampled_from([None, *(r["id"] for r in records[1:])]))
        role = "user" if number % 2 else "assistant"
        text = {"role": role, "content": [{"type": "text", "text": f"m{number}"}]}
        records.append(entry(number, parent, text))
    folder = tmp_path_factory.mktemp("tree")
    with SessionStore.open(folder / "store") as store:
        sessions = imported(store, write(folder, records))
        parents = {r["parentId"] for r in records[1:]}
        leaves = [r for r in records[1:] if r["id"] not in parents]
        assert len(sessions) == len(leaves)
        by_line = {n: r for n, r in enumerate(records, start=1)}
        forks = sessions[1:]
        ends = [records[-1]] + [
            by_line[f["metadata"]["agent_log"]["branch"]["leaf_line"]] for f in forks
        ]
        assert sorted(e["id"] for e in ends) == sorted(e["id"] for e in leaves)
        for session, end in zip(sessions, ends, strict=True):
            expected = [e["message"]["content"][0]["text"] for e in path_to(records, end)]
            assert [m["content"] for m in session["transcript"]] == expected
        owned = [own_lines(s) for s in sessions]
        assert sum(map(len, owned)) == len(records)
        assert set().union(*owned) == set(range(1, len(records) + 1))


def _appended(data: bytes) -> bytes:
    return data.replace(b"Read it again.", b"Read it AGAIN.") + data.splitlines(keepends=True)[-1]


CHANGES = {
    "appended": _appended,  # (the second reading stops where the first did) and rewritten
    "shortened": lambda data: b"".join(data.splitlines(keepends=True)[:20]),
    "same size": lambda data: data.replace(b"Read it again.", b"Read it AGAIN."),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_tree_that_changes_between_its_readings_is_refused(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A tree is read twice (its branches are known only at its end); a file pi rewrites or
    appends to in between would be built from branches that no longer fit it. The import is
    refused, naming the file, and writes nothing."""
    from replay.agentlogs import _branches  # where a reading finds the tree

    path = write(tmp_path, retried_tool_call(False))
    found = _branches.branches

    def changing(entries: list[Any]) -> Any:
        tree = found(entries)
        path.write_bytes(CHANGES[change](path.read_bytes()))  # after the first reading
        return tree

    monkeypatch.setattr(_branches, "branches", changing)
    with pytest.raises(AgentLogError, match="changed while being read") as caught:
        replay.import_agent_log(store, path)
    assert (caught.value.path, caught.value.line) == (str(path), None)
    assert store.log.head == 0


def test_a_tree_appended_to_between_its_readings_is_read_as_it_was_first_read(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live log grows while it is read: the second reading of a tree stops where the first
    did, and the lines appended in between are read by the next import."""
    from replay.agentlogs import _branches  # where a reading finds the tree

    records = retried_tool_call(False)
    path = write(tmp_path, records)
    first = path.read_bytes()
    found = _branches.branches
    reply = {"role": "user", "content": [{"type": "text", "text": "And now?"}]}
    more = json.dumps(entry(99, records[-1]["id"], reply), separators=(",", ":"))

    def growing(entries: list[Any]) -> Any:
        tree = found(entries)
        path.write_bytes(first + more.encode() + b"\n")  # after the first reading
        return tree

    monkeypatch.setattr(_branches, "branches", growing)
    (done,) = replay.import_agent_log(store, path).files
    assert done.blake3 == blake3(first).hexdigest() and not done.updated
    monkeypatch.setattr(_branches, "branches", found)
    (grown,) = replay.import_agent_log(store, path).files
    assert grown.updated and grown.blake3 == blake3(path.read_bytes()).hexdigest()
    assert grown.sessions[0].appended == 1
