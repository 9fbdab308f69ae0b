"""A file holding one unterminated line that no writing on can make JSON is damaged, not a log
whose first line is being written: it is read and its damage reported, never
left "not begun" forever."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.agentlogs import AgentLogError
from sessions import SessionStore
from tests._agent_log_counts import FIXTURES
from tests.test_agent_logs_growth import CODEX, lines_of, one

GEMINI = FIXTURES / "gemini-cli" / "gemini-cli-pomodoro-timer.json"


@pytest.mark.parametrize(
    "damage",
    [b"}}", b",,", b" x"],
    ids=["trailing-brace", "double-comma", "bad-character"],
)
def test_an_unterminated_first_line_that_cannot_become_json_is_damage(
    store: SessionStore, tmp_path: Path, damage: bytes
) -> None:
    """Under `auto`, a file of one unterminated line that is damaged (no writing on can make it
    JSON) is not a log being begun: it is read, and its damage reported at line 1, as before
    4d7c17a. (Under a named line format its reader leaves an unterminated last line pending.)"""
    first = lines_of(CODEX)[0].rstrip(b"\r\n")
    live = tmp_path / CODEX.name
    live.write_bytes(first + damage)  # a whole record, then what no JSON may continue
    with pytest.raises(AgentLogError, match=":1"):
        one(store, live)
    assert store.log.head == 0


@pytest.mark.parametrize("named", [False, True], ids=["auto", "named"])
def test_a_one_line_document_damaged_at_its_end_is_damage(
    store: SessionStore, tmp_path: Path, named: bool
) -> None:
    """A JSON document written on one line with no line break (as `json.dump` writes it), then
    damaged: an agent writing it could never make it whole, so it is not one "being written"."""
    document = json.loads(GEMINI.read_bytes())
    live = tmp_path / GEMINI.name
    live.write_bytes(json.dumps(document).encode() + b"}")
    with pytest.raises(AgentLogError):
        one(store, live, format="gemini-cli" if named else "auto")
    assert store.log.head == 0
