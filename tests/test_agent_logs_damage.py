"""Damaged and shuffled agent logs: every import either matches an independent count of what the
damaged file still holds, keeping every record, or raises `AgentLogError` with nothing written.
Never another exception.

The damage: the file cut at any byte, bits flipped anywhere, lines dropped, lines swapped. Each
format's samples are cut to a few dozen lines first, to keep an example fast.
"""

from __future__ import annotations

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
        lines = path.read_bytes().split(b"\n")
        skipped = {line for line, _ in found.skipped_lines}
        assert not covered & skipped
        assert covered | skipped == {n for n, line in enumerate(lines, 1) if line.strip()}
    if found.skipped_lines:
        return  # what a skipped line held is not in the session, so the counts differ
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
    assert len(found.sessions) - 1 == expected["sidechains"]


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
    with SessionStore.open(tmp_path / "store") as store:

        @settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
        @given(data=damaged(original))
        def run(data: bytes) -> None:
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
