"""Claude Code subagents written to files of their own (`agent-<id>.jsonl`, only sidechain
records naming the parent's session): imported with their session's file, as its children, each
linked to the `Task` call that spawned it, in the same transaction.

The files are made from a real session whose two subagent conversations are inline (lines 16-22
and 26-40): moved to files of their own the way newer Claude Code versions write them, each record
given the agent's id, and the spawning call's result naming it."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3

import replay
from replay.agentlogs import AgentLogError
from sessions import SessionStore
from tests._agent_log_counts import COUNTERS, FIXTURES

SOURCE = FIXTURES / "claude-code" / "sample-project" / "5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"
SESSION = SOURCE.stem
AGENTS = {"b0a1": (range(16, 23), "toolu_014YF9TXhDRR7BnpasNJ7gjC", 23)}
AGENTS["c2d3"] = (range(26, 41), "toolu_01LKfUwrsnof18CpWZQcJH44", 41)


def split_session(folder: Path, *, nested: bool, name_agents: bool) -> dict[str, Path]:
    """The sample as a session file and one file per subagent: under `<session>/subagents/`
    (`nested`) or beside it; the spawning calls' results name their agents when `name_agents`
    (else only the prompt links them). Returns {agent id: its file}."""
    lines = SOURCE.read_text().splitlines()
    records = {n: json.loads(line) for n, line in enumerate(lines, start=1)}
    moved: set[int] = set()
    files = {}
    where = folder / SESSION / "subagents" if nested else folder
    where.mkdir(parents=True, exist_ok=True)
    for agent, (numbers, _, result) in AGENTS.items():
        own = [{**records[n], "agentId": agent} for n in numbers]
        files[agent] = where / f"agent-{agent}.jsonl"
        files[agent].write_text("".join(json.dumps(r) + "\n" for r in own))
        moved.update(numbers)
        if name_agents:
            records[result]["toolUseResult"]["agentId"] = agent
    kept = [json.dumps(records[n]) for n in sorted(records) if n not in moved]
    (folder / f"{SESSION}.jsonl").write_text("".join(line + "\n" for line in kept))
    return files


def partly_written(tmp_path: Path) -> tuple[Path, dict[str, Path], Path, Path]:
    """The sample split into files under `tmp_path/whole` (`split_session`, nested, agents
    named) and copied to `tmp_path/live`, where subagent b0a1's file holds its first three lines
    only: the whole folder, its files, and the live session file and b0a1 file."""
    whole, live = tmp_path / "whole", tmp_path / "live"
    files = split_session(whole, nested=True, name_agents=True)
    shutil.copytree(whole, live)
    main, agent = live / f"{SESSION}.jsonl", live / files["b0a1"].relative_to(whole)
    agent.write_bytes(b"".join(files["b0a1"].read_bytes().splitlines(keepends=True)[:3]))
    return whole, files, main, agent


def snapshots(store: SessionStore, found: replay.AgentLogImport) -> list[dict[str, Any]]:
    (one,) = found.files
    taken = [store.snapshot(s.session_id) for s in one.sessions]
    assert all(s is not None for s in taken)
    return [s for s in taken if s is not None]


@pytest.mark.parametrize("nested", [True, False], ids=["session-folder", "beside"])
@pytest.mark.parametrize("name_agents", [True, False], ids=["named", "by-prompt"])
def test_subagent_files_become_children_spawned_by_their_task_call(
    store: SessionStore, tmp_path: Path, nested: bool, name_agents: bool
) -> None:
    files = split_session(tmp_path, nested=nested, name_agents=name_agents)
    result = replay.import_agent_log(store, tmp_path / f"{SESSION}.jsonl")
    parent, *children = snapshots(store, result)
    assert len(children) == 2
    assert parent["metadata"]["agent_log"]["children"] == [c["session_id"] for c in children]
    assert parent["metadata"]["agent_log"]["counts"]["subagent_files"] == 2
    assert set(result.files[0].subagent_files) == {str(f) for f in files.values()}
    for child in children:
        about = child["metadata"]["agent_log"]
        agent = about["subagent_of"]["agent_id"]
        assert about["file"] == files[agent].name
        assert about["blake3"] == blake3(files[agent].read_bytes()).hexdigest()
        ref = child["parent_spawn_ref"]
        assert ref["session_id"] == parent["session_id"] and ref["kind"] == "subagent"
        assert ref["tool_call_id"] == AGENTS[agent][1]
        kept = replay.agent_log_records(store, child["session_id"])
        assert "".join(kept[n] + "\n" for n in sorted(kept)) == files[agent].read_text()


def test_the_split_session_counts_as_the_inline_one(store: SessionStore, tmp_path: Path) -> None:
    split_session(tmp_path, nested=True, name_agents=True)
    expected = COUNTERS["claude-code"](SOURCE)
    taken = snapshots(store, replay.import_agent_log(store, tmp_path / f"{SESSION}.jsonl"))
    messages = [m for s in taken for m in s["transcript"]]
    assert dict(Counter(m["role"] for m in messages if not m.get("summary"))) == expected["roles"]
    assert sum(len(m.get("tool_calls") or []) for m in messages) == expected["tool_calls"]
    assert len(taken) - 1 == expected["sidechains"]


@pytest.mark.parametrize("recursive", [False, True])
def test_a_folder_import_reads_each_subagent_file_once_with_its_session(
    store: SessionStore, tmp_path: Path, recursive: bool
) -> None:
    """Subagent files in the session's folder (read with `recursive` too) and beside it (which
    sort before the session's file by name) are each read once, with their session."""
    split_session(tmp_path / "nested", nested=True, name_agents=True)
    split_session(tmp_path / "beside", nested=False, name_agents=True)
    later = tmp_path / "beside" / "f0e1d2c3-b4a5-4697-8899-aabbccddeeff.jsonl"
    (tmp_path / "beside" / f"{SESSION}.jsonl").rename(later)  # a name after `agent-...`
    for folder in ("nested", "beside"):
        result = replay.import_agent_log(store, tmp_path / folder, recursive=recursive)
        assert [len(f.sessions) for f in result.files] == [3]
        assert not result.not_agent_logs
        assert result.files[0].written == (folder == "nested")  # the same session twice
    again = replay.import_agent_log(store, tmp_path, recursive=True)
    assert [len(f.sessions) for f in again.files] == [3, 3]
    assert not any(f.written for f in again.files)


def test_a_damaged_subagent_file_stops_the_whole_session(
    store: SessionStore, tmp_path: Path
) -> None:
    files = split_session(tmp_path, nested=True, name_agents=True)
    lines = files["c2d3"].read_text().splitlines()
    lines[3] = lines[3][:40]
    files["c2d3"].write_text("\n".join(lines) + "\n")
    with pytest.raises(AgentLogError) as caught:
        replay.import_agent_log(store, tmp_path / f"{SESSION}.jsonl")
    assert caught.value.path == str(files["c2d3"]) and caught.value.line == 4
    assert store.log.head == 0
    skipped = replay.import_agent_log(store, tmp_path / f"{SESSION}.jsonl", skip_bad_lines=True)
    *_, child = snapshots(store, skipped)
    assert child["metadata"]["agent_log"]["skipped_lines"][0][0] == 4


def test_a_subagent_file_of_another_session_is_left_alone(
    store: SessionStore, tmp_path: Path
) -> None:
    files = split_session(tmp_path, nested=False, name_agents=True)
    other = [json.loads(line) for line in files["b0a1"].read_text().splitlines()]
    for record in other:
        record["sessionId"] = "another-session"
    files["b0a1"].write_text("".join(json.dumps(r) + "\n" for r in other))
    result = replay.import_agent_log(store, tmp_path)
    assert [len(f.sessions) for f in result.files] == [2, 1]
    assert result.files[1].path == str(files["b0a1"])
