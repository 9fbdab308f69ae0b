"""How an imported agent log is stored: messages reach the engine as typed structs, so what the
engine would refuse in a dict (an integer past 64 bits, nesting past `value_depth_max`, a role
that is not text) is refused at the file's line, with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
